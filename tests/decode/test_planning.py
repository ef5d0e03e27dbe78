"""The host's plan of each decode call: its steps, their kind and the cache they read; the prefill's columns;
the windows as the host moves them."""

import numpy as np

from gptlite.decode.planning import (_call_step_by_step, cache_span, NARROWEST_PREFILL, plan_steps, prompt_columns,
                                     windows, windows_advanced)
from gptlite.decode.programs import CACHED, RECOMPUTE, RECOMPUTE_THEN_CACHED


def test_a_call_holds_steps_of_one_kind_up_to_where_the_window_fills():
    # A 3-token prompt, block 16: 13 steps from the cache, then every step recomputes the window.
    assert plan_steps([3], 16, 32, use_cache=True, slide=1) == (13, CACHED, 16)
    assert plan_steps([16], 16, 32, use_cache=True, slide=1) == (32, RECOMPUTE, 16)
    assert plan_steps([3], 16, 32, use_cache=False, slide=1) == (32, RECOMPUTE, 16)
    # Moving 8 at a time: one recomputation, then 7 steps from the cache, in one call.
    assert plan_steps([16], 16, 32, use_cache=True, slide=8) == (8, RECOMPUTE_THEN_CACHED, 16)
    assert plan_steps([3], 16, 5, use_cache=True, slide=1) == (5, CACHED, 16)


def test_a_row_past_its_limit_decides_nothing_of_the_call():
    # A full window that has drawn its tokens (limit 0) no longer makes the others recompute.
    assert plan_steps([3, 16], 16, 8, True, 1, limits=[8, 0]) == (8, CACHED, 16)
    # One that fills at its second step and stops there: the call goes on from the cache.
    assert plan_steps([3, 14], 16, 8, True, 1, limits=[8, 2]) == (8, CACHED, 16)
    assert plan_steps([3, 14], 16, 8, True, 1, limits=[8, 3]) == (2, CACHED, 16)
    # Every row at its limit: the call ends there.
    assert plan_steps([3, 5], 16, 8, True, 1, limits=[2, 3]) == (3, CACHED, 16)
    # A waiting row's cache is kept: the short cache still holds its window.
    assert plan_steps([3, 70], 256, 8, True, 1, short_caches=True, limits=[8, 0]) == (8, CACHED, 128)


def test_a_call_reads_a_cache_as_long_as_its_longest_row_reaches():
    assert [cache_span(slots, 256) for slots in (1, 64, 65, 128, 129, 256)] == [64, 64, 128, 128, 256, 256]
    assert cache_span(70, 96) == 96  # never longer than the window
    # Rows of 3 and 50 tokens, block 256: 8 steps write at 50 .. 57 (slots up to 58); 32 reach 82.
    assert plan_steps([3, 50], 256, 8, True, 1, short_caches=True) == (8, CACHED, 64)
    assert plan_steps([3, 50], 256, 32, True, 1, short_caches=True) == (32, CACHED, 128)
    assert plan_steps([3, 50], 256, 32, True, 1) == (32, CACHED, 256)  # unless asked, the whole cache
    # After a slide of 200 from a full window, 57 tokens are left: the cache is short again.
    assert plan_steps([256], 256, 32, True, 200, short_caches=True) == (32, RECOMPUTE_THEN_CACHED, 256)
    assert plan_steps([57], 256, 32, True, 200, short_caches=True) == (32, CACHED, 128)


def test_a_call_in_which_no_window_fills_is_planned_as_step_by_step():
    generator = np.random.default_rng(0)
    for _ in range(300):
        rows, block_size, max_steps = generator.integers(1, 5), 256, int(generator.integers(1, 33))
        lengths = generator.integers(1, block_size - max_steps + 1, size=rows)
        limits = generator.integers(0, max_steps + 1, size=rows)
        reach = int(generator.integers(0, 200))
        expected = _call_step_by_step(lengths, block_size, max_steps, True, 1, limits)
        assert plan_steps(lengths, block_size, max_steps, True, 1, True, limits) == \
            (*expected[:2], cache_span(expected[2], block_size))
        assert plan_steps(lengths, block_size, max_steps, True, 1, limits=limits, reach=reach) == \
            (*expected[:2], cache_span(max(expected[2], reach), block_size))


def test_a_call_whose_rows_reach_is_known_reads_the_span_that_holds_it_from_the_first():
    # Rows bound to reach 100 positions: 128 slots from the first step, so that one program serves them all.
    assert plan_steps([3, 50], 256, 8, True, 1, reach=100) == (8, CACHED, 128)
    assert plan_steps([3, 125], 256, 8, True, 1, reach=100) == (8, CACHED, 256)  # a row that goes further
    assert plan_steps([256], 256, 8, True, 1, reach=100) == (8, RECOMPUTE, 256)  # a full window: all of it


def test_a_gpt_prefill_reads_the_columns_its_longest_window_needs():
    window, lengths = windows(1024, [[1] * 5, [2] * 70])
    assert prompt_columns(window, lengths, None).shape == (2, 128)
    window, lengths = windows(1024, [[1] * 5])
    assert prompt_columns(window, lengths, None).shape == (1, NARROWEST_PREFILL)
    window, lengths = windows(1024, [[1] * 20])
    assert prompt_columns(window, lengths, None).shape == (1, 32)
    window, lengths = windows(96, [[1] * 90])
    assert prompt_columns(window, lengths, None).shape == (1, 96)  # never wider than the window
    # A Seq2Seq's start tokens: one column.
    assert prompt_columns(np.zeros((3, 21), "int32"), np.ones(3, "int32"), np.zeros((3, 21))).shape == (3, 1)


def test_the_host_moves_a_window_as_a_step_does():
    # Block 4: a row with room takes the token at its length; a full one moves `slide` first; a row that is not
    # going keeps its window.
    window = np.array([[1, 2, 0, 0], [1, 2, 3, 4], [5, 6, 7, 8], [1, 2, 3, 4]], np.int32)
    lengths = np.array([2, 4, 4, 4], np.int32)
    tokens = np.array([9, 9, 9, 9], np.int32)
    going = np.array([True, True, False, True])
    moved, grown = windows_advanced(window, lengths, tokens, going, 4, 1)
    assert moved.tolist()[:3] == [[1, 2, 9, 0], [2, 3, 4, 9], [5, 6, 7, 8]] and grown.tolist() == [3, 4, 4, 4]
    moved, grown = windows_advanced(window[3:], lengths[3:], tokens[3:], going[3:], 4, 2)
    assert moved.tolist() == [[3, 4, 9, 0]] and grown.tolist() == [3]
