"""Every combination of the architecture's switches (positions, norm, feed-forward, key/value heads, QK-norm,
biases, tied head, the norms before or after each sublayer) decodes with its cache as the whole forward pass computes, is causal, and saves and loads.

The combinations are a pairwise covering set: every value of each switch meets every value of every other;
one more has heads wider than n_embd / n_head."""

import functools

import keras
import numpy as np
import pytest

import gptlite
from conftest import assert_greedy

SWITCHES = ("position", "norm", "mlp", "n_kv_head", "qk_norm", "bias", "tie_weights", "head_dim", "norm_position")
COMBINATIONS = [
    ("learned", "layer", "gelu", 4, False, False, True),  # GPT-2's, the defaults
    ("rotary", "rms", "swiglu", 2, True, False, False),
    ("sinusoidal", "layer", "gelu", 1, True, True, False),
    ("learned", "rms", "swiglu", 1, False, True, True),
    ("rotary", "layer", "gelu", 2, False, True, True),
    ("sinusoidal", "rms", "swiglu", 4, False, False, False),
    ("learned", "layer", "swiglu", 4, True, True, True),
    ("learned", "rms", "gelu", 2, False, False, False),
    ("sinusoidal", "layer", "gelu", 2, False, False, True),
    ("rotary", "layer", "gelu", 1, False, False, True),
    ("rotary", "layer", "gelu", 4, False, False, True),
    ("learned", "layer", "relu2", 4, True, False, False),
    ("sinusoidal", "rms", "relu2", 2, False, True, True),
    ("rotary", "rms", "relu2", 1, True, True, False),
]
# Each combination's norm position, chosen so that post-norm meets every value of every switch above too.
NORM_POSITIONS = ["pre"] * 6 + ["post"] * 5 + ["pre", "post", "post"]
# Heads wider than n_embd / n_head (Qwen3's), with the modern switches.
WIDE_HEADS = ("rotary", "rms", "swiglu", 2, True, False, True, 8, "pre")
COMBINATIONS = [combination + (None, where) for combination, where in zip(COMBINATIONS, NORM_POSITIONS)] + \
    [WIDE_HEADS]
BLOCK_SIZE = 16


def _name(combination):
    return "-".join(f"{name}={value}" for name, value in zip(SWITCHES, combination))


@functools.cache
def _build(combination, vocabulary):
    keras.utils.set_random_seed(11)
    tokenizer = gptlite.CharTokenizer(vocabulary)
    model = gptlite.GPT(vocab_size=tokenizer.vocabulary_size, n_layer=2, n_head=4, n_embd=16, block_size=BLOCK_SIZE,
                        tokenizer=tokenizer, rope_theta=100.0, **dict(zip(SWITCHES, combination)))
    model.build((None, BLOCK_SIZE))
    rng = np.random.default_rng(0)
    for weight in model.weights:  # norms' scales and biases away from 1 and 0, so that each one counts
        weight.assign(keras.ops.convert_to_numpy(weight) + rng.normal(0, 0.1, weight.shape).astype("float32"))
    return model


@pytest.fixture(params=COMBINATIONS, ids=_name)
def model(request, tokenizer):
    return _build(request.param, tokenizer.vocabulary)


def _numpy(x):
    return keras.ops.convert_to_numpy(x)


def _ids(model, rows=2):
    return np.random.default_rng(1).integers(0, model.config.vocab_size, (rows, BLOCK_SIZE)).astype("int32")


def test_the_cache_holds_the_key_value_heads_only(model):
    cache = model.empty_cache(3)
    assert len(cache) == 2
    assert tuple(cache[0].shape) == (3, 2, model.config.kv_heads, BLOCK_SIZE, model.config.head_size)


def test_cached_decoding_equals_the_whole_forward_pass(model):
    ids = _ids(model)
    full = _numpy(model(ids))  # (B, T, V)
    prefill = 6
    logits, cache = model.call_with_cache(ids[:, :prefill], model.empty_cache(2), np.zeros(2, "int32"))
    np.testing.assert_allclose(_numpy(logits), full[:, :prefill], atol=1e-4)
    # Only the logits a prompt's rows choose from: row 0's after its 4th token, row 1's after its 6th.
    some, same_cache = model.call_with_cache(ids[:, :prefill], model.empty_cache(2), np.zeros(2, "int32"),
                                             logits_at=np.array([3, 5], "int32"))
    np.testing.assert_allclose(_numpy(some)[:, 0], full[[0, 1], [3, 5]], atol=1e-4)
    np.testing.assert_allclose(_numpy(same_cache[0]), _numpy(cache[0]), atol=1e-5)
    for position in range(prefill, BLOCK_SIZE - 2):
        logits, cache = model.call_with_cache(ids[:, position:position + 1], cache, np.full(2, position, "int32"))
        np.testing.assert_allclose(_numpy(logits)[:, 0], full[:, position], atol=1e-4)
    # Rows at positions of their own: row 0 writes its token at 13 again, row 1 moves on to 14.
    rows = np.array([[ids[0, 13]], [ids[1, 14]]], "int32")
    logits, _ = model.call_with_cache(rows, cache, np.array([13, 14], "int32"))
    np.testing.assert_allclose(_numpy(logits)[:, 0], full[[0, 1], [13, 14]], atol=1e-4)


def test_a_later_token_never_changes_an_earlier_positions_logits(model):
    ids = _ids(model, rows=1)
    changed = ids.copy()
    changed[0, 9:] = (changed[0, 9:] + 1) % model.config.vocab_size
    before, after = _numpy(model(ids)), _numpy(model(changed))
    np.testing.assert_allclose(after[0, :9], before[0, :9], atol=1e-6)
    assert np.abs(after[0, 9:] - before[0, 9:]).max() > 1e-4


def test_save_and_load_give_the_same_logits(model, tmp_path):
    model.save(tmp_path / "model.keras")
    loaded = keras.saving.load_model(tmp_path / "model.keras")
    assert loaded.config == model.config
    ids = _ids(model)
    np.testing.assert_allclose(_numpy(loaded(ids)), _numpy(model(ids)), atol=1e-6)


# Decoding through the library for GPT-2's layout, the most modern one and multi-query attention with
# rotary positions and post-norm blocks: the cache test above covers the rest; these compile decode loops, which
# takes seconds.
@pytest.mark.slow
@pytest.mark.parametrize("combination", [COMBINATIONS[0], COMBINATIONS[1], COMBINATIONS[9]], ids=_name)
def test_greedy_generation_through_the_library_follows_the_forward_pass(combination, tokenizer):
    model = _build(combination, tokenizer.vocabulary)
    text = gptlite.generate(model, "the cat", max_new_tokens=24, temperature=0.0)
    assert_greedy(model, "the cat", text)


def test_a_saved_post_norm_model_loads_and_writes_the_same_greedy_text(tokenizer, tmp_path):
    model = _build(COMBINATIONS[9], tokenizer.vocabulary)  # post-norm
    assert model.config.norm_position == "post"
    model.save(tmp_path / "model.keras")
    loaded = gptlite.load(tmp_path / "model.keras")
    assert loaded.config == model.config and loaded.final_norm is None
    written = gptlite.generate(loaded, "the cat", max_new_tokens=24, temperature=0.0)
    assert written == gptlite.generate(model, "the cat", max_new_tokens=24, temperature=0.0)
    assert_greedy(loaded, "the cat", written)


def test_attention_maps_are_causal_distributions(model):
    weights = _numpy(model.attention_weights(_ids(model, rows=1)))  # (L, B, H, T, T)
    assert weights.shape == (2, 1, 4, BLOCK_SIZE, BLOCK_SIZE)
    np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-5)
    assert np.all(np.triu(weights, k=1) == 0)


@pytest.mark.parametrize("norm_position", ["pre", "post"])
def test_a_seq2seq_model_with_the_modern_switches_decodes_with_its_cache_as_in_full(norm_position):
    keras.utils.set_random_seed(12)
    tokenizer = gptlite.CharTokenizer("abcdefgh", special_tokens=("pad", "start", "end"))
    switches = {**dict(zip(SWITCHES, COMBINATIONS[1])), "norm_position": norm_position}
    model = gptlite.Seq2Seq(vocab_size=tokenizer.vocabulary_size, n_layer=1, n_head=4, n_embd=16, block_size=10,
                            tokenizer=tokenizer, **switches)
    model.build()
    rng = np.random.default_rng(2)
    source = rng.integers(3, tokenizer.vocabulary_size, (2, 7)).astype("int32")
    source[1, 5:] = 0  # padding
    target = rng.integers(3, tokenizer.vocabulary_size, (2, 6)).astype("int32")
    full = _numpy(model({"source_ids": source, "target_ids": target}))
    mask = model.source_mask(source)
    cross = model.cross_key_values(model.encode(source, mask))
    cache = model.empty_cache(2)
    for position in range(6):
        logits, cache = model.call_with_cache(target[:, position:position + 1], cache, np.full(2, position, "int32"),
                                              cross, mask)
        np.testing.assert_allclose(_numpy(logits)[:, 0], full[:, position], atol=1e-4)
