def test_calls_change_loop_where_the_window_fills():
    from gptlite.decoding import CACHED, RECOMPUTE, RECOMPUTE_THEN_CACHED, plan_calls

    # A 3-token prompt, block 16: tokens 1..13 come from the cache, then every token recomputes the window.
    assert plan_calls([3], 16, 40, use_cache=True, slide=1) == [(1, 8, CACHED), (9, 5, CACHED), (14, 26, RECOMPUTE)]
    assert plan_calls([3], 16, 40, use_cache=False, slide=1) == [(1, 8, RECOMPUTE), (9, 31, RECOMPUTE)]
    # Moving 8 at a time: one recomputation, then 7 tokens from the cache, in one call.
    assert plan_calls([16], 16, 20, use_cache=True, slide=8) == [
        (1, 8, RECOMPUTE_THEN_CACHED), (9, 8, RECOMPUTE_THEN_CACHED), (17, 3, RECOMPUTE_THEN_CACHED)]


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


def test_cached_text_is_recomputed_text_in_a_context_wider_than_the_prefill(tokenizer):
    import keras

    import gptlite

    keras.utils.set_random_seed(3)
    model = gptlite.GPT(vocab_size=tokenizer.vocabulary_size, n_layer=1, n_head=2, n_embd=16, block_size=160,
                        tokenizer=tokenizer)
    for prompt in ("the cat", "the cat sat on the mat " * 4):  # 7 and 92 tokens: prefills of 64 and 128
        cached = gptlite.generate(model, prompt, 80, seed=1)
        assert cached == gptlite.generate(model, prompt, 80, seed=1, use_cache=False)
        assert len(cached) == len(prompt) + 80
