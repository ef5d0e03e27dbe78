"""Measuring a model on any text. A GPT: loss per token, perplexity, bits per
character and bits per byte. A Seq2Seq, on files of source<TAB>target lines:
exact match and loss per target token.

Loss per token depends on the tokenizer: a char model's is per character, a
BPE model's per token of several characters. Bits per character (and per
UTF-8 byte), the summed loss in bits over the characters (bytes) it
predicted, do not: they compare char and BPE models, and gptlite with other
tools, on the same text.

The text is read in pieces and scored in windows of the model's context that
overlap by half: the first window scores all its tokens, each later one only
its second half, so every token after the first window is predicted from at
least half a window of context (a "stride" of half the context). A model
whose tokenizer has an end token reads it before the text, as a document
start, so that the first token is predicted too; otherwise the first token
is context only, and its characters and bytes are not counted.

A Seq2Seq's loss is that of each target token (its end token among them)
given the source and the target's tokens before it; exact match is the
share of sources whose target it decodes greedily, exactly.

A chat model (one with a chat template) reads conversations files (JSON
Lines, `gptlite.data.conversations`): its loss is over the answers' tokens, as
training counts it, their end-of-turn markers among them, and bits per
character over the answers' characters; exact answers is the share of
conversations whose last answer it writes greedily, exactly (spaces around
it aside), given the messages before it.
"""

import dataclasses
import math
import time

import keras
import numpy as np

from gptlite.data import conversations, lm, pairs
from gptlite.decode import chat, generation
from gptlite.decode.settings import SamplingConfig
from gptlite.errors import InputError
from gptlite.text.tokenizers import known_text

# Logits held at once at most (batch x context x vocabulary), about 512 MB of float32.
MAX_LOGITS = 2**27


@dataclasses.dataclass
class Score:
    """What a model scored on one text (or on several, added up)."""

    name: str
    tokens: int  # tokens predicted
    characters: int  # the characters they make up
    bytes: int  # and their UTF-8 bytes
    nats: float  # the summed loss, in nats
    seconds: float

    # What `Evaluation.table` shows: the first column's heading, then (heading, attribute, width, format) each.
    NAMED = "text"
    COLUMNS = (("loss", "loss", 7, ".4f"), ("ppl", "perplexity", 9, ".3f"),
               ("bits/char", "bits_per_character", 9, ".4f"), ("bits/byte", "bits_per_byte", 9, ".4f"),
               ("tokens", "tokens", 11, ","), ("bytes", "bytes", 11, ","), ("seconds", "seconds", 8, ".1f"))

    @property
    def loss(self):
        """Mean loss per predicted token, in nats."""
        return self.nats / self.tokens

    @property
    def perplexity(self):
        return math.exp(self.loss)

    @property
    def bits_per_character(self):
        return self.nats / math.log(2) / self.characters

    @property
    def bits_per_byte(self):
        return self.nats / math.log(2) / self.bytes

    def as_dict(self):
        return dict(name=self.name, loss=self.loss, perplexity=self.perplexity,
                    bits_per_character=self.bits_per_character, bits_per_byte=self.bits_per_byte,
                    tokens=self.tokens, characters=self.characters, bytes=self.bytes,
                    seconds=round(self.seconds, 3))


@dataclasses.dataclass
class PairScore:
    """What a Seq2Seq scored on one file of pairs (or on several, added up)."""

    name: str
    pairs: int
    exact: int  # pairs whose target it decoded exactly
    tokens: int  # target tokens predicted, end tokens among them
    characters: int  # the targets' characters
    nats: float  # the summed loss over those tokens, in nats
    seconds: float

    NAMED = "pairs file"
    COLUMNS = (("exact", "exact_match", 7, ".1%"), *Score.COLUMNS[:3], ("pairs", "pairs", 9, ","),
               ("tokens", "tokens", 11, ","), ("seconds", "seconds", 8, ".1f"))

    @property
    def exact_match(self):
        return self.exact / self.pairs

    loss = Score.loss
    perplexity = Score.perplexity
    bits_per_character = Score.bits_per_character

    def as_dict(self):
        return dict(name=self.name, exact_match=self.exact_match, loss=self.loss, perplexity=self.perplexity,
                    bits_per_character=self.bits_per_character, pairs=self.pairs, exact=self.exact,
                    tokens=self.tokens, characters=self.characters, seconds=round(self.seconds, 3))


@dataclasses.dataclass
class ChatScore:
    """What a chat model scored on one conversations file (or on several, added up)."""

    name: str
    conversations: int
    exact: int  # conversations whose last answer it wrote exactly
    tokens: int  # answers' tokens predicted, end-of-turn markers among them
    characters: int  # the answers' characters
    bytes: int  # and their UTF-8 bytes
    nats: float
    seconds: float

    NAMED = "conversations"
    COLUMNS = (("exact", "exact_answers", 7, ".1%"), *Score.COLUMNS[:3], ("chats", "conversations", 9, ","),
               ("tokens", "tokens", 11, ","), ("seconds", "seconds", 8, ".1f"))

    @property
    def exact_answers(self):
        return self.exact / self.conversations

    loss = Score.loss
    perplexity = Score.perplexity
    bits_per_character = Score.bits_per_character
    bits_per_byte = Score.bits_per_byte

    def as_dict(self):
        return dict(name=self.name, exact_answers=self.exact_answers, loss=self.loss, perplexity=self.perplexity,
                    bits_per_character=self.bits_per_character, bits_per_byte=self.bits_per_byte,
                    conversations=self.conversations, exact=self.exact, tokens=self.tokens,
                    characters=self.characters, bytes=self.bytes, seconds=round(self.seconds, 3))


@dataclasses.dataclass
class Evaluation:
    """`evaluate`'s result: a `Score` (a Seq2Seq: a `PairScore`) for each source, and their total."""

    sources: list
    total: Score

    def table(self):
        """The scores as lines of a table: a heading, a row for each source, and the total where there are
        several."""
        kind = type(self.total)
        lines = [" ".join([f"{kind.NAMED:<30}", *(f"{heading:>{width}}" for heading, _, width, _ in kind.COLUMNS)])]
        for score in self.sources + ([self.total] if len(self.sources) > 1 else []):
            lines.append(" ".join([f"{score.name[-30:]:<30}", *(f"{getattr(score, name):>{width}{form}}"
                                                                 for _, name, width, form in kind.COLUMNS)]))
        return lines


def evaluate_text(model, sources, encoding="utf-8", errors="strict", unknown="error", verbose=0):
    """A GPT's `Evaluation` on text files (or folders of them), each scored on its own (`gptlite.evaluate`)."""
    corpora = [lm.Corpus.from_files([source], encoding, errors) for source in sources]  # every file checked first
    scorer = _Scorer(model)
    progress = keras.utils.Progbar(sum(corpus.size for corpus in corpora), unit_name="byte",
                                   verbose=1 if verbose else 0)
    scores = []
    for source, corpus in zip(sources, corpora):
        started = time.perf_counter()
        tokens, characters, size, nats = scorer.score(
            (known_text(model.tokenizer, piece, unknown, "text") for piece in corpus.pieces()), progress)
        if tokens == 0:
            raise InputError(f"{source} has too little text to score: it needs at least two tokens")
        scores.append(Score(str(source), tokens, characters, size, nats, time.perf_counter() - started))
    return Evaluation(scores, _added_up(Score, scores))


class _Scorer:
    """Windows of a model's context over a stream of text pieces, scored in batches."""

    def __init__(self, model):
        self.model = model
        self.window = model.config.block_size
        self.stride = self.window - self.window // 2  # each later window scores this many tokens
        self.batch_size = max(1, min(32, MAX_LOGITS // (self.window * model.config.vocab_size)))
        self.tokenizer = model.tokenizer

    def score(self, pieces, progress):
        """(tokens predicted, their characters, their bytes, summed loss) over the text of `pieces`."""
        # A text starts after the beginning token where the tokenizer has one (Llama's), else after an end of text.
        start_token = ([*self.tokenizer.text_start_ids, self.tokenizer.end_token_id])[0]
        buffer = np.asarray([] if start_token is None else [start_token], np.int64)
        first = start_token is None  # the first token is context only: its text is not counted
        scored_from = 1  # the buffer position of the first token not yet scored
        characters = size = 0
        batch, totals = [], [0, 0.0]
        for piece in pieces:
            if not piece:
                continue
            ids = np.asarray(self.tokenizer.encode(piece), np.int64)
            characters += len(piece)
            size += len(piece.encode("utf-8"))
            if first and len(ids):
                head = self.tokenizer.decode(ids[:1])
                characters -= len(head)
                size -= len(head.encode("utf-8"))
                first = False
            buffer = np.concatenate([buffer, ids])
            # Whole windows: inputs buffer[0:T], targets buffer[1:T+1], scoring targets from `scored_from`.
            while len(buffer) >= self.window + 1:
                batch.append((buffer[:self.window + 1], scored_from))
                buffer, scored_from = buffer[self.stride:], self.window + 1 - self.stride
                if len(batch) == self.batch_size:
                    self._run(batch, totals)
                    batch = []
            progress.add(len(piece.encode("utf-8")))
        if scored_from < len(buffer):  # the end: one last window over the tokens left, scoring the new ones
            batch.append((buffer, scored_from))
        if batch:
            self._run(batch, totals)
        return totals[0], characters, size, totals[1]

    def _run(self, batch, totals):
        """Add the batch's scored tokens and summed loss to `totals` ([tokens, nats])."""
        # Every batch has one shape, (batch_size, window), right-padded: Keras's compiled predict
        # step is then built once. Attention is causal, so the padding changes no scored logit.
        inputs = np.zeros((self.batch_size, self.window), np.int32)
        targets = np.zeros((self.batch_size, self.window), np.int32)
        scored = np.zeros((self.batch_size, self.window), bool)
        for row, (ids, scored_from) in enumerate(batch):
            inputs[row, :len(ids) - 1], targets[row, :len(ids) - 1] = ids[:-1], ids[1:]
            scored[row, scored_from - 1:len(ids) - 1] = True
        tokens, nats = _summed_loss(targets, self.model.predict_on_batch(inputs), scored)
        totals[0] += tokens
        totals[1] += nats


def _summed_loss(targets, logits, scored):
    """(how many tokens `scored` marks, their summed cross-entropy in nats, added up in float64)."""
    losses = keras.ops.convert_to_numpy(keras.ops.sparse_categorical_crossentropy(targets, logits, from_logits=True))
    return int(scored.sum()), float(losses[scored].astype(np.float64).sum())


def _added_up(kind, scores):
    """A `kind` of score named "total": each of its counts summed over `scores`."""
    counts = [field.name for field in dataclasses.fields(kind) if field.name != "name"]
    return kind("total", *(sum(getattr(score, count) for score in scores) for count in counts))


def evaluate_conversations(model, named_sets, verbose=0, batch_size=32):
    """Score a chat model on conversations: [(name, [messages, ...]), ...] -> an `Evaluation` of `ChatScore`s."""
    tokenizer, block_size = model.tokenizer, model.config.block_size
    progress = keras.utils.Progbar(sum(len(chats) for _, chats in named_sets), unit_name="conversation",
                                   verbose=1 if verbose else 0)
    scores = []
    for name, chats in named_sets:
        started = time.perf_counter()
        rows = conversations.pack(tokenizer, chats, block_size)
        inputs, targets = conversations.targets(rows)
        tokens, nats, characters, size = 0, 0.0, 0, 0
        for start in range(0, len(targets), batch_size):
            count = len(targets[start:start + batch_size])
            # A whole batch each time, its rows repeated: one compiled shape.
            batch_inputs = {name: np.resize(part[start:start + batch_size], (batch_size, part.shape[1]))
                            for name, part in inputs.items()}
            batch_targets = np.resize(targets[start:start + batch_size], (batch_size, targets.shape[1]))[:count]
            logits = model.predict_on_batch(batch_inputs)[:count]
            scored = batch_targets != conversations.IGNORED
            batch_tokens, batch_nats = _summed_loss(np.maximum(batch_targets, 0), logits, scored)
            tokens += batch_tokens
            nats += batch_nats
            for row, mask in zip(batch_targets, scored):
                answer = tokenizer.decode(row[mask])
                counted = tokenizer.character_count(row[mask])
                characters += counted
                size += len(answer.encode("utf-8")) - (len(answer) - counted)  # markers count no bytes either
        exact = 0
        for start in range(0, len(chats), batch_size):
            asked = [_last_question(messages) for messages in chats[start:start + batch_size]]
            configs = [SamplingConfig(max_new_tokens=len(tokenizer.encode(answer)) + 4, temperature=0.0)
                       for _, answer in asked]
            got = chat.answers(model, [messages for messages, _ in asked], configs)
            exact += sum(text.strip() == answer.strip() for text, (_, answer) in zip(got, asked))
            progress.add(len(asked))
        scores.append(ChatScore(name, len(chats), exact, tokens, characters, size, nats,
                                time.perf_counter() - started))
    return Evaluation(scores, _added_up(ChatScore, scores))


def _last_question(messages):
    """(the messages before a conversation's last answer, that answer)."""
    last = max(index for index, message in enumerate(messages) if message["role"] == "assistant")
    if not last:
        raise InputError("a conversation whose only answer comes first has no question to answer")
    return messages[:last], messages[last]["content"]


def evaluate_pairs(model, sources, encoding="utf-8", errors="strict", unknown="error", verbose=0):
    """A Seq2Seq's `Evaluation` on files of source<TAB>target lines, each scored on its own."""
    tokenizer, block_size = model.tokenizer, model.config.block_size
    pair_sets = []
    for source in sources:  # every file read and checked first
        read = pairs.read_pairs(source, encoding, errors, at_least=1)
        known = pairs.Pairs([known_text(tokenizer, text, unknown, "source") for text in read.sources],
                            [known_text(tokenizer, text, unknown, "target") for text in read.targets], read.lines)
        try:
            pair_sets.append(pairs.encode(known, tokenizer, block_size, too_long="longer than this model reads"))
        except InputError as error:
            raise InputError(f"{source}, {error}") from None
    progress = keras.utils.Progbar(2 * sum(len(pair_set) for pair_set in pair_sets), unit_name="pair",
                                   verbose=1 if verbose else 0)
    scores = []
    for source, pair_set in zip(sources, pair_sets):
        started = time.perf_counter()
        tokens, nats = _target_loss(model, pair_set, progress)
        exact = exact_matches(model, pair_set.pairs, progress)
        characters = sum(len(target) for target in pair_set.pairs.targets)
        scores.append(PairScore(str(source), len(pair_set), exact, tokens, characters, nats,
                                time.perf_counter() - started))
    return Evaluation(scores, _added_up(PairScore, scores))


def exact_matches(model, held_out, progress=None):
    """How many of `held_out`'s pairs (`pairs.Pairs`) have a target that a Seq2Seq decodes exactly, greedily."""
    exact = 0
    for got, want in zip(generation.iter_targets(model, held_out.sources, temperature=0.0), held_out.targets):
        exact += got == want
        if progress is not None:
            progress.add(1)
    return exact


def _target_loss(model, pair_set, progress, batch_size=64):
    """(target tokens predicted, summed loss) over a `PairSet`, teacher-forced, in batches of one shape."""
    tokens, nats = 0, 0.0
    pad = model.tokenizer.pad_token_id
    for start in range(0, len(pair_set), batch_size):
        rows = slice(start, start + batch_size)
        count = len(pair_set.source_ids[rows])
        # Padded to a whole batch by repeating its rows; the repeats' losses are not counted.
        source_ids = np.resize(pair_set.source_ids[rows], (batch_size, pair_set.source_ids.shape[1]))
        target_ids = np.resize(pair_set.target_ids[rows], (batch_size, pair_set.target_ids.shape[1]))
        logits = model.predict_on_batch({"source_ids": source_ids, "target_ids": target_ids[:, :-1]})
        targets = target_ids[:, 1:]
        scored = (targets != pad) & (np.arange(batch_size) < count)[:, None]
        batch_tokens, batch_nats = _summed_loss(targets, logits, scored)
        tokens += batch_tokens
        nats += batch_nats
        progress.add(count)
    return tokens, nats
