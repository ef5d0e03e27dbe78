import json
import re

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


@pytest.mark.parametrize("shape", [{}, {"position": "rotary", "n_kv_head": 1, "qk_norm": True}])
def test_a_packed_row_reads_each_text_as_if_it_were_alone(tokenizer, shape):
    # Each text's positions counted from its start, and nothing attended across texts: a packed row gives each
    # text the logits it gets alone (learned positions; rotary with grouped queries, the chat defaults' kind).
    keras.utils.set_random_seed(0)
    model = gptlite.GPT(vocab_size=tokenizer.vocabulary_size, n_layer=2, n_head=2, n_embd=16, block_size=16,
                        tokenizer=tokenizer, **shape)
    model.build((None, 16))
    random = np.random.default_rng(1)
    texts = [random.integers(0, tokenizer.vocabulary_size, size=length) for length in (5, 7, 4)]
    row = {"token_ids": np.concatenate(texts)[None].astype("int32"),
           "positions": np.concatenate([np.arange(len(text)) for text in texts])[None].astype("int32")}
    packed = keras.ops.convert_to_numpy(model(row))
    plain = logits_of(model, row["token_ids"])  # one text of 16 tokens
    start = 0
    for text in texts:
        alone = logits_of(model, text[None])
        np.testing.assert_allclose(packed[:, start:start + len(text)], alone, atol=1e-4)
        if start:  # read as one text, the later ones see the earlier
            assert not np.allclose(plain[:, start:start + len(text)], alone, atol=1e-4)
        start += len(text)


@pytest.mark.parametrize("field,value", [("n_head", 3), ("n_layer", 0), ("dropout", 1.0), ("position", "alibi"),
                                         ("norm", "batch"), ("norm_position", "middle"), ("mlp", "relu"),
                                         ("n_kv_head", 3), ("rope_theta", 0), ("block_size", -4)])
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


@pytest.mark.slow
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
    # Not bit-equal: a process's kernels may split sums differently; a wrong weight moves logits by far more.
    np.testing.assert_allclose(np.load(tmp_path / "logits.npy"), expected, rtol=1e-4, atol=1e-5)


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



def test_each_use_is_refused_in_its_declared_words_to_the_kinds_that_do_not_serve_it(tiny_model, tiny_seq2seq):
    from gptlite.model.gpt import check_use, MODELS, USES

    assert set().union(*(kind.uses for kind in MODELS)) == {use for use, words in USES.items() if words}
    words = {"form": "a file", "source": "it"}
    for use, refusal in USES.items():
        for model in (tiny_model, tiny_seq2seq):
            if refusal is None or use in model.uses:
                assert check_use(model, use) is model
            else:
                written = refusal.format(model=type(model).__name__, **words)
                with pytest.raises(gptlite.ConfigError, match=f"^{re.escape(written)}$"):
                    check_use(model, use, **words)
        with pytest.raises(gptlite.ConfigError, match="^expected a gptlite (GPT|Seq2Seq|GPT or Seq2Seq), got str$"):
            check_use("model.keras", use)
    with pytest.raises(gptlite.InputError, match="^mine$"):
        check_use(None, "be loaded", gptlite.InputError("mine"))


# --- Seq2Seq


def seq2seq_logits(model, source_ids, target_ids, source_mask=None):
    inputs = {"source_ids": np.asarray(source_ids, "int32"), "target_ids": np.asarray(target_ids, "int32")}
    if source_mask is not None:
        inputs["source_mask"] = np.asarray(source_mask)
    return keras.ops.convert_to_numpy(model(inputs))


def test_seq2seq_encoder_sees_the_whole_source(tiny_seq2seq):
    source = np.array([[3, 4, 5, 6, 7, 3, 0, 0]])
    encoded = lambda ids: keras.ops.convert_to_numpy(  # noqa: E731
        tiny_seq2seq.encode(ids, tiny_seq2seq.source_mask(ids)))
    changed = source.copy()
    changed[0, 5] = 4  # the last real token
    difference = np.abs(encoded(changed) - encoded(source))[0]
    assert difference[:5].max() > 1e-4  # earlier positions see it: not causal


def test_seq2seq_decoder_is_causal_and_reads_the_source(tiny_seq2seq):
    source, target = np.array([[3, 4, 5, 0]]), np.array([[1, 6, 7, 3, 5]])
    reference = seq2seq_logits(tiny_seq2seq, source, target)
    assert reference.shape == (1, 5, tiny_seq2seq.config.vocab_size)
    later_changed = target.copy()
    later_changed[0, 3:] = [6, 6]
    logits = seq2seq_logits(tiny_seq2seq, source, later_changed)
    np.testing.assert_array_equal(logits[:, :3], reference[:, :3])
    assert not np.allclose(logits[:, 3:], reference[:, 3:])
    other_source = seq2seq_logits(tiny_seq2seq, [[7, 4, 5, 0]], target)
    assert np.abs(other_source - reference).max() > 1e-4


def test_seq2seq_ignores_what_padded_source_positions_hold(tiny_seq2seq):
    source = np.array([[3, 4, 5, 0, 0, 0], [6, 7, 0, 0, 0, 0]])
    target = np.array([[1, 5, 4], [1, 7, 6]])
    mask = source != 0
    reference = seq2seq_logits(tiny_seq2seq, source, target)
    filled = np.where(mask, source, np.random.default_rng(0).integers(3, 8, size=source.shape))
    np.testing.assert_allclose(seq2seq_logits(tiny_seq2seq, filled, target, mask), reference, atol=1e-6)
    assert not np.allclose(seq2seq_logits(tiny_seq2seq, filled, target), reference)  # as real tokens, they count


def test_seq2seq_needs_pad_start_and_end_tokens(tokenizer):
    with pytest.raises(gptlite.ConfigError, match="pad"):
        gptlite.Seq2Seq(vocab_size=tokenizer.vocabulary_size, tokenizer=tokenizer)


LOAD_SEQ2SEQ_AND_PRINT = """
import sys, numpy as np, keras, gptlite
model = gptlite.load(sys.argv[1])
source = model.tokenizer.encode(sys.argv[2])[None, :].astype("int32")
target = np.array([[model.tokenizer.start_token_id, 3, 4]], "int32")
np.save(sys.argv[3], keras.ops.convert_to_numpy(model({"source_ids": source, "target_ids": target})))
print(type(model).__name__, gptlite.generate_target(model, sys.argv[2]))
"""


@pytest.mark.slow
def test_seq2seq_save_and_load_in_a_fresh_process(tmp_path, reverser):
    path = tmp_path / "model.keras"
    gptlite.save(reverser, path)
    result = run_python("-c", LOAD_SEQ2SEQ_AND_PRINT, str(path), "abcd", str(tmp_path / "logits.npy"))
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["Seq2Seq", gptlite.generate_target(reverser, "abcd")]
    source = reverser.tokenizer.encode("abcd")[None, :]
    expected = seq2seq_logits(reverser, source, [[reverser.tokenizer.start_token_id, 3, 4]])
    np.testing.assert_allclose(np.load(tmp_path / "logits.npy"), expected, rtol=1e-4, atol=1e-5)


def test_training_flops_per_token_follow_nanogpts_estimate(tiny_model):
    config = tiny_model.config  # 2 layers of width 16, context 16, no biases, tied head
    C, T, L, V = config.n_embd, config.block_size, config.n_layer, config.vocab_size
    # Token table, then per block: two norms' scales, the fused qkv, the output projection, the feed-forward.
    weights = V * C + L * (2 * C + 3 * C * C + C * C + 2 * 4 * C * C) + C
    assert tiny_model.training_flops_per_token() == 6 * weights + 12 * L * C * T
