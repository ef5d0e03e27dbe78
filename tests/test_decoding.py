def test_calls_change_loop_where_the_window_fills():
    from gptlite.decoding import CACHED, RECOMPUTE, RECOMPUTE_THEN_CACHED, plan_calls

    # A 3-token prompt, block 16: tokens 1..13 come from the cache, then every token recomputes the window.
    assert plan_calls([3], 16, 40, use_cache=True, slide=1) == [(1, 8, CACHED), (9, 5, CACHED), (14, 26, RECOMPUTE)]
    assert plan_calls([3], 16, 40, use_cache=False, slide=1) == [(1, 8, RECOMPUTE), (9, 31, RECOMPUTE)]
    # Moving 8 at a time: one recomputation, then 7 tokens from the cache, in one call.
    assert plan_calls([16], 16, 20, use_cache=True, slide=8) == [
        (1, 8, RECOMPUTE_THEN_CACHED), (9, 8, RECOMPUTE_THEN_CACHED), (17, 3, RECOMPUTE_THEN_CACHED)]
