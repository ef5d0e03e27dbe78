import numpy as np
import pytest

import gptlite
from gptlite.data import pairs
from gptlite.errors import InputError
from gptlite.training import settings

pytestmark = pytest.mark.once("reading pairs is plain Python")


def write(tmp_path, text, name="pairs.tsv"):
    path = tmp_path / name
    path.write_bytes(text.encode("utf-8"))
    return path


def test_reads_pairs_skipping_blank_lines_and_carriage_returns(tmp_path):
    path = write(tmp_path, "abc\tcba\r\n\nhello world\tdlrow olleh\r\n  \nx y\t z\n")
    read = pairs.read_pairs(path)
    assert read.sources == ["abc", "hello world", "x y"]
    assert read.targets == ["cba", "dlrow olleh", " z"]
    assert read.lines == [1, 3, 5]


@pytest.mark.parametrize("bad_line,message", [
    ("no tab here", "line 3: expected source<TAB>target, found no tab"),
    ("a\tb\tc", "line 3: expected source<TAB>target, found 2 tabs"),
    ("source only\t", "line 3: the target is empty"),
    ("\ttarget only", "line 3: the source is empty"),
])
def test_malformed_lines_are_refused_with_their_number(tmp_path, bad_line, message):
    path = write(tmp_path, f"a\tb\n\n{bad_line}\nc\td\n")
    with pytest.raises(InputError, match=message):
        pairs.read_pairs(path)


def test_a_file_needs_two_pairs(tmp_path):
    with pytest.raises(InputError, match="at least 2"):
        pairs.read_pairs(write(tmp_path, "a\tb\n"))


def test_split_holds_out_a_tenth_chosen_by_the_seed():
    all_pairs = pairs.Pairs([str(i) for i in range(50)], [str(-i) for i in range(50)], list(range(1, 51)))
    train, held_out = pairs.split(all_pairs, seed=3)
    assert len(held_out) == 5 and len(train) == 45
    assert sorted(train.sources + held_out.sources, key=int) == all_pairs.sources
    assert held_out.targets == [str(-int(s)) for s in held_out.sources]  # pairs stay together
    assert pairs.split(all_pairs, seed=3)[1].sources == held_out.sources
    assert pairs.split(all_pairs, seed=4)[1].sources != held_out.sources


@pytest.mark.parametrize("task", settings.SYNTHETIC_TASKS)
def test_synthetic_tasks_are_deterministic_correct_and_held_out_is_disjoint(task):
    train, held_out = pairs.synthetic(task, seed=7, train_pairs=5000, held_out_pairs=300)
    assert len(train) == 5000 and len(held_out) == 300
    assert len(set(held_out.sources)) == 300
    assert not set(held_out.sources) & set(train.sources)
    again_train, again_held_out = pairs.synthetic(task, seed=7, train_pairs=5000, held_out_pairs=300)
    assert (again_train, again_held_out) == (train, held_out)
    assert pairs.synthetic(task, seed=8, train_pairs=5000, held_out_pairs=300)[1] != held_out
    for source, target in zip(train.sources + held_out.sources, train.targets + held_out.targets):
        if task == "addition":
            a, b = source.split("+")
            assert 0 <= int(a) <= 999 and 0 <= int(b) <= 999 and int(target) == int(a) + int(b)
        else:
            assert 5 <= len(source) <= 20 and set(source) <= set(pairs.LETTERS)
            assert target == (source[::-1] if task == "reverse" else "".join(sorted(source)))


def column_carries(a, b):
    carry = count = 0
    for _ in range(3):
        carry = int(a % 10 + b % 10 + carry >= 10)
        count += carry
        a, b = a // 10, b // 10
    return count


def test_addition_trains_on_every_operand_length_and_carry_count_and_holds_out_uniform_operands():
    train, held_out = pairs.synthetic("addition", seed=0, train_pairs=4000, held_out_pairs=1000)
    operand_pairs = [tuple(map(int, source.split("+"))) for source in train.sources]
    carries = np.array([column_carries(a, b) for a, b in operand_pairs])
    assert all(0.22 < np.mean(carries == count) < 0.28 for count in range(4))  # 3 in 100 without balancing
    lengths = np.array([len(str(operand)) for pair in operand_pairs for operand in pair])
    assert all(np.mean(lengths == length) > 0.18 for length in (1, 2, 3))  # 1 in 100 among uniform operands
    operands = [int(operand) for source in held_out.sources for operand in source.split("+")]
    assert 0.85 < np.mean(np.array(operands) >= 100) < 0.95  # nine in ten numbers up to 999 have three digits


@pytest.fixture(scope="module")
def tokenizer():
    return gptlite.CharTokenizer("abc", special_tokens=("pad", "start", "end"))


def test_encode_adds_start_and_end_and_pads(tokenizer):
    encoded = pairs.encode(pairs.Pairs(["abc", "a"], ["cba", "bb"]), tokenizer, block_size=4)
    a, b, c = tokenizer.encode("abc")
    start, end = tokenizer.start_token_id, tokenizer.end_token_id
    np.testing.assert_array_equal(encoded.source_ids, [[a, b, c, 0], [a, 0, 0, 0]])
    np.testing.assert_array_equal(encoded.target_ids, [[start, c, b, a, end], [start, b, b, end, 0]])


def test_block_size_needed_fits_the_longest_source_and_target(tokenizer):
    assert pairs.block_size_needed(tokenizer, pairs.Pairs(["abcab"], ["a"]), pairs.Pairs(["a"], ["abc"])) == 5
    assert pairs.block_size_needed(tokenizer, pairs.Pairs(["a"], ["abcabc"])) == 7


def test_too_long_pairs_are_named(tokenizer):
    too_long = pairs.Pairs(["ab", "abc"], ["a", "aaa"], lines=[4, 9])
    with pytest.raises(InputError, match="line 9: the target is 3 tokens long; block size 3"):
        pairs.encode(too_long, tokenizer, block_size=3)
    with pytest.raises(InputError, match="pair 2: the source is 3 tokens long"):
        pairs.encode(pairs.Pairs(["a", "abc"], ["a", "a"]), tokenizer, block_size=2)


def test_batches_are_reproducible_and_targets_are_the_next_tokens(tokenizer):
    encoded = pairs.encode(pairs.Pairs(["a", "ab", "abc", "cab"], ["b", "bb", "cc", "a"]), tokenizer, block_size=4)
    batches = pairs.PairBatches(encoded, batch_size=6, num_batches=3, seed=1)
    inputs, targets = batches[2]
    assert inputs["source_ids"].shape == (6, 4) and inputs["target_ids"].shape == (6, 4) and targets.shape == (6, 4)
    np.testing.assert_array_equal(inputs["target_ids"][:, 1:], targets[:, :-1])
    resumed = pairs.PairBatches(encoded, batch_size=6, num_batches=1, seed=1, first_index=2)
    np.testing.assert_array_equal(resumed[0][0]["source_ids"], inputs["source_ids"])
    halves = [pairs.PairBatches(encoded, 6, 3, seed=1, part=(i, 2))[2][1] for i in range(2)]
    np.testing.assert_array_equal(np.concatenate(halves), targets)
