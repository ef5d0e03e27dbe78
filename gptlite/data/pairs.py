"""Pairs of texts for the seq2seq model: files of source<TAB>target lines,
the built-in synthetic tasks, the held-out split, encoding and batches."""

import dataclasses

import numpy as np

from gptlite.data import SYNTHETIC_TASKS
from gptlite.data.lm import DrawnBatches
from gptlite.errors import InputError
from gptlite.files import read_text

SYNTHETIC_TRAIN_PAIRS = 200_000
HELD_OUT_PAIRS = 1_000  # a synthetic task's held-out set; also the most pairs exact match is measured on
VALIDATION_FRACTION = 0.1  # of a file's pairs, held out
SHORTEST, LONGEST = 5, 20  # string lengths of the reverse and sort tasks
LETTERS = "abcdefghijklmnopqrstuvwxyz"


@dataclasses.dataclass
class Pairs:
    """Source and target texts; `lines`, where they came from a file, says which line each was."""

    sources: list
    targets: list
    lines: list = None

    def __len__(self):
        return len(self.sources)

    def where(self, index):
        return f"line {self.lines[index]}" if self.lines else f"pair {index + 1}"

    def subset(self, indices):
        pick = lambda items: [items[i] for i in indices]  # noqa: E731
        return Pairs(pick(self.sources), pick(self.targets), pick(self.lines) if self.lines else None)


def read_pairs(path, encoding="utf-8", errors="strict", at_least=2):
    """The pairs of a text file of `source<TAB>target` lines; blank lines are skipped.

    A line without exactly one tab, or with an empty side, is refused with its
    number, and so is a file of fewer than `at_least` pairs (training needs
    one to train on and one to hold out).
    """
    text = read_text(path, encoding, errors)
    sources, targets, lines = [], [], []
    for number, line in enumerate(text.split("\n"), start=1):
        line = line.removesuffix("\r")
        if not line.strip():
            continue
        tabs = line.count("\t")
        if tabs != 1:
            raise InputError(f"{path}, line {number}: expected source<TAB>target, found "
                             f"{'no tab' if tabs == 0 else f'{tabs} tabs'}: {_shortened(line)!r}")
        source, target = line.split("\t")
        for side, value in (("source", source), ("target", target)):
            if not value:
                raise InputError(f"{path}, line {number}: the {side} is empty")
        sources.append(source)
        targets.append(target)
        lines.append(number)
    if len(sources) < at_least:
        needs = "at least 2 (one to train on, one to hold out)" if at_least == 2 else f"at least {at_least}"
        raise InputError(f"{path} has {len(sources)} source<TAB>target lines; it needs {needs}")
    return Pairs(sources, targets, lines)


def _shortened(line, length=40):
    return line if len(line) <= length else line[:length] + "..."


def split(pairs, seed):
    """(train, held out): a random tenth of the pairs, at least one, chosen by the seed."""
    order = np.random.default_rng(seed).permutation(len(pairs))
    held_out = max(1, int(len(pairs) * VALIDATION_FRACTION))
    return pairs.subset(sorted(order[held_out:])), pairs.subset(sorted(order[:held_out]))


def synthetic(task, seed, train_pairs=SYNTHETIC_TRAIN_PAIRS, held_out_pairs=HELD_OUT_PAIRS):
    """(train, held out) pairs of a built-in task, the same for the same seed.

    addition: "123+45" -> "168", operands 0 to 999; reverse: a string of
    5 to 20 lowercase letters -> the same backwards; sort: such a string ->
    its letters in order. No held-out source appears among the training pairs.

    Held-out addition operands are uniform from 0 to 999, as most people's
    sums would be. A training operand's number of digits is uniform from 1
    to 3 instead: among uniform operands nine in ten have three digits, and
    a model trained on them learns where the digits sit in "123+456" but
    not how they line up in "123+45". Training sums also carry 0, 1, 2 or
    3 times equally often (see _addition_training_sources).
    """
    if task not in SYNTHETIC_TASKS:
        raise InputError(f"unknown synthetic task {task!r}; choose from {', '.join(SYNTHETIC_TASKS)}")
    rng = np.random.default_rng([seed, list(SYNTHETIC_TASKS).index(task)])
    if task == "addition":
        make_held_out, make_train = _addition_sources, _addition_training_sources
    else:
        make_held_out = make_train = _letter_strings
    held_out = list(dict.fromkeys(make_held_out(rng, 2 * held_out_pairs)))[:held_out_pairs]
    unseen = set(held_out)
    train = []
    while len(train) < train_pairs:
        train += [source for source in make_train(rng, train_pairs) if source not in unseen]
    train = train[:train_pairs]
    solve = {"addition": _add, "reverse": lambda s: s[::-1], "sort": lambda s: "".join(sorted(s))}[task]
    return Pairs(train, [solve(s) for s in train]), Pairs(held_out, [solve(s) for s in held_out])


def _addition_sources(rng, count):
    operands = rng.integers(0, 1000, size=(count, 2))
    return [f"{a}+{b}" for a, b in operands.tolist()]


def _addition_training_sources(rng, count):
    """Operands whose number of digits is uniform from 1 to 3, drawn so that
    sums with 0, 1, 2 and 3 carries come equally often.

    Drawn by digit count alone, only 3 sums in 100 carry three times
    (999+1, 456+548), against 14 in 100 among uniform operands; those sums
    are the ones a model so trained gets wrong last.
    """
    sources = []
    while len(sources) < count:
        digits = rng.integers(1, 4, size=(count, 2))
        a, b = rng.integers(np.where(digits == 1, 0, 10 ** (digits - 1)), 10 ** digits).T
        carries = _carries(a, b)
        share = np.bincount(carries, minlength=4) / len(carries)
        keep = rng.random(len(carries)) < share.min() / share[carries]
        sources += [f"{x}+{y}" for x, y in zip(a[keep].tolist(), b[keep].tolist())]
    return sources[:count]


def _carries(a, b):
    """How many of the column sums of a + b carry, elementwise over arrays of operands below 1000."""
    carry = np.zeros_like(a)
    count = np.zeros_like(a)
    for place in (1, 10, 100):
        carry = (a // place % 10 + b // place % 10 + carry >= 10).astype(a.dtype)
        count += carry
    return count


def _letter_strings(rng, count):
    lengths = rng.integers(SHORTEST, LONGEST + 1, size=count)
    letters = np.array(list(LETTERS))[rng.integers(0, len(LETTERS), size=(count, LONGEST))]
    return ["".join(row[:length]) for row, length in zip(letters.tolist(), lengths.tolist())]


def _add(source):
    a, b = source.split("+")
    return str(int(a) + int(b))


def block_size_needed(tokenizer, *pair_sets):
    """The smallest block size that holds every source, and every target after its start token."""
    return max(_longest(tokenizer, pairs) for pairs in pair_sets)


def _longest(tokenizer, pairs):
    source = max(len(ids) for ids in tokenizer.encode_batch(pairs.sources))
    target = max(len(ids) for ids in tokenizer.encode_batch(pairs.targets))
    return max(source, target + 1)


@dataclasses.dataclass
class PairSet:
    """Pairs encoded for the model, padded to the block size with the pad id (0).

    source_ids (N, S); target_ids (N, S + 1), each the start token, the
    target and the end token: the decoder reads target_ids[:, :-1] and
    learns to predict target_ids[:, 1:].
    """

    source_ids: np.ndarray
    target_ids: np.ndarray
    pairs: Pairs

    def __len__(self):
        return len(self.source_ids)


def encode(pairs, tokenizer, block_size, too_long="raise `block_size` or leave it unset to fit the longest pair"):
    """Encode pairs into a PairSet, or say which pair is too long for the block size, and `too_long`."""
    source_ids = np.zeros((len(pairs), block_size), np.int32)
    target_ids = np.zeros((len(pairs), block_size + 1), np.int32)
    for index, (source, target) in enumerate(zip(tokenizer.encode_batch(pairs.sources),
                                                 tokenizer.encode_batch(pairs.targets))):
        if len(source) > block_size or len(target) + 1 > block_size:
            side, length = ("source", len(source)) if len(source) > block_size else ("target", len(target))
            raise InputError(f"{pairs.where(index)}: the {side} is {length} tokens long; block size {block_size} "
                             f"holds sources of up to {block_size} and targets of up to {block_size - 1}; "
                             f"{too_long}")
        source_ids[index, :len(source)] = source
        target_ids[index, 0] = tokenizer.start_token_id
        target_ids[index, 1:len(target) + 1] = target
        target_ids[index, len(target) + 1] = tokenizer.end_token_id
    return PairSet(source_ids, target_ids, pairs)


class PairBatches(DrawnBatches):
    """Batches of pairs drawn at random (as `data.DrawnBatches` says), as (model inputs, next-token targets).

    Yields {"source_ids": (B, S), "target_ids": (B, S)} and targets (B, S), int32;
    padded target positions hold the pad id, which the loss leaves out.
    """

    def __init__(self, pair_set, batch_size, num_batches, **kwargs):
        super().__init__(len(pair_set), batch_size, num_batches, **kwargs)
        self.pair_set = pair_set

    def __getitem__(self, index):
        rows = self.rows(index)
        targets = self.pair_set.target_ids[rows]
        inputs = {"source_ids": self.pair_set.source_ids[rows], "target_ids": targets[:, :-1]}
        return inputs, targets[:, 1:]
