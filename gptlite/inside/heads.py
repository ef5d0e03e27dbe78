"""What each attention head does, in numbers: `heads(model, text)` scores every layer's every query head by where
it looks over a text (the token before, the first token, the token itself), by how much it attends as an
induction head on a probe of random tokens repeated twice, and by what knocking it out costs the text's loss.

The four attention scores are TransformerLens's head detector's similarity score ("mul"): the share of a head's
attention, summed over every query position, that falls where a pattern says (a lower-triangular matrix of ones
and zeros), over all of its attention: for `previous_token` the diagonal below the main one, for `current_token`
the main diagonal, for `first_token` the first column, for `induction` (on the probe) each position's key just after
the earlier one of the same token (TransformerLens's induction pattern: the duplicates, shifted right by one).
Each row of attention sums to 1, so a score is the mean over the text's positions of the attention there. A
perfect induction head scores about half the probe's positions (its first half has nothing earlier to repeat): 0.49
on a probe of 2 x 31 tokens and a start token.

A label ("previous-token head") is derived from the raw scores: a head takes a kind's label where its score is at
least LABEL_SCORES[kind] and at least twice the largest score of that kind in the same model at initialisation (its
shape with fresh weights, on the same text and probe), which `calibrate` computes: a short text gives every head of
an untrained model a high share on its first token, and such a head is no first-token head.
"""

import dataclasses

import keras
import numpy as np
from keras import ops

from gptlite.errors import InputError
from gptlite.inside import edits as editing
from gptlite.inside.trace import text_ids
from gptlite.model.gpt import check_use
from gptlite.model.hooks import Hooks, step_name
from gptlite.model.layers import seeded_weights

# The attention patterns a head is scored against, in the report's order.
PATTERNS = ("previous_token", "first_token", "current_token", "induction")
# The least score that gives a head a kind's label (see the module's docstring), and the label's words.
LABEL_SCORES = {"previous_token": 0.4, "first_token": 0.4, "current_token": 0.4, "induction": 0.2}
LABELS = {"previous_token": "previous-token", "first_token": "first-token", "current_token": "current-token",
          "induction": "induction"}
# The probe: this many random tokens (at most; fewer where the context holds fewer), then the same again.
PROBE_TOKENS = 31
# Rows of one batch of ablated runs: enough to run a small model's every head at once, few enough to hold a large
# model's attention (rows x H x T^2 numbers a block) in memory.
MOST_NUMBERS_IN_A_BATCH = 2**25


@dataclasses.dataclass(frozen=True, eq=False)
class HeadReport:
    """Scores of every layer's every query head, each (L, H): `previous_token`, `first_token`, `current_token` (on
    the text `ids`), `induction` (on `probe`, random tokens repeated twice after the tokenizer's start of text),
    `ablation` (the text's loss, in nats a token, with the head's output zeroed, less `loss`, the model's own).
    `initial`: the four attention scores of the same shape at initialisation, by pattern (None where not
    calibrated)."""

    ids: np.ndarray
    tokens: list
    probe: np.ndarray
    previous_token: np.ndarray
    first_token: np.ndarray
    current_token: np.ndarray
    induction: np.ndarray
    ablation: np.ndarray
    loss: float
    initial: dict = None

    def labels(self):
        """Each head's labels (see the module's docstring): {(layer, head): [label, ...]} for the heads with one."""
        found = {}
        for pattern in PATTERNS:
            least = LABEL_SCORES[pattern]
            if self.initial is not None:
                least = max(least, 2 * float(self.initial[pattern].max()))
            for layer, head in zip(*np.nonzero(getattr(self, pattern) >= least)):
                found.setdefault((int(layer), int(head)), []).append(LABELS[pattern])
        return found

    def table(self):
        """The report as lines of text: a row a head, its scores and labels."""
        labels = self.labels()
        lines = [f"{len(self.ids)} tokens, loss {self.loss:.4f} nats a token; induction on a probe of "
                 f"{len(self.probe)} tokens; ablation: the loss with the head zeroed, less the model's own",
                 f"{'layer':>5} {'head':>4} {'previous':>9} {'first':>7} {'current':>8} {'induction':>9} "
                 f"{'ablation':>9}  label"]
        layers, heads = self.ablation.shape
        for layer in range(layers):
            for head in range(heads):
                lines.append(f"{layer:>5} {head:>4} {self.previous_token[layer, head]:>9.3f} "
                             f"{self.first_token[layer, head]:>7.3f} {self.current_token[layer, head]:>8.3f} "
                             f"{self.induction[layer, head]:>9.3f} {self.ablation[layer, head]:>+9.4f}  "
                             f"{', '.join(labels.get((layer, head), []))}".rstrip())
        if self.initial is not None:
            lines.append("at initialisation, the largest: " + ", ".join(
                f"{pattern.replace('_', ' ')} {self.initial[pattern].max():.3f}" for pattern in PATTERNS))
        return "\n".join(lines)

    def to_json(self):
        labels = self.labels()
        made = {"ids": [int(i) for i in self.ids], "tokens": self.tokens, "probe": [int(i) for i in self.probe],
                "loss": self.loss, **{name: getattr(self, name).tolist() for name in (*PATTERNS, "ablation")},
                "labels": [{"layer": layer, "head": head, "labels": found} for (layer, head), found in
                           sorted(labels.items())]}
        if self.initial is not None:
            made["initial"] = {pattern: scores.tolist() for pattern, scores in self.initial.items()}
        return made


def heads(model, text, unknown="error", seed=0, calibrate=True):
    """Every head of `model` (a GPT) scored on `text` (a prompt, read as `generate` reads one, or token ids; its
    last block_size tokens): a `HeadReport`. `seed` draws the probe; `calibrate` scores the model's shape at
    initialisation too, for the labels."""
    check_use(model, "score its heads")
    ids = np.asarray(text_ids(model, text, unknown)[-model.config.block_size:], np.int32)
    if len(ids) < 2:
        raise InputError(f"scoring heads needs a text of at least 2 tokens; this one is {len(ids)}")
    probe = probe_ids(model, seed)
    config = model.config
    # The text and the probe, then the text again with each head knocked out in turn: rows of batches of one shape,
    # so that a backend compiles each operation once.
    knocked_out = [((layer, head, "decoder"),) for layer in range(config.n_layer) for head in range(config.n_head)]
    runs = Runs(model, ids, probe, 2 + len(knocked_out))
    attention, losses = runs.scored(model, [(), ()] + knocked_out)  # losses: the text's, the probe's, then each
    initial = None
    if calibrate:  # the same shape of batch: nothing compiles again
        initial = attention_scores(runs.scored(initialised(model), [(), ()])[0], ids, probe)
    ablation = (losses[2:] - losses[0]).reshape(config.n_layer, config.n_head)
    return HeadReport(ids, model.tokenizer.pieces(ids), probe, **attention_scores(attention, ids, probe),
                      ablation=ablation, loss=float(losses[0]), initial=initial)


def probe_ids(model, seed=0):
    """Random tokens repeated twice, after the tokenizer's start of text: PROBE_TOKENS of them, or as many as the
    context holds below its length (TransformerLens's detector takes fewer tokens than the context), drawn by
    `seed` from the tokens that stand for text (no start, end, pad or added token), each once where the
    vocabulary has enough."""
    tokenizer, config = model.tokenizer, model.config
    start = [int(i) for i in tokenizer.text_start_ids]
    count = min(PROBE_TOKENS, (config.block_size - 1 - len(start)) // 2)
    special = {tokenizer.start_token_id, tokenizer.end_token_id, tokenizer.pad_token_id, *start}
    for added in tokenizer.added_tokens:
        special.update(int(i) for i in tokenizer.encode(added))
    candidates = np.array([i for i in range(config.vocab_size) if i not in special])
    if count < 2 or len(candidates) < 2:
        raise InputError(f"an induction probe repeats at least 2 tokens twice, within the context less one; this "
                         f"model's context is {config.block_size} tokens")
    drawn = np.random.default_rng(seed).choice(candidates, count, replace=len(candidates) < count)
    return np.asarray(start + list(drawn) * 2, np.int32)


def attention_scores(attention, ids, probe):
    """The four attention scores (see the module's docstring) of every head, {pattern: (L, H)}, from the attention
    (L, 2, H, T, T) of the text's row and the probe's (each its own T by T first)."""
    on_text = attention[:, 0, :, :len(ids), :len(ids)]  # (L, H, T, T)
    on_probe = attention[:, 1, :, :len(probe), :len(probe)]
    length = len(ids)
    first = np.zeros((length, length))
    first[:, 0] = 1
    patterns = {"previous_token": np.eye(length, k=-1), "first_token": first, "current_token": np.eye(length)}
    scores = {name: similarity(on_text, pattern) for name, pattern in patterns.items()}
    scores["induction"] = similarity(on_probe, induction_pattern(probe))
    return {name: scores[name] for name in PATTERNS}


def similarity(attention, pattern):
    """TransformerLens's "mul" score of attention (..., T, T) against a pattern (T, T) of ones and zeros: the
    attention where the pattern is 1, over all of it (...)."""
    return (attention * pattern).sum(axis=(-2, -1)) / attention.sum(axis=(-2, -1))


def induction_pattern(ids):
    """Where an induction head looks (T, T): from each position, at the token just after each earlier one of the
    same token (TransformerLens's: its duplicate-token pattern shifted right by one)."""
    ids = np.asarray(ids)
    duplicates = np.tril(np.equal(ids[:, None], ids[None, :]).astype(np.float64), -1)  # earlier, the same token
    shifted = np.zeros_like(duplicates)
    shifted[:, 1:] = duplicates[:, :-1]
    return np.tril(shifted)


def initialised(model, seed=0):
    """A model of `model`'s shape and tokenizer with fresh weights, drawn from `seed`."""
    with seeded_weights(seed):
        fresh = type(model).from_gpt_config(model.config, model.tokenizer)
        fresh.build((None, None))
    return fresh


class Runs:
    """Runs of a model over the text `ids` and the `probe` as rows of batches of one shape: the rows padded at their
    end to the longer of the two (causal attention: no position sees the padding after it), at most `rows` a batch
    (fewer where a batch of `count` rows would hold more than MOST_NUMBERS_IN_A_BATCH numbers)."""

    def __init__(self, model, ids, probe, count):
        config = model.config
        self.ids, self.probe, self.length = ids, probe, max(len(ids), len(probe))
        per_row = config.n_head * self.length ** 2 + config.vocab_size * self.length
        self.rows = max(2, min(count, MOST_NUMBERS_IN_A_BATCH // per_row))

    def padded(self, ids):
        return np.concatenate([ids, np.full(self.length - len(ids), ids[-1], np.int32)])

    def scored(self, model, knocked_out):
        """`model` run on rows 0 (the text) and 1 (the probe), then the text again, row r with the heads
        `knocked_out[r]` zeroed (each a collection of (layer, head, part); empty: none): the attention
        (L, 2, H, T, T) of the first two rows, and each row's next-token loss over the text's length (R,)."""
        names = [step_name("attention", layer) for layer in range(model.config.n_layer)]
        rows = [self.padded(self.ids), self.padded(self.probe)] + [self.padded(self.ids)] * (len(knocked_out) - 2)
        attention, losses = None, []
        for first in range(0, len(rows), self.rows):
            real = min(self.rows, len(rows) - first)
            chosen = list(range(first, first + real)) + [first] * (self.rows - real)  # every batch of one shape
            hooks = Hooks(keep=names if first == 0 else None,
                          edits=editing.ablations_by_row(model, [knocked_out[row] for row in chosen]))
            batch = np.stack([rows[row] for row in chosen])
            logits = model(ops.convert_to_tensor(batch), hooks=hooks)
            if first == 0:
                attention = np.stack([np.asarray(ops.convert_to_numpy(ops.cast(hooks.kept[name][:2], "float32")),
                                                 np.float64) for name in names])
            losses.append(_losses(batch, logits, len(self.ids))[:real])
        return attention, np.concatenate(losses)


def _losses(rows, logits, length):
    """Each row's mean next-token loss (cross-entropy, nats a token) over its first `length` tokens."""
    losses = keras.losses.sparse_categorical_crossentropy(rows[:, 1:length], logits[:, :length - 1], from_logits=True)
    return np.asarray(ops.convert_to_numpy(ops.mean(losses, axis=-1)), np.float64)
