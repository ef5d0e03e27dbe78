"""The built-in `induction` task: rows of random symbols repeated twice, on which a small GPT's induction heads form.

A row of a window's length plus one (its input and its next-token targets) ends with `half` symbols drawn at
random and the same `half` again, after random symbols that fill it: the first half cannot be predicted better than
chance, the second can be copied from the first by a head that looks at the token after the earlier one of the same
token. `half` is drawn for each row, from a quarter to half the window, so that no fixed distance back finds the
copy: only such a head does. Rows are drawn from the seed alone, so a run reads the same rows whatever its steps.
"""

import numpy as np

from gptlite.data.lm import DrawnBatches

# The symbols a row is drawn from: letters and digits, each a token of a character tokenizer.
SYMBOLS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
# Rows made for training, and held out for the validation loss.
TRAIN_ROWS = 50_000
VALIDATION_ROWS = 1_000


def repeated_rows(count, length, vocabulary, seed):
    """`count` rows of `length` token ids below `vocabulary` (count, length): each random ids, then `half` random
    ids twice, `half` drawn from length // 4 to length // 2 for each row; drawn from `seed`."""
    rng = np.random.default_rng(seed)
    rows = rng.integers(0, vocabulary, size=(count, length), dtype=np.int32)
    halves = rng.integers(max(2, length // 4), length // 2 + 1, size=count)
    for row, half in zip(rows, halves):
        row[length - half:] = row[length - 2 * half:length - half]
    return rows


def task_rows(token_ids, block_size, seed):
    """The task's (train, validation) rows of `block_size + 1` token ids, from the symbols' ids `token_ids`."""
    token_ids = np.asarray(token_ids, np.int32)

    def rows(count, part):
        return token_ids[repeated_rows(count, block_size + 1, len(token_ids), (seed, part))]

    return rows(TRAIN_ROWS, 0), rows(VALIDATION_ROWS, 1)


class RowBatches(DrawnBatches):
    """Batches of whole rows (N, T + 1) drawn at random, as (inputs, next-token targets), drawn as
    `DrawnBatches` says. Yields x (B, T) and y (B, T) int32."""

    def __init__(self, rows, block_size, batch_size, num_batches, **kwargs):
        super().__init__(len(rows), batch_size, num_batches, **kwargs)
        self.rows_held = rows[:, :block_size + 1]

    def __getitem__(self, index):
        windows = self.rows_held[self.rows(index)]
        return windows[:, :-1], windows[:, 1:]
