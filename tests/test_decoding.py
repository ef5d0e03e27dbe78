def test_calls_change_loop_where_the_window_fills():
    from gptlite.decoding import CACHED, RECOMPUTE, RECOMPUTE_THEN_CACHED, plan_calls

    # A 3-token prompt, block 16: tokens 1..13 come from the cache, then every token recomputes the window.
    assert plan_calls([3], 16, 40, use_cache=True, slide=1) == [
        (1, 8, CACHED, 16), (9, 5, CACHED, 16), (14, 26, RECOMPUTE, 16)]
    assert plan_calls([3], 16, 40, use_cache=False, slide=1) == [(1, 8, RECOMPUTE, 16), (9, 31, RECOMPUTE, 16)]
    # Moving 8 at a time: one recomputation, then 7 tokens from the cache, in one call.
    assert plan_calls([16], 16, 20, use_cache=True, slide=8) == [
        (1, 8, RECOMPUTE_THEN_CACHED, 16), (9, 8, RECOMPUTE_THEN_CACHED, 16), (17, 3, RECOMPUTE_THEN_CACHED, 16)]


def test_a_call_reads_a_cache_as_long_as_its_longest_text_reaches():
    from gptlite.decoding import CACHED, RECOMPUTE, RECOMPUTE_THEN_CACHED, cache_span, plan_calls

    assert [cache_span(slots, 256) for slots in (1, 64, 65, 128, 129, 256)] == [64, 64, 128, 128, 256, 256]
    assert cache_span(70, 96) == 96  # never longer than the window
    # Rows of 3 and 50 tokens, block 256: the longest writes at 50 .. 57 in the first call (slots 51 .. 58),
    # at 58 .. 89 in the second, which so needs 128 slots.
    assert plan_calls([3, 50], 256, 50, use_cache=True, slide=1, short_caches=True) == [
        (1, 8, CACHED, 64), (9, 32, CACHED, 128), (41, 9, CACHED, 128)]
    # Unless asked for, every call reads the whole cache.
    assert plan_calls([3, 50], 256, 50, use_cache=True, slide=1) == [
        (1, 8, CACHED, 256), (9, 32, CACHED, 256), (41, 9, CACHED, 256)]
    # Recomputing reads the whole window; after a slide of 200, 57 tokens are left and the cache is short again.
    assert plan_calls([256], 256, 40, use_cache=True, slide=200, short_caches=True) == [
        (1, 8, RECOMPUTE_THEN_CACHED, 256), (9, 31, CACHED, 128)]
    assert plan_calls([3], 256, 5, use_cache=False, slide=1, short_caches=True) == [(1, 4, RECOMPUTE, 256)]


def test_a_gpt_prefill_reads_the_columns_its_longest_window_needs():
    import numpy as np

    from gptlite.decoding import PREFILL_WIDTH, prompt_columns, windows

    window, lengths = windows(1024, [[1] * 5, [2] * 70])
    assert prompt_columns(window, lengths, None).shape == (2, 128)
    window, lengths = windows(1024, [[1] * 5])
    assert prompt_columns(window, lengths, None).shape == (1, PREFILL_WIDTH)
    window, lengths = windows(96, [[1] * 90])
    assert prompt_columns(window, lengths, None).shape == (1, 96)  # never wider than the window
    # A Seq2Seq's start tokens: one column.
    assert prompt_columns(np.zeros((3, 21), "int32"), np.ones(3, "int32"), np.zeros((3, 21))).shape == (3, 1)


def test_cached_text_is_recomputed_text_as_the_cache_grows_and_is_cut(tokenizer):
    import keras

    import gptlite
    from gptlite.decoding import keep_caches_short

    keras.utils.set_random_seed(3)
    model = gptlite.GPT(vocab_size=tokenizer.vocabulary_size, n_layer=1, n_head=2, n_embd=16, block_size=160,
                        tokenizer=tokenizer)
    keep_caches_short(model)
    # Rows of 7 and 69 tokens (a prefill of 128 columns) share a cache as long as the longer needs: 128, then
    # 160 slots.
    rows = ["the cat", "the cat sat on the mat " * 3]
    cached = gptlite.generate(model, rows, 70, seed=1)
    assert cached == gptlite.generate(model, rows, 70, seed=1, use_cache=False)
    assert [len(text) for text in cached] == [len(prompt) + 70 for prompt in rows]
    keep_caches_short(model, False)
    assert gptlite.generate(model, rows, 70, seed=1) == cached  # the whole cache every call
    keep_caches_short(model)
    # A full window moved 120 tokens keeps 41: the cached steps after it read a cache cut back to 64 slots.
    full = "the cat sat on the mat " * 7
    assert (gptlite.generate(model, full, 30, seed=1, slide=120)
            == gptlite.generate(model, full, 30, seed=1, slide=120, use_cache=False))
