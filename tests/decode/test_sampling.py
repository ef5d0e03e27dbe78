import keras
import numpy as np
import pytest

import gptlite
from gptlite.decode.sampling import RowSettings, sample_next_token, SamplingConfig, token_counts, uniform_noise

PROBABILITIES = np.array([0.5, 0.3, 0.15, 0.05], dtype="float32")


def draw(rows=2000, seen=None, **settings):
    """The sampler's tokens for `rows` rows of the same four-token distribution, each with its own noise."""
    logits = np.log(np.array([PROBABILITIES] * rows))
    noise = np.random.default_rng(0).random(logits.shape).astype("float32")
    settings = RowSettings.of([SamplingConfig(**settings)] * rows, 4)
    return keras.ops.convert_to_numpy(sample_next_token(logits, settings, noise, seen))


def test_sampler_filters_without_a_model():
    assert set(draw(temperature=0.0)) == {0}
    assert set(draw(top_k=2)) == {0, 1}
    # The nucleus keeps a token while the mass ranked above it is below p: here 0, 0.5, 0.8 and 0.95,
    # so each p below is at least 0.1 from every boundary, whatever the CPU's rounding.
    assert set(draw(top_p=0.7)) == {0, 1}
    assert set(draw(top_p=0.4)) == {0}
    # min_p keeps tokens at least that share of the likeliest's probability: 0.25 keeps 0.5 and 0.3 (0.6 and
    # 0.3 of it), not 0.15.
    assert set(draw(min_p=0.5)) == {0, 1}
    counts = np.bincount(draw(), minlength=4) / 2000
    np.testing.assert_allclose(counts, PROBABILITIES, atol=0.04)


def lowbias32(x):
    """The integer hash the noise is documented to be, in NumPy's uint32."""
    x = x.astype(np.uint32)
    x ^= x >> 16
    x *= np.uint32(0x7FEB352D)
    x ^= x >> 15
    x *= np.uint32(0x846CA68B)
    return x ^ (x >> 16)


def test_the_noise_is_a_hash_of_seed_index_and_token_the_same_on_every_backend():
    seeds = np.array([[0], [1], [2**31 - 1]], "int32")  # (3, 1), broadcast against 4 token indices
    indices = np.array([0, 1, 31, 10**6], "int32")
    noise = keras.ops.convert_to_numpy(uniform_noise(seeds, indices, 1000))  # (3, 4, 1000)
    key = lowbias32(lowbias32(seeds.astype(np.uint32)) ^ indices.astype(np.uint32))
    bits = lowbias32(key[..., None] ^ (np.arange(1000, dtype=np.uint32) * np.uint32(0x9E3779B9)))
    np.testing.assert_array_equal(noise, ((bits >> 8).astype("float32") + 0.5) / 2**24)
    assert noise.shape == (3, 4, 1000) and noise.min() > 0 and noise.max() < 1
    assert len(np.unique(noise)) > 0.99 * noise.size  # no two (seed, index) pairs share their noise
    assert abs(noise.mean() - 0.5) < 0.01 and abs((noise < 0.1).mean() - 0.1) < 0.01
    # Gumbel-max on it samples each token at its probability.
    logits = np.log(np.array([PROBABILITIES] * 4000))
    noise = keras.ops.convert_to_numpy(uniform_noise(np.arange(4000, dtype="int32"), np.int32(7), 4))
    settings = RowSettings.of([SamplingConfig()] * 4000, 4)
    counts = np.bincount(keras.ops.convert_to_numpy(sample_next_token(logits, settings, noise)), minlength=4)
    np.testing.assert_allclose(counts / 4000, PROBABILITIES, atol=0.03)


def test_a_repetition_penalty_makes_seen_tokens_rarer():
    seen = np.zeros((2000, 4), "float32")
    seen[:, 0] = 1  # the likeliest token is in every row's context
    free = np.bincount(draw(seen=seen), minlength=4)[0]
    penalised = np.bincount(draw(seen=seen, repetition_penalty=3.0), minlength=4)[0]
    assert penalised < free * 0.8


def test_rows_with_different_settings_are_each_sampled_by_their_own():
    logits = np.log(np.array([PROBABILITIES] * 3))
    noise = np.random.default_rng(1).random(logits.shape).astype("float32")
    configs = [SamplingConfig(temperature=0), SamplingConfig(top_k=1), SamplingConfig()]
    together = keras.ops.convert_to_numpy(sample_next_token(logits, RowSettings.of(configs, 4), noise))
    alone = [int(keras.ops.convert_to_numpy(sample_next_token(logits[i:i + 1], RowSettings.of(configs[i:i + 1], 4),
                                                                noise[i:i + 1]))[0]) for i in range(3)]
    assert list(together) == alone and together[0] == 0 and together[1] == 0


def test_token_counts_count_each_rows_real_tokens():
    window = np.array([[1, 1, 2, 3], [0, 3, 3, 3]], "int32")
    counts = keras.ops.convert_to_numpy(token_counts(window, np.array([3, 2], "int32"), 4))
    np.testing.assert_array_equal(counts, [[0, 2, 1, 0], [1, 0, 0, 1]])


@pytest.mark.parametrize("settings,name", [
    (dict(temperature=-1), "temperature"), (dict(temperature=float("nan")), "temperature"),
    (dict(top_k=0), "top_k"), (dict(top_k=2.5), "top_k"), (dict(top_p=0), "top_p"), (dict(top_p=1.5), "top_p"),
    (dict(min_p=-0.1), "min_p"), (dict(repetition_penalty=0), "repetition_penalty"),
    (dict(max_new_tokens=-1), "max_new_tokens"), (dict(seed="x"), "seed"), (dict(stop=[""]), "stop"),
    (dict(stop=7), "stop"), (dict(temperature=-10**400), "temperature"),
])
def test_a_bad_sampling_setting_is_refused_by_name(settings, name):
    with pytest.raises(gptlite.ConfigError, match=name) as refused:
        SamplingConfig(**settings)
    assert refused.value.setting == name


def test_a_config_is_one_frozen_value_whose_copies_are_checked():
    config = SamplingConfig(temperature=0.7, stop="\n")
    assert config.stop == ("\n",) and config.replace(top_k=5).top_k == 5 and config.top_k is None
    with pytest.raises(gptlite.ConfigError, match="temperature"):
        config.replace(temperature=-2)
    with pytest.raises(gptlite.ConfigError, match="unknown sampling setting 'temprature'"):
        config.replace(temprature=1)
    with pytest.raises(AttributeError):
        config.temperature = 2
