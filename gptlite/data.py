"""Training text: reading it, the built-in default corpus, the split and the batches."""

import pathlib
import sysconfig

import keras
import numpy as np

from gptlite.errors import InputError, MissingFileError

VALIDATION_FRACTION = 0.1
DEFAULT_CORPUS_CHARACTERS = 2_000_000


def read_text(path, encoding="utf-8", errors="strict"):
    """The whole file as a string, or a `GPTLiteError` that says what is wrong with it.

    `errors="replace"` decodes bad bytes as U+FFFD instead of refusing the file.
    """
    path = pathlib.Path(path)
    if not path.exists():
        raise MissingFileError(f"no such file: {path}")
    if path.is_dir():
        raise InputError(f"{path} is a folder; give a text file")
    try:
        raw = path.read_bytes()
    except OSError as error:
        raise InputError(f"cannot read {path}: {error.strerror}") from None
    try:
        text = raw.decode(encoding, errors)
    except UnicodeDecodeError as error:
        line = raw.count(b"\n", 0, error.start) + 1
        raise InputError(
            f"{path} is not valid {encoding}: byte {error.start} (line {line}) "
            f"is {raw[error.start:error.start + 1]!r}; convert the file to {encoding}, "
            f"name its encoding with --encoding, or pass --errors replace"
        ) from None
    except LookupError:
        raise InputError(f"unknown text encoding {encoding!r}") from None
    if not text.strip():
        raise InputError(f"{path} has no text in it")
    return text


def default_corpus(max_characters=DEFAULT_CORPUS_CHARACTERS):
    """Python source from the standard library of the running interpreter.

    Every Python install has it offline. The selection is deterministic: the
    ASCII-only `.py` files under the standard library folder, outside test
    suites, in sorted path order, until `max_characters` are collected.
    """
    stdlib = pathlib.Path(sysconfig.get_paths()["stdlib"])
    skipped_folders = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"}
    pieces, total = [], 0
    for path in sorted(stdlib.rglob("*.py")):
        if skipped_folders.intersection(path.relative_to(stdlib).parts):
            continue
        try:
            source = path.read_bytes().decode("ascii")
        except (OSError, UnicodeDecodeError):
            continue
        pieces.append(f"# {path.relative_to(stdlib).as_posix()}\n{source}\n")
        total += len(pieces[-1])
        if total >= max_characters:
            break
    if not pieces:
        raise InputError(f"found no Python sources under {stdlib} to train on; give a text file")
    return "".join(pieces)[:max_characters]


def split(token_ids, validation_fraction=VALIDATION_FRACTION):
    """(train, validation): the validation part is the last fraction of the stream."""
    boundary = int(len(token_ids) * (1 - validation_fraction))
    return token_ids[:boundary], token_ids[boundary:]


def check_enough_tokens(train_ids, validation_ids, block_size):
    """Raise if either part is too short to cut one (block_size + 1)-token window from."""
    shortest = min(len(train_ids), len(validation_ids))
    if shortest < block_size + 1:
        total = len(train_ids) + len(validation_ids)
        if shortest < 2:
            raise InputError(
                f"the text has {total} tokens, too few to train on; give a longer text"
            )
        raise InputError(
            f"the text has {total} tokens, too few for block size {block_size} "
            f"(its validation part has {len(validation_ids)}); give a longer text "
            f"or use --block-size {shortest - 1} or less"
        )


class RandomWindows(keras.utils.PyDataset):
    """Batches of random (block_size + 1)-token windows, as (inputs, next-token targets).

    Batch `i` depends only on (seed, first_index + i), so a run is reproducible
    and can be resumed at any step without replaying the ones before it.

    Yields x (B, T) and y (B, T) int32, where y is x shifted left by one token.
    With `part=(i, n)`, only the i-th of n equal slices of each batch's rows:
    the share one of n training processes feeds.
    """

    def __init__(self, token_ids, block_size, batch_size, num_batches, seed=0, first_index=0, part=(0, 1),
                 **kwargs):
        super().__init__(**kwargs)
        if len(token_ids) < block_size + 1:
            raise InputError(f"{len(token_ids)} tokens cannot fill a window of {block_size + 1}")
        self.token_ids = token_ids
        self.block_size = block_size
        self.batch_size = batch_size
        self.batch_count = num_batches
        self.seed = seed
        self.first_index = first_index
        self.part = part
        self._offsets = np.arange(block_size + 1)  # (T + 1,)

    def __len__(self):
        return self.batch_count

    def __getitem__(self, index):
        rng = np.random.default_rng((self.seed, self.first_index + index))
        starts = rng.integers(0, len(self.token_ids) - self.block_size, size=self.batch_size)
        index, count = self.part
        starts = starts[index * self.batch_size // count: (index + 1) * self.batch_size // count]
        windows = self.token_ids[starts[:, None] + self._offsets].astype(np.int32)  # (B, T + 1)
        return windows[:, :-1], windows[:, 1:]

