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
