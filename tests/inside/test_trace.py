"""gptlite.trace: every step of a GPT's forward pass, against the model's own forward pass, for each architecture
switch; the probabilities after the settings; a Seq2Seq's heads knocked out; the blocks kept and the size held;
the refusals. (Every analysis for every switch: test_switches.py.)"""

import keras
import numpy as np
import pytest

import gptlite
from conftest import REPO
from gptlite.decode.sampling import RowSettings, sample_next_token, uniform_noise
from gptlite.decode.settings import SamplingConfig
from gptlite.inside.trace import LAYER_STEPS, NEIGHBOURS, STEPS

FIXTURES = REPO / "tests" / "fixtures"
TEXT = "the cat sat on the mat, the hat"
SHORT = "the cat sat on the mat"  # in made_char.keras's vocabulary
# Each switch a trace must follow: the fixtures' models, and post-norm blocks with ReLU² built here.
SWITCHES = {
    "cpu: learned positions, LayerNorm, GELU": "made_char.keras",
    "laptop: rotary, RMSNorm, SwiGLU, grouped-query, QK-norm": "made_modern.keras",
    "sinusoidal positions, untied head": "gpt_sinusoidal_untied.keras",
    "BPE": "made_bpe.keras",
    "chat": "made_chat.keras",
    "LoRA": "made_lora.keras",
    "post-norm, ReLU squared": None,
}


def switch_model(name):
    if SWITCHES[name] is not None:
        return gptlite.load(FIXTURES / SWITCHES[name])
    tokenizer = gptlite.CharTokenizer.from_text(TEXT)
    keras.utils.set_random_seed(1)
    model = gptlite.GPT(vocab_size=tokenizer.vocabulary_size, tokenizer=tokenizer, n_layer=2, n_head=2, n_embd=16,
                        block_size=16, norm_position="post", mlp="relu2")
    model.build((None, 16))
    return model


@pytest.fixture(scope="module", params=sorted(SWITCHES))
def traced(request):
    model = switch_model(request.param)
    text = TEXT if not model.tokenizer.unknown_characters(TEXT) else "".join(
        c for c in TEXT if not model.tokenizer.unknown_characters(c))
    return model, gptlite.trace(model, text)


def test_a_trace_gives_the_models_own_logits_and_attention(traced):
    model, trace = traced
    ids = trace.ids[None]
    logits = keras.ops.convert_to_numpy(model(ids))[0]
    assert np.abs(trace.steps["logits"] - logits).max() <= 1e-5 * np.abs(logits).max()
    weights = keras.ops.convert_to_numpy(model.attention_weights(ids))[:, 0]  # (L, H, T, T)
    assert np.abs(np.stack([layer["attention"] for layer in trace.layers]) - weights).max() <= 1e-5
    # Each block's output is the next one's input, and the last one's the final norm's.
    for before, after in zip(trace.layers, trace.layers[1:]):
        assert np.array_equal(before["output"], after["input"])
    assert np.array_equal(trace.layers[0]["input"], trace.steps["embedding"])


def test_every_step_is_there_with_its_shape_and_softmax_rows_are_distributions(traced):
    model, trace = traced
    config = model.config
    length, heads, kv, size = len(trace.ids), config.n_head, config.kv_heads, config.head_size
    assert set(trace.steps) <= set(STEPS) and all(set(layer) <= set(LAYER_STEPS) for layer in trace.layers)
    assert ("rotary_angles" in trace.steps) == (config.position == "rotary")
    assert ("position" in trace.steps) == (config.position != "rotary")
    assert ("query_normed" in trace.layers[0]) == config.qk_norm
    assert ("attention_normed" in trace.layers[0]) == (config.norm_position == "pre")
    assert ("gate" in trace.layers[0]) == (config.mlp == "swiglu")
    layer = trace.layers[-1]
    assert layer["query"].shape == (heads, length, size) and layer["key"].shape == (kv, length, size)
    assert layer["scores"].shape == layer["attention"].shape == (heads, length, length)
    assert layer["joined"].shape == (length, heads * size)
    assert trace.steps["logits"].shape == (length, config.vocab_size)
    for layer in trace.layers:
        np.testing.assert_allclose(layer["attention"].sum(-1), 1, atol=1e-5)
        assert np.all(np.triu(layer["attention"], 1) == 0)  # masked entries exactly 0
        # The scores are q.k / sqrt(D), before the mask: the query head's against its key/value head's keys.
        query = layer.get("query_rotated", layer.get("query_normed", layer["query"]))
        key = np.repeat(layer.get("key_rotated", layer.get("key_normed", layer["key"])), heads // kv, axis=0)
        np.testing.assert_allclose(layer["scores"], query @ key.transpose(0, 2, 1) / np.sqrt(size), atol=1e-4)


def test_each_heads_weights_make_its_query_key_and_value_from_the_vector_attention_reads(traced):
    model, trace = traced
    config = model.config
    for layer in trace.layers:
        x = layer.get("attention_normed", layer["input"])  # (T, C): what attention reads, normed or not (post-norm)
        assert layer["query_weight"].shape == (config.n_head, config.n_embd, config.head_size)
        assert layer["key_weight"].shape == layer["value_weight"].shape == (config.kv_heads, config.n_embd,
                                                                            config.head_size)
        assert ("query_bias" in layer) == config.qkv_has_bias
        for part in ("query", "key", "value"):
            made = x @ layer[f"{part}_weight"]  # (H|K, T, D)
            if config.qkv_has_bias:
                made = made + layer[f"{part}_bias"][:, None]
            scale = np.abs(layer[part]).max()
            assert np.abs(made - layer[part]).max() <= 1e-5 * scale + 1e-6, part


def test_the_nearest_tokens_are_by_cosine_and_by_dot_product(traced):
    model, trace = traced
    table = keras.ops.convert_to_numpy(model.embedding.token_embedding.embeddings)
    vector = trace.steps["token_embedding"][2]
    assert np.array_equal(vector, table[trace.ids[2]])
    cosines = table @ vector / np.linalg.norm(table, axis=1) / np.linalg.norm(vector)
    found = trace.neighbours(2)
    assert len(found) == min(NEIGHBOURS, len(table)) and found[0][1] == pytest.approx(cosines.max(), abs=1e-5)
    assert [value for _, value in found] == sorted((value for _, value in found), reverse=True)
    assert np.allclose([cosines[i] for i, _ in found], [value for _, value in found], atol=1e-5)
    dots = [value for _, value in trace.neighbours(2, by="dot")]
    assert dots[0] == pytest.approx((table @ vector).max(), rel=1e-5)


def test_probabilities_after_the_settings_are_what_the_sampler_draws_from(traced):
    model, trace = traced
    position, vocabulary = 4, model.config.vocab_size
    plain = trace.probabilities(position)
    logits = trace.steps["logits"][position]
    np.testing.assert_allclose(plain, np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum(), atol=1e-6)
    assert trace.probabilities(position, {"temperature": 0}).tolist().count(1.0) == 1
    kept = trace.probabilities(position, SamplingConfig(temperature=0.7, top_k=3))
    assert np.count_nonzero(kept) == min(3, vocabulary) and kept.sum() == pytest.approx(1, abs=1e-5)
    # The sampler picks only what the distribution keeps.
    config = SamplingConfig(temperature=0.9, top_p=0.5, seed=3)
    kept = trace.probabilities(position, config)
    for index in range(20):
        token = sample_next_token(logits[None], RowSettings.of([config], vocabulary),
                                  uniform_noise([3], [index], vocabulary))
        assert kept[int(keras.ops.convert_to_numpy(token)[0])] > 0


def test_a_long_text_is_read_as_its_last_block_size_tokens_and_ids_are_taken_too():
    model = gptlite.load(FIXTURES / "made_char.keras")
    block, text = model.config.block_size, "the cat sat on the mat "
    long = gptlite.trace(model, text * 4)
    assert len(long.ids) == block and long.window_start == len(text) * 4 - block
    assert long.tokens == list((text * 4)[-block:])
    by_ids = gptlite.trace(model, [int(i) for i in model.tokenizer.encode(text)])
    assert by_ids.tokens == list(text)
    as_json = by_ids.to_json()
    assert as_json["layers"][0]["scores"]["dims"] == [model.config.n_head, len(text), len(text)]


def test_a_position_of_a_long_text_is_read_in_the_window_the_writer_read_it_in():
    model = gptlite.load(FIXTURES / "made_char.keras")
    block, text = model.config.block_size, "the cat sat on the mat " * 4
    early = gptlite.trace(model, text, position=3)  # within the first window: the text's first block_size tokens
    assert early.window_start == 0 and early.tokens == list(text[:block])
    later = gptlite.trace(model, text, position=block + 5)  # past it: the block_size tokens up to the position
    assert later.window_start == 6 and later.tokens == list(text[6:block + 6])
    # The writer read that window to write the next token: the position's logits are the plain trace's of that text.
    np.testing.assert_array_equal(later.steps["logits"][-1], gptlite.trace(model, text[:block + 6]).steps["logits"][-1])
    for wrong in (-1, len(text), 2.5):
        with pytest.raises(gptlite.InputError, match="position must be a whole number"):
            gptlite.trace(model, text, position=wrong)
    assert not {"query_weight", "key_bias"} & set(later.to_json(weights=False)["layers"][0])


def test_a_targets_trace_gives_the_seq2seqs_logits_and_every_attention():
    model = gptlite.load(FIXTURES / "made_seq2seq.keras")
    source = "12+345"
    trace = gptlite.trace_target(model, source)  # the target the model writes, greedily
    assert model.tokenizer.decode(trace.ids[1:]) == gptlite.generate_target(model, source)
    assert trace.source_tokens == list(source) and trace.tokens[0] == "<start>"
    inputs = {"source_ids": trace.source_ids[None].astype("int32"), "target_ids": trace.ids[None].astype("int32")}
    logits = keras.ops.convert_to_numpy(model(inputs))[0]
    assert np.abs(trace.steps["logits"] - logits).max() <= 1e-5 * np.abs(logits).max()
    weights = {part: keras.ops.convert_to_numpy(value)[:, 0] for part, value in model.attention_weights(inputs).items()}
    for part, layers, name in (("decoder", trace.layers, "attention"), ("cross", trace.layers, "cross_attention"),
                               ("encoder", trace.encoder_layers, "attention")):
        assert np.abs(np.stack([layer[name] for layer in layers]) - weights[part]).max() <= 1e-5, part
    assert trace.layers[0]["cross_attention"].shape == (model.config.n_head, len(trace.ids), len(source))
    np.testing.assert_allclose(trace.steps["encoded"], trace.encoder_layers[-1]["output"] if model.encoder_norm is None
                               else keras.ops.convert_to_numpy(model.encoder_norm(trace.encoder_layers[-1]["output"])),
                               atol=1e-6)
    given = gptlite.trace_target(model, source, "99")
    assert given.tokens == ["<start>", "9", "9"] and given.to_json()["source_ids"] == trace.source_ids.tolist()


def test_what_a_trace_cannot_follow_is_refused(tiny_seq2seq):
    model = gptlite.load(FIXTURES / "made_char.keras")
    with pytest.raises(gptlite.ConfigError, match="a trace follows a GPT"):
        gptlite.trace(tiny_seq2seq, "abc")
    with pytest.raises(gptlite.ConfigError, match="trace it with `trace`"):
        gptlite.trace_target(model, "the")
    with pytest.raises(gptlite.InputError, match="token ids must be"):
        gptlite.trace(model, [0, 10**6])
    with pytest.raises(gptlite.InputError, match="never saw"):
        gptlite.trace(model, "Ω")
    with pytest.raises(gptlite.ConfigError, match="expected a gptlite GPT"):
        gptlite.trace("model.keras", "abc")
    with pytest.raises(gptlite.ConfigError, match="by must be"):
        gptlite.trace(model, "the").neighbours(0, by="euclid")


def test_a_seq2seqs_heads_are_knocked_out_in_each_of_its_three_attentions():
    model = gptlite.load(FIXTURES / "made_seq2seq.keras")
    clean = gptlite.trace_target(model, "12+345", "357")
    for part, step, layers in (("decoder", "heads", "layers"), ("cross", "cross_heads", "layers"),
                               ("encoder", "heads", "encoder_layers")):
        ablated = gptlite.trace_target(model, "12+345", "357", ablate=[(1, 0, part)])
        assert not np.any(getattr(ablated, layers)[1][step][0]), part
        np.testing.assert_allclose(getattr(ablated, layers)[1][step][1], getattr(clean, layers)[1][step][1],
                                   atol=1e-6)
        assert np.abs(ablated.steps["logits"] - clean.steps["logits"]).max() > 1e-5, part
        assert ablated.to_json()["ablated"] == [[1, 0, part]]
    parts = clean.attribution(2, "5")
    assert parts.cross_heads.shape == (model.config.n_layer, model.config.n_head)
    assert parts.total() == pytest.approx(parts.logit, abs=1e-4 * max(1, abs(parts.logit)))
    np.testing.assert_allclose(clean.logit_lens()[-1].sum(-1), 1, atol=1e-5)


def test_a_trace_keeps_the_blocks_asked_for_and_refuses_one_past_its_size(monkeypatch):
    from gptlite.inside import trace as tracing

    model = gptlite.load(FIXTURES / "made_char.keras")
    some = gptlite.trace(model, SHORT, layers=[1])
    assert some.layers[0] == {} and set(some.layers[1]) == set(gptlite.trace(model, SHORT).layers[1])
    np.testing.assert_array_equal(some.steps["logits"], gptlite.trace(model, SHORT).steps["logits"])
    with pytest.raises(gptlite.ConfigError, match="every block"):
        some.logit_lens()
    monkeypatch.setattr(tracing, "MOST_TRACE_NUMBERS", 10_000)
    with pytest.raises(gptlite.errors.TooLargeError, match="keep fewer blocks ..layers.."):
        gptlite.trace(model, SHORT)


def test_heads_and_layers_the_model_lacks_are_refused_naming_the_range():
    model = gptlite.load(FIXTURES / "made_char.keras")
    for ablate, message in (([(2, 0)], "no layer 2: this model's layers are 0 to 1"),
                            ([(0, 5)], "no head 5: this model's heads are 0 to 1"),
                            ([(0, 0, "cross")], "attention is decoder; there is no 'cross' head"),
                            ([(0,)], r"name a head as \(layer, head\)"), ([(0.5, 1)], "whole numbers")):
        with pytest.raises(gptlite.InputError, match=message):
            gptlite.trace(model, SHORT, ablate=ablate)
    with pytest.raises(gptlite.ConfigError, match="ablation must be one of zero, mean"):
        gptlite.trace(model, SHORT, ablate=[(0, 0)], ablation="half")
    with pytest.raises(gptlite.InputError, match="no layer 3"):
        gptlite.trace(model, SHORT, layers=[3])
    with pytest.raises(gptlite.InputError, match="no position 99"):
        gptlite.trace(model, SHORT).attribution(99, "a")
