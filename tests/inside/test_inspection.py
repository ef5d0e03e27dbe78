"""Attention maps, token reports and position pictures, from the models' own layers."""

import json
import struct

import keras
import numpy as np
import pytest

import gptlite
from gptlite.errors import ConfigError, InputError
from gptlite.inside import inspection
from gptlite.model.attention import merge_heads
from gptlite.model.positions import sinusoidal_position_encoding

PROMPT = "the cat sat"


def png_size(path):
    """(width, height) of a PNG file, from its header; fails on anything else."""
    header = path.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n" and header[12:16] == b"IHDR"
    return struct.unpack(">II", header[16:24])


@pytest.fixture(scope="module")
def gpt_maps(tiny_model):
    return inspection.attention_maps(tiny_model, PROMPT)


def test_gpt_maps_are_causal_distributions_over_the_prompt(gpt_maps):
    weights, tokens = gpt_maps
    assert weights.shape == (2, 2, len(PROMPT), len(PROMPT))
    assert tokens == list(PROMPT) and gpt_maps.key_tokens == tokens and gpt_maps.causal
    np.testing.assert_allclose(weights.sum(axis=-1), 1.0, atol=1e-5)
    assert np.all(np.triu(weights, k=1) == 0)
    rows, columns = np.tril_indices(len(PROMPT))
    assert np.all(weights[..., rows, columns] > 0)


def test_maps_are_the_weights_the_attention_layer_uses(tiny_model, gpt_maps):
    # Applied to the first block's values, the maps give that block's
    # attention output as training computes it (the fused path where it is taken).
    ids = tiny_model.tokenizer.encode(PROMPT).astype("int32")[None]
    block = tiny_model.blocks[0]
    normed = block.attention_norm(tiny_model.embedding(ids))
    _, _, values = block.attention._project(normed, None)  # (1, T, H, D)
    values = keras.ops.transpose(values, (0, 2, 1, 3))  # (1, H, T, D)
    attended = merge_heads(keras.ops.matmul(gpt_maps.weights[0][None], values))
    rebuilt = block.attention.output_projection(attended)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(rebuilt),
                               keras.ops.convert_to_numpy(block.attention(normed)), atol=1e-5)


def test_a_prompt_longer_than_the_context_is_read_as_its_last_window(tiny_model):
    prompt = "the cat sat on a mat and the dog ran"  # 36 characters; block_size 16
    maps = inspection.attention_maps(tiny_model, prompt)
    assert maps.tokens == list(prompt[-16:]) and maps.weights.shape[-1] == 16


def test_prompt_mistakes_are_refused(tiny_model):
    with pytest.raises(InputError, match="at least one token"):
        inspection.attention_maps(tiny_model, "")
    with pytest.raises(InputError, match="never saw"):
        inspection.attention_maps(tiny_model, "the Zebra")
    assert inspection.attention_maps(tiny_model, "the Zebra", unknown="skip").tokens == list("the ebra")
    with pytest.raises(ConfigError, match="only causal self-attention"):
        inspection.attention_maps(tiny_model, PROMPT, part="cross")


def test_bpe_tokens_are_shown_as_their_text_pieces(text):
    bpe = gptlite.BPETokenizer.train([text] * 2, 300)
    model = gptlite.GPT(vocab_size=bpe.vocabulary_size, n_layer=1, n_head=2, n_embd=16, block_size=16,
                        tokenizer=bpe)
    prompt = "the cat sat on a mat"
    maps = inspection.attention_maps(model, prompt)
    assert "".join(maps.tokens) == prompt
    assert len(maps.tokens) < len(prompt) and maps.weights.shape[-1] == len(maps.tokens)


def test_seq2seq_maps_for_each_part(tiny_seq2seq):
    source, target = "abcde", "edc"
    encoder = inspection.attention_maps(tiny_seq2seq, source, part="encoder", target=target)
    decoder = inspection.attention_maps(tiny_seq2seq, source, part="decoder", target=target)
    cross = inspection.attention_maps(tiny_seq2seq, source, part="cross", target=target)
    assert encoder.weights.shape == (2, 2, 5, 5) and encoder.tokens == encoder.key_tokens == list(source)
    assert decoder.weights.shape == (2, 2, 4, 4) and decoder.tokens == ["<start>", *target]
    assert cross.weights.shape == (2, 2, 4, 5) and cross.tokens == decoder.tokens and cross.key_tokens == list(source)
    for maps in (encoder, decoder, cross):
        np.testing.assert_allclose(maps.weights.sum(axis=-1), 1.0, atol=1e-5)
    assert np.all(np.triu(decoder.weights, k=1) == 0)
    assert np.all(encoder.weights > 0)  # every source token sees every other, later ones too


def test_seq2seq_maps_follow_the_models_own_target_by_default(reverser):
    maps = inspection.attention_maps(reverser, "abcd")  # cross-attention by default
    assert maps.part == "cross"
    assert maps.tokens == ["<start>", *gptlite.generate_target(reverser, "abcd")]


def test_token_report_gives_the_models_probabilities_and_earlier_tokens(tiny_model):
    report = inspection.token_report(tiny_model, PROMPT, top=3)
    json.dumps(report)  # plain data
    ids = tiny_model.tokenizer.encode(PROMPT).astype("int32")[None]
    probabilities = keras.ops.convert_to_numpy(keras.ops.softmax(tiny_model(ids)[0]))
    assert [row["token"] for row in report["positions"]] == list(PROMPT)
    for position, row in enumerate(report["positions"]):
        expected = np.sort(probabilities[position])[::-1][:3]
        np.testing.assert_allclose([c["probability"] for c in row["next"]], expected, rtol=1e-5)
        assert len(row["attention"]) == 2  # one list per layer
        for attended in row["attention"]:
            assert len(attended) == min(3, position + 1)
            assert all(a["position"] <= position and a["token"] == PROMPT[a["position"]] for a in attended)
            weights = [a["weight"] for a in attended]
            assert weights == sorted(weights, reverse=True)
    with pytest.raises(ConfigError, match="top"):
        inspection.token_report(tiny_model, PROMPT, top=0)


def test_seq2seq_token_report_attends_to_the_source(tiny_seq2seq):
    report = inspection.token_report(tiny_seq2seq, "abc", top=2, target="cb")
    assert report["part"] == "cross" and report["attended_tokens"] == list("abc")
    assert [row["token"] for row in report["positions"]] == ["<start>", "c", "b"]
    assert all(a["token"] in "abc" for row in report["positions"] for layer in row["attention"] for a in layer)


@pytest.mark.parametrize("position", ["learned", "sinusoidal"])
def test_position_encoding_is_the_embeddings_table(tokenizer, position):
    model = gptlite.GPT(vocab_size=tokenizer.vocabulary_size, n_layer=1, n_head=2, n_embd=16, block_size=12,
                        position=position, tokenizer=tokenizer)
    table = inspection.position_encoding(model)
    assert table.shape == (12, 16)
    if position == "sinusoidal":
        np.testing.assert_allclose(table, sinusoidal_position_encoding(12, 16), atol=1e-6)
    else:
        np.testing.assert_array_equal(table, keras.ops.convert_to_numpy(model.embedding.position_embeddings))


def test_rotary_positions_are_drawn_as_angles_whose_similarity_depends_on_distance_alone(tokenizer, tmp_path):
    model = gptlite.GPT(vocab_size=tokenizer.vocabulary_size, n_layer=1, n_head=2, n_embd=16, block_size=12,
                        position="rotary", tokenizer=tokenizer)
    table = inspection.position_encoding(model)
    assert table.shape == (12, 8)  # positions, head size
    np.testing.assert_allclose(table[0], [1, 1, 1, 1, 0, 0, 0, 0], atol=1e-6)  # position 0 turns nothing
    unit = table / np.linalg.norm(table, axis=1, keepdims=True)
    similarity = unit @ unit.T
    np.testing.assert_allclose(np.diagonal(similarity, 3)[1:], np.diagonal(similarity, 3)[:-1], atol=1e-5)
    inspection.plot_positions(model, tmp_path / "rotary.png")
    assert png_size(tmp_path / "rotary.png")[0] > 600


def test_attention_figures_are_pngs_of_sensible_size(tmp_path, gpt_maps):
    grid, one = tmp_path / "grid.png", tmp_path / "one.png"
    inspection.plot_attention(gpt_maps, grid)
    inspection.plot_attention(gpt_maps, one, layer=1, head=0)
    grid_width, grid_height = png_size(grid)
    one_width, one_height = png_size(one)
    assert 400 <= grid_width <= 3000 and 400 <= grid_height <= 3000
    assert 400 <= one_width <= 2000 and 400 <= one_height <= 2000
    assert grid.stat().st_size > 10_000 and one.stat().st_size > 5_000


def test_attention_figure_layout(gpt_maps, tiny_seq2seq):
    figure = inspection.plot_attention(gpt_maps)
    maps_axes = [axes for axes in figure.axes if axes.get_title()]
    assert [axes.get_title() for axes in maps_axes] == [f"layer {l}, head {h}" for l in range(2) for h in range(2)]
    labels = [label.get_text() for label in maps_axes[0].get_yticklabels()]
    assert labels == ["t", "h", "e", "\u2423", "c", "a", "t", "\u2423", "s", "a", "t"]  # spaces made visible
    image = maps_axes[0].get_images()[0].get_array()
    assert image.mask[0, 1] and not image.mask[1, 0]  # the causal upper triangle is left empty

    cropped = inspection.plot_attention(gpt_maps, layer=0, max_tokens=4)
    cropped_axes = [axes for axes in cropped.axes if axes.get_title()]
    assert len(cropped_axes) == 2
    assert [label.get_text() for label in cropped_axes[0].get_xticklabels()] == ["\u2423", "s", "a", "t"]
    assert "the last 4 of 11 tokens" in cropped._suptitle.get_text()

    cross = inspection.plot_attention(inspection.attention_maps(tiny_seq2seq, "abc", target="cb"), head=1)
    cross_axes = [axes for axes in cross.axes if axes.get_title()]
    assert [label.get_text() for label in cross_axes[0].get_xticklabels()] == list("abc")
    assert not np.ma.getmaskarray(cross_axes[0].get_images()[0].get_array()).any()


def test_figure_mistakes_are_refused(tmp_path, gpt_maps, tiny_model):
    with pytest.raises(ConfigError, match="layer must be from 0 to 1"):
        inspection.plot_attention(gpt_maps, layer=2)
    with pytest.raises(InputError, match="must end in .png"):
        inspection.plot_attention(gpt_maps, tmp_path / "attention.jpg")
    with pytest.raises(InputError, match="does not exist"):
        inspection.plot_positions(tiny_model, tmp_path / "missing" / "positions.png")


def test_position_figure_and_svg(tmp_path, tiny_model):
    inspection.plot_positions(tiny_model, tmp_path / "positions.png")
    width, height = png_size(tmp_path / "positions.png")
    assert 800 <= width <= 2000 and 300 <= height <= 1000
    inspection.plot_positions(tiny_model, tmp_path / "positions.svg")
    assert b"<svg" in (tmp_path / "positions.svg").read_bytes()[:1000]
