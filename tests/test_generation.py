import keras
import numpy as np
import pytest

import gptlite


def greedy_by_full_recomputation(model, prompt, new_tokens):
    """Reference: run the plain model on the last block_size tokens each step, take the argmax."""
    ids = list(model.tokenizer.encode(prompt))
    for _ in range(new_tokens):
        context = np.array([ids[-model.config.block_size:]], dtype="int32")
        logits = keras.ops.convert_to_numpy(model(context))
        ids.append(int(np.argmax(logits[0, -1])))
    return model.tokenizer.decode(ids)


@pytest.mark.parametrize("prompt", ["the cat", "a", "dog ran to the big red hat and"])
def test_greedy_equals_full_recomputation_across_the_block_boundary(tiny_model, prompt):
    # 30 new tokens from a 16-token context: the window slides for most of them.
    expected = greedy_by_full_recomputation(tiny_model, prompt, 30)
    assert gptlite.generate(tiny_model, prompt, max_new_tokens=30, temperature=0) == expected


def test_top_k_of_one_is_greedy(tiny_model):
    greedy = gptlite.generate(tiny_model, "the", max_new_tokens=20, temperature=0)
    assert gptlite.generate(tiny_model, "the", max_new_tokens=20, temperature=1.5, top_k=1, seed=3) == greedy


def test_same_seed_repeats_and_other_seeds_differ(tiny_model):
    sample = lambda seed: gptlite.generate(tiny_model, "the ", max_new_tokens=40, temperature=1.0, seed=seed)
    assert sample(7) == sample(7)
    assert len({sample(7), sample(8), sample(9)}) == 3


def test_top_k_only_emits_the_k_likeliest_tokens(tiny_model):
    prompt = "sun and"
    context = np.array([tiny_model.tokenizer.encode(prompt)], dtype="int32")
    logits = keras.ops.convert_to_numpy(tiny_model(context))[0, -1]
    allowed = set(tiny_model.tokenizer.decode(np.argsort(logits)[-3:]))
    firsts = {next(iter(gptlite.stream(tiny_model, prompt, 1, temperature=2.0, top_k=3, seed=s)))
              for s in range(40)}
    assert firsts <= allowed
    assert len(firsts) > 1


def test_stream_yields_the_same_text_generate_returns(tiny_model):
    pieces = list(gptlite.stream(tiny_model, "the", max_new_tokens=25, temperature=0.8, seed=1))
    assert len(pieces) == 25
    assert "the" + "".join(pieces) == gptlite.generate(tiny_model, "the", 25, temperature=0.8, seed=1)


def test_empty_prompt_starts_a_new_line(tiny_model):
    text = gptlite.generate(tiny_model, "", max_new_tokens=10, temperature=0)
    assert len(text) == 10
    assert text == greedy_by_full_recomputation(tiny_model, "\n", 10)[1:]


def test_prompt_with_unseen_characters_is_refused_by_name(tiny_model):
    with pytest.raises(gptlite.InputError, match="'QZ'"):
        gptlite.stream(tiny_model, "the Zebra Queen")


@pytest.mark.parametrize("settings,message", [
    (dict(temperature=-0.5), "temperature"), (dict(top_k=0), "top_k"), (dict(max_new_tokens=-1), "max_new_tokens"),
])
def test_bad_sampling_settings_are_refused_before_sampling(tiny_model, settings, message):
    with pytest.raises(gptlite.ConfigError, match=message):
        gptlite.stream(tiny_model, "the", **settings)


def test_unknown_prompt_characters_skipped_or_replaced(tiny_model):
    greedy = lambda prompt, **kw: gptlite.generate(tiny_model, prompt, max_new_tokens=8, temperature=0, **kw)
    assert greedy("the CAT", unknown="skip") == "the CAT" + greedy("the ")[len("the "):]
    assert greedy("the CAT", unknown="replace") == "the CAT" + greedy("the    ")[len("the    "):]
    with pytest.raises(gptlite.ConfigError, match="unknown"):
        gptlite.stream(tiny_model, "the", unknown="ignore")


def test_cached_logits_equal_full_forward_pass_at_every_step(tiny_model):
    rng = np.random.default_rng(0)
    ids = rng.integers(0, tiny_model.config.vocab_size, size=(3, 16)).astype("int32")
    full = keras.ops.convert_to_numpy(tiny_model(ids))
    logits, cache = tiny_model.call_with_cache(ids[:, :6], tiny_model.empty_cache(3), np.zeros(3, "int32"))
    steps = [keras.ops.convert_to_numpy(logits)]
    for t in range(6, 16):
        logits, cache = tiny_model.call_with_cache(ids[:, t:t + 1], cache, np.full(3, t, "int32"))
        steps.append(keras.ops.convert_to_numpy(logits))
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, atol=1e-5)


def test_batch_of_prompts_of_different_lengths_equals_each_alone(tiny_model):
    prompts = ["a", "the cat sat", "dog ran to the big red hat"]  # the last is longer than block_size
    together = gptlite.generate(tiny_model, prompts, max_new_tokens=30, temperature=0)
    assert together == [greedy_by_full_recomputation(tiny_model, p, 30) for p in prompts]


def test_greedy_with_cache_equals_recomputation_for_300_tokens(tiny_model):
    assert gptlite.generate(tiny_model, "the", max_new_tokens=300, temperature=0) == \
        greedy_by_full_recomputation(tiny_model, "the", 300)


def test_top_p_only_emits_tokens_of_the_nucleus(tiny_model):
    prompt = "the big"
    context = np.array([tiny_model.tokenizer.encode(prompt)], dtype="int32")
    probabilities = keras.ops.convert_to_numpy(keras.ops.softmax(tiny_model(context)[0, -1]))
    order = np.argsort(probabilities)[::-1]
    size = int(np.searchsorted(np.cumsum(probabilities[order]), 0.5) + 1)  # smallest set reaching 0.5
    nucleus = set(tiny_model.tokenizer.decode(order[:size]))
    firsts = {next(iter(gptlite.stream(tiny_model, prompt, 1, temperature=1.0, top_p=0.5, seed=s)))
              for s in range(40)}
    assert firsts <= nucleus


def test_sampler_filters_without_a_model():
    from gptlite.generation import sample_next_token

    logits = np.log(np.array([[0.5, 0.3, 0.15, 0.05]] * 2000, dtype="float32"))
    generator = keras.random.SeedGenerator(0)
    draw = lambda t, k, p: keras.ops.convert_to_numpy(
        sample_next_token(logits, np.array([t, k, p], "float32"), generator))
    assert set(draw(0.0, 4, 1.0)) == {0}
    assert set(draw(1.0, 2, 1.0)) == {0, 1}
    assert set(draw(1.0, 4, 0.7)) == {0, 1}  # 0.5 alone is short of 0.7; 0.5 + 0.3 reaches it
    assert set(draw(1.0, 4, 0.5)) == {0}
    counts = np.bincount(draw(1.0, 4, 1.0), minlength=4) / 2000
    np.testing.assert_allclose(counts, [0.5, 0.3, 0.15, 0.05], atol=0.04)


def test_top_p_outside_its_range_is_refused(tiny_model):
    for top_p in (0.0, 1.5):
        with pytest.raises(gptlite.ConfigError, match="top_p"):
            gptlite.stream(tiny_model, "the", top_p=top_p)


def test_interleaved_streams_each_repeat_their_seed(tiny_model):
    alone = gptlite.generate(tiny_model, "the", max_new_tokens=40, temperature=1.0, seed=11)
    first = gptlite.stream(tiny_model, "the", max_new_tokens=40, temperature=1.0, seed=11)
    second = gptlite.stream(tiny_model, "the", max_new_tokens=40, temperature=1.0, seed=12)
    pieces = []
    for a, _ in zip(first, second):
        pieces.append(a)
    assert "the" + "".join(pieces) == alone


def test_stop_string_ends_the_text_before_it_streamed_or_not(tiny_model):
    free = gptlite.generate(tiny_model, "the", max_new_tokens=80, temperature=0)
    continuation = free[len("the"):]
    stop = continuation[30:32]
    expected = "the" + continuation[: continuation.index(stop)]
    assert gptlite.generate(tiny_model, "the", max_new_tokens=80, temperature=0, stop=[stop, "never seen"]) \
        == expected
    streamed = list(gptlite.stream(tiny_model, "the", max_new_tokens=80, temperature=0, stop=stop))
    assert "the" + "".join(streamed) == expected
    assert all(stop not in piece for piece in streamed)


def test_held_back_text_is_released_unless_it_completes_a_stop():
    from gptlite.generation import _cut_at_stop

    pieces = iter(["ab", "c", "EN", "Dx", "y"])
    assert "".join(_cut_at_stop(pieces, ["END"])) == "abc"
    assert "".join(_cut_at_stop(iter(["a", "E", "N", "b"]), ["END"])) == "aENb"  # a near miss is released


def test_stop_in_a_batch_stops_each_row(tiny_model):
    prompts = ["the", "a dog"]
    free = gptlite.generate(tiny_model, prompts, max_new_tokens=60, temperature=0)
    stop = free[0][len("the"):][20:22]
    cut = gptlite.generate(tiny_model, prompts, max_new_tokens=60, temperature=0, stop=stop)
    for text, prompt, whole in zip(cut, prompts, free):
        continuation = whole[len(prompt):]
        end = continuation.find(stop)
        assert text == prompt + (continuation if end < 0 else continuation[:end])
