"""Activation patching: which heads and which residual positions carry what tells two texts apart.

`patching(model, clean, corrupted, answer, wrong)` runs the corrupted text again and again, each time with one
activation copied from the clean text's run: one head's weighted values at every position (step `heads`,
TransformerLens's `hook_z`, as its `patching` module's head patching copies them), or one block's input at one
position (the residual stream, TransformerLens's `hook_resid_pre`). Each run is scored by the share of the logit
difference it restores at the last position, as TransformerLens's patching demos score it:

    (patched - corrupted) / (clean - corrupted),   each the logit of `answer` less that of `wrong`,

1 where the copy restores the clean run's difference whole, 0 where it restores nothing. The runs are rows of a
few batches, each row with its own edit.
"""

import dataclasses

import numpy as np
from keras import ops

from gptlite.errors import InputError
from gptlite.inside import edits as editing
from gptlite.inside.trace import text_ids
from gptlite.model.gpt import check_use
from gptlite.model.hooks import Hooks, step_name

# The most numbers (rows x H x T^2, the attention of a block) one batch of patched runs holds.
MOST_NUMBERS_IN_A_BATCH = 2**25


@dataclasses.dataclass(frozen=True, eq=False)
class Patching:
    """The share of the clean logit difference each patch restores: `heads` (L, H), one head's weighted values
    copied at every position; `residual` (L, T), block l's input at position t copied. `clean_difference` and
    `corrupted_difference`: each run's logit of `answer` less that of `wrong` at its last position; `tokens`: the
    corrupted text's."""

    tokens: list
    answer: int
    wrong: int
    clean_difference: float
    corrupted_difference: float
    heads: np.ndarray
    residual: np.ndarray

    def to_json(self):
        return {"tokens": self.tokens, "answer": self.answer, "wrong": self.wrong,
                "clean_difference": self.clean_difference, "corrupted_difference": self.corrupted_difference,
                "heads": self.heads.tolist(), "residual": self.residual.tolist()}


def patching(model, clean, corrupted, answer, wrong, unknown="error"):
    """`corrupted` run with each head's output, and each block's input at each position, taken from `clean`'s run
    (two texts of as many tokens, each a prompt or token ids, within the context): a `Patching`. `answer` and
    `wrong`: tokens (an id, or a text of one token) whose logit difference at the last position is restored."""
    check_use(model, "score its heads")
    config = model.config
    clean_ids, corrupted_ids = (np.asarray(text_ids(model, text, unknown), np.int32) for text in (clean, corrupted))
    if len(clean_ids) != len(corrupted_ids):
        raise InputError(f"the clean and corrupted texts must be as many tokens long, to be patched position by "
                         f"position; they are {len(clean_ids)} and {len(corrupted_ids)}")
    if len(clean_ids) > config.block_size:
        raise InputError(f"patching reads each text whole, within the context: at most {config.block_size} tokens, "
                         f"not {len(clean_ids)}")
    answer, wrong = editing.token_named(model, answer), editing.token_named(model, wrong)
    names = [step_name(step, layer) for layer in range(config.n_layer) for step in ("heads", "input")]
    kept = editing.run(model, clean_ids[None], names + ["logits"])
    clean_difference = _differences(kept["logits"][None], answer, wrong)[0]
    corrupted_difference = _differences(_logits(model, corrupted_ids[None]), answer, wrong)[0]
    if abs(clean_difference - corrupted_difference) < 1e-6 * max(1.0, abs(clean_difference)):
        raise InputError(f"the clean and corrupted texts give the same logit difference ({clean_difference:.4g}): "
                         f"there is nothing for a patch to restore; choose texts the model answers differently")
    length = len(corrupted_ids)
    patches = [(step_name("heads", layer), head) for layer in range(config.n_layer) for head in range(config.n_head)]
    patches += [(step_name("input", layer), position) for layer in range(config.n_layer) for position in range(length)]
    differences = _patched_differences(model, corrupted_ids, kept, patches, answer, wrong)
    restored = (differences - corrupted_difference) / (clean_difference - corrupted_difference)
    split = config.n_layer * config.n_head
    return Patching(model.tokenizer.pieces(corrupted_ids), answer, wrong, float(clean_difference),
                    float(corrupted_difference), restored[:split].reshape(config.n_layer, config.n_head),
                    restored[split:].reshape(config.n_layer, length))


def _patched_differences(model, ids, clean, patches, answer, wrong):
    """The logit difference of `ids` run once for each patch, its copy taken from `clean` (as `run` keeps it)."""
    config = model.config
    rows = max(1, MOST_NUMBERS_IN_A_BATCH // (config.n_head * len(ids) ** 2 + config.vocab_size * len(ids)))
    found = []
    for first in range(0, len(patches), rows):
        chosen = patches[first:first + rows]
        logits = _logits(model, np.repeat(ids[None], len(chosen), axis=0), editing.patches(chosen, clean))
        found.append(_differences(logits, answer, wrong))
    return np.concatenate(found)


def _logits(model, rows, edits=None):
    """The logits (B, V) at the last position of each of rows (B, T), the model run with `edits`."""
    logits = model(ops.convert_to_tensor(rows), hooks=Hooks(edits=edits))
    return np.asarray(ops.convert_to_numpy(logits[:, -1]), np.float64)


def _differences(logits, answer, wrong):
    """The logit of `answer` less that of `wrong` in each row of logits (B, V), or (B, T, V) at the last position."""
    logits = np.asarray(logits, np.float64)
    if logits.ndim == 3:
        logits = logits[:, -1]
    return logits[:, answer] - logits[:, wrong]
