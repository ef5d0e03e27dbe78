import json

import keras
import numpy as np
import pytest

import gptlite
from conftest import run_python


def logits_of(model, ids):
    return keras.ops.convert_to_numpy(model(np.asarray(ids, dtype="int32")))


def test_logits_shape_and_dtype(tiny_model, tokenizer):
    logits = tiny_model(np.zeros((3, 16), "int32"))
    assert tuple(logits.shape) == (3, 16, tokenizer.vocabulary_size)
    assert keras.backend.standardize_dtype(logits.dtype) == "float32"


def test_changing_later_tokens_leaves_earlier_outputs_unchanged(tiny_model, tokenizer):
    rng = np.random.default_rng(0)
    ids = rng.integers(0, tokenizer.vocabulary_size, size=(2, 16))
    reference = logits_of(tiny_model, ids)
    for t in (0, 5, 14):
        changed = ids.copy()
        changed[:, t + 1:] = rng.integers(0, tokenizer.vocabulary_size, size=(2, 15 - t))
        assert not np.array_equal(changed, ids)
        logits = logits_of(tiny_model, changed)
        np.testing.assert_array_equal(logits[:, : t + 1], reference[:, : t + 1])
        assert not np.allclose(logits[:, t + 1:], reference[:, t + 1:])


def test_attention_weights_are_causal_distributions(tiny_model):
    weights = keras.ops.convert_to_numpy(tiny_model.attention_weights(np.arange(12)[None, :] % 5))
    assert weights.shape == (2, 1, 2, 12, 12)  # (layers, B, H, T, T)
    np.testing.assert_allclose(weights.sum(axis=-1), 1.0, atol=1e-6)
    assert np.all(np.triu(weights, k=1) == 0)


@pytest.mark.parametrize("field,value", [("n_head", 3), ("n_layer", 0), ("dropout", 1.0), ("position", "rotary"),
                                         ("block_size", -4)])
def test_config_rejects_impossible_values(field, value):
    with pytest.raises(gptlite.ConfigError, match=field):
        gptlite.GPTConfig(**{"n_embd": 16, "n_head": 2, field: value})


def test_divisibility_error_suggests_head_counts():
    with pytest.raises(gptlite.ConfigError, match=r"n_embd \(100\) must be divisible by n_head \(3\); try n_head 2 or 4"):
        gptlite.GPTConfig(n_embd=100, n_head=3)


def test_tokenizer_must_match_vocab_size(tokenizer):
    with pytest.raises(gptlite.ConfigError, match="vocab_size"):
        gptlite.GPT(vocab_size=tokenizer.vocabulary_size + 1, tokenizer=tokenizer)


def test_config_round_trip_keeps_every_setting_and_the_tokenizer(tokenizer):
    config = gptlite.GPTConfig(vocab_size=tokenizer.vocabulary_size, n_layer=1, n_head=2, n_embd=8,
                               block_size=8, dropout=0.1, bias=True, tie_weights=False, position="sinusoidal",
                               attention_dropout=0.05)
    model = gptlite.GPT.from_gpt_config(config, tokenizer)
    serialized = json.loads(json.dumps(model.get_config()))
    clone = gptlite.GPT.from_config(serialized)
    assert clone.config == config
    assert clone.tokenizer.vocabulary == tokenizer.vocabulary


LOAD_AND_PRINT = """
import sys, numpy as np, keras, gptlite
model = keras.saving.load_model(sys.argv[1])
ids = model.tokenizer.encode(sys.argv[2])[None, :].astype("int32")
np.save(sys.argv[3], keras.ops.convert_to_numpy(model(ids)))
print(type(model).__name__, model.tokenizer.vocabulary == sys.argv[4], model.config.position, model.config.bias)
"""


def test_save_and_load_in_a_fresh_process_gives_identical_logits(tmp_path, tokenizer):
    keras.utils.set_random_seed(3)
    # Untied, sinusoidal and biased: every optional weight is in the file.
    model = gptlite.GPT(vocab_size=tokenizer.vocabulary_size, n_layer=2, n_head=2, n_embd=8, block_size=16,
                        bias=True, tie_weights=False, position="sinusoidal", tokenizer=tokenizer)
    model.build((None, 16))
    path = tmp_path / "model.keras"
    gptlite.save(model, path)
    prompt = "the cat sat on"

    result = run_python("-c", LOAD_AND_PRINT, str(path), prompt, str(tmp_path / "logits.npy"), tokenizer.vocabulary)

    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["GPT", "True", "sinusoidal", "True"]
    expected = logits_of(model, tokenizer.encode(prompt)[None, :])
    np.testing.assert_array_equal(np.load(tmp_path / "logits.npy"), expected)


def test_load_gives_clear_errors_for_files_that_are_not_gptlite_models(tmp_path):
    with pytest.raises(gptlite.MissingFileError, match="no such model file"):
        gptlite.load(tmp_path / "absent.keras")
    not_zip = tmp_path / "notes.keras"
    not_zip.write_text("hello")
    with pytest.raises(gptlite.InputError, match="not a .keras model file"):
        gptlite.load(not_zip)
    other = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    other.save(tmp_path / "other.keras")
    with pytest.raises(gptlite.InputError, match="not a gptlite model"):
        gptlite.load(tmp_path / "other.keras")
