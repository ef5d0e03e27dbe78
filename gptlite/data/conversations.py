"""Conversations as training data: read, rendered through a chat template, with the loss on the answers alone.

    conversations = read_conversations("chats.jsonl")   # [[{"role": ..., "content": ...}, ...], ...]
    model = gptlite.chat_ready(model)                   # the default template and its tokens, if it has none
    rows = pack(model.tokenizer, conversations, model.config.block_size)

A conversations file is JSON Lines, one conversation a line, in OpenAI's
shape: {"messages": [{"role": "system"|"user"|"assistant", "content": "..."}]}.
Each conversation is rendered with the model's chat template and encoded;
the tokens of the assistant's answers (their end-of-turn marker included)
are the ones trained, everything else is context. Conversations are packed
whole into rows of block_size + 1 tokens, longest first, each into the row
it fills most closely (`packing`), the rest of a row padded; one
longer than that is cut to its first block_size + 1 tokens or refused, as
`long_conversations` says. Each token's position in its own conversation
goes with the rows: the model reads each conversation of a row as if it
were alone (`GPT.call`), as it reads one when it answers.
"""

import collections
import dataclasses
import json
import pathlib
import re

import numpy as np

from gptlite.data.lm import DrawnBatches
from gptlite.data.packing import pack_lengths
from gptlite.errors import ConfigError, InputError, MissingFileError
from gptlite.data import LONG_CONVERSATIONS
from gptlite.text import templates

IGNORED = -1  # the target of a token that is not trained: the loss leaves it out


def read_conversations(path, encoding="utf-8"):
    """The conversations of a JSON Lines file, each a list of checked messages; an InputError names the
    file and line of the first malformed one."""
    path = pathlib.Path(path)
    if not path.is_file():
        raise MissingFileError(f"no such conversations file: {path}")
    conversations = []
    with open(path, encoding=encoding) as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            where = f"{path}, line {number}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise InputError(f"{where}: not JSON ({error.msg})") from None
            if not isinstance(record, dict) or "messages" not in record:
                raise InputError(f'{where}: expected an object with "messages"')
            messages = templates.check_messages(record["messages"], where)
            if not any(message["role"] == "assistant" for message in messages):
                raise InputError(f"{where}: the conversation has no assistant message to learn from")
            conversations.append(messages)
    if not conversations:
        raise InputError(f"{path} holds no conversations")
    return conversations


def encode(tokenizer, messages):
    """A conversation's token ids (N,) and which of them are trained (N,), the assistant's."""
    segments = _segments(tokenizer, messages)
    ids, trained = [], []
    start = templates.start_ids(tokenizer, segments[0][0] if segments else "")
    if start:
        ids.append(np.asarray(start, np.int64))
        trained.append(np.zeros(len(start), bool))
    for text, is_answer in segments:
        if text:
            part = np.asarray(tokenizer.encode(text), np.int64)
            ids.append(part)
            trained.append(np.full(len(part), is_answer))
    return np.concatenate(ids), np.concatenate(trained)


def _segments(tokenizer, messages):
    """The rendered conversation cut into (text, is an answer) pieces, in order.

    Each answer is what rendering the conversation up to it adds to the
    rendering up to the message before with the answer's opening: its text
    and its end-of-turn marker. A template whose rendering of a longer
    conversation changes that of a shorter one cannot be cut so, and is refused.
    """
    messages = templates.check_messages(messages)
    whole = templates.render_for(tokenizer, messages)
    segments, done = [], 0
    for index, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        opened = templates.render_for(tokenizer, messages[:index], add_generation_prompt=True) if index else \
            _opening_alone(tokenizer)
        answered = templates.render_for(tokenizer, messages[:index + 1])
        if not (answered.startswith(opened) and whole.startswith(answered) and len(opened) >= done):
            raise InputError("the chat template renders a conversation differently from its beginning, so its "
                             "answers cannot be told from the rest")
        segments += [(whole[done:len(opened)], False), (whole[len(opened):len(answered)], True)]
        done = len(answered)
    segments.append((whole[done:], False))
    return segments


def _opening_alone(tokenizer):
    # An answer with nothing before it: the template's opening of an empty conversation, if it renders one.
    try:
        return templates.render(templates.template_of(tokenizer), [], True, **templates.special_tokens_of(tokenizer))
    except InputError:
        return ""


@dataclasses.dataclass
class ChatRows:
    """Packed conversations: ids (N, block_size + 1), whether each is trained, and its position in its own
    conversation (the padding after the last counts as one more), each (N, block_size + 1)."""

    ids: np.ndarray
    trained: np.ndarray
    positions: np.ndarray
    conversations: int  # how many conversations the rows hold
    cut: int  # how many of them were cut to fit

    def __len__(self):
        return len(self.ids)

    def subset(self, rows):
        return ChatRows(self.ids[rows], self.trained[rows], self.positions[rows], self.conversations, self.cut)


def pack(tokenizer, conversations, block_size, long_conversations="cut"):
    """Encode conversations and pack them whole into `ChatRows` of block_size + 1 tokens, nearly full (see
    `packing`: longest first, each into the row it fills most closely).

    A conversation longer than a row is cut to its first block_size + 1
    tokens (`long_conversations="cut"`) or refused ("refuse"), with how many.
    """
    if long_conversations not in LONG_CONVERSATIONS:
        raise ConfigError(f"long_conversations must be 'cut' or 'refuse', got {long_conversations!r}")
    width = block_size + 1
    encoded = [encode(tokenizer, messages) for messages in conversations]
    too_long = [number for number, (ids, _) in enumerate(encoded, 1) if len(ids) > width]
    if too_long and long_conversations == "refuse":
        raise InputError(f"{len(too_long)} of {len(encoded)} conversations are longer than the context of "
                         f"{block_size} tokens (the first is number {too_long[0]}); raise `block_size`, or set "
                         f"`long_conversations` to 'cut'")
    encoded = [(ids[:width], trained[:width]) for ids, trained in encoded]
    rows = [[encoded[index] for index in row] for row in pack_lengths([len(ids) for ids, _ in encoded], width)]
    packed_ids = np.zeros((len(rows), width), np.int32)
    packed_trained = np.zeros((len(rows), width), bool)
    packed_positions = np.zeros((len(rows), width), np.int32)
    for index, parts in enumerate(rows):
        ids = np.concatenate([part[0] for part in parts])
        packed_ids[index, :len(ids)] = ids
        packed_trained[index, :len(ids)] = np.concatenate([part[1] for part in parts])
        lengths = [len(part[0]) for part in parts] + [width - len(ids)]
        packed_positions[index] = np.concatenate([np.arange(length) for length in lengths])
    return ChatRows(packed_ids, packed_trained, packed_positions, len(encoded), len(too_long))


def split(rows, validation_fraction=0.1, seed=0):
    """Train and validation rows: a `validation_fraction` of them, one at least, drawn at random."""
    if len(rows) < 2:
        raise InputError(f"the conversations fill {len(rows)} row of the context; at least 2 are needed, one to "
                         f"train on and one to validate on: give more conversations or a shorter `block_size`")
    kept, held = _drawn(len(rows), validation_fraction, seed)
    return rows.subset(kept), rows.subset(held)


def _drawn(count, fraction, seed):
    """(kept, held): the indices of `count` items, `fraction` of them (one at least) drawn at random, each in
    order."""
    order = np.random.default_rng(seed).permutation(count)
    held = max(1, int(round(count * fraction)))
    return np.sort(order[held:]), np.sort(order[:held])


def targets(rows):
    """The model's inputs, {"token_ids", "positions"} each (N, block_size), and next-token targets
    (N, block_size), IGNORED where not trained."""
    inputs = {"token_ids": rows.ids[:, :-1], "positions": rows.positions[:, :-1]}
    return inputs, np.where(rows.trained[:, 1:], rows.ids[:, 1:], IGNORED).astype(np.int32)


class ConversationBatches(DrawnBatches):
    """Batches of packed rows drawn at random (as `data.DrawnBatches` says), as (inputs, targets)."""

    def __init__(self, rows, batch_size, num_batches, **kwargs):
        self.inputs, self.targets = targets(rows)
        super().__init__(len(self.targets), batch_size, num_batches, **kwargs)

    def __getitem__(self, index):
        rows = self.rows(index)
        return {name: part[rows] for name, part in self.inputs.items()}, self.targets[rows]


def hold_out(conversations, fraction=0.1, seed=0):
    """(train, held out): a `fraction` of the conversations, one at least, drawn at random; the rest in order."""
    if len(conversations) < 2:
        raise InputError(f"there is {len(conversations)} conversation: at least 2 are needed, one to train on and "
                         f"one to hold out (or give `val_file`)")
    kept, held = _drawn(len(conversations), fraction, seed)
    return [conversations[index] for index in kept], [conversations[index] for index in held]


def last_answers(conversations):
    """Each conversation's question and answer to check: the messages before its last answer, and that answer."""
    questions = []
    for messages in conversations:
        last = max(index for index, message in enumerate(messages) if message["role"] == "assistant")
        questions.append((messages[:last], messages[last]["content"]))
    return questions


def default_template_lengths(conversations, tokenizer=None):
    """Each conversation's length in tokens as a new model reads it: its messages' tokens (`tokenizer`'s, or
    their characters), and two tokens a message for the default template's turn markers."""
    contents = [message["content"] for messages in conversations for message in messages]
    lengths = iter(map(len, tokenizer.encode_batch(contents) if tokenizer is not None else contents))
    return [sum(next(lengths) + 2 for _ in messages) for messages in conversations]


_WORDS = re.compile(r"[^\W\d_]+")  # runs of letters


def repeated_answer_words(conversations, conversations_at_least):
    """Of the words in the conversations' answers (runs of letters, each time one stands), the share that at least
    `conversations_at_least` conversations hold; None where the answers hold no words (numbers alone, say)."""
    held_by, answered = collections.Counter(), []
    for messages in conversations:
        words = [(message["role"], _WORDS.findall(message["content"])) for message in messages]
        held_by.update({word for _, found in words for word in found})  # a conversation's words counted once
        answered += [word for role, found in words if role == "assistant" for word in found]
    if not answered:
        return None
    return sum(held_by[word] >= conversations_at_least for word in answered) / len(answered)
