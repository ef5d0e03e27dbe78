"""What the page's Inside view is given, declared in Python: its steps, each naming a step of the forward pass it
needs, and the model's choices in words. A throwaway step and a throwaway architecture switch, each added where it is
declared, reach the trace, every analysis and the page's declarations with no other line written for them."""

import json

import keras
import numpy as np
import pytest
from keras import ops

import gptlite
from gptlite.inside import views
from gptlite.model import config as configs, hooks as hook_points, layers
from gptlite.model.attention import BLOCK_HEAD_WEIGHTS
from gptlite.model.hooks import seen
from gptlite.web import onnx_graph

TEXT = "the cat sat on the mat"


def test_every_view_needs_a_step_the_forward_pass_declares_and_the_page_is_given_them_all(tiny_model):
    declared = views.page_declarations(tiny_model.config)
    for step in declared["views"]:
        assert step.get("needs") is None or step["needs"] in hook_points.BLOCK_STEPS, step
    assert declared["block_steps"] == list(hook_points.BLOCK_STEPS) and declared["live"][0] == "temperature"
    assert declared["weight_steps"] == list(BLOCK_HEAD_WEIGHTS)  # what the page fetches once and keeps
    assert declared["choices"] == {"position": configs.POSITION_KINDS["learned"].does,
                                   "norm": configs.NORM_KINDS["layer"].does,
                                   "norm_position": configs.NORM_POSITION_KINDS["pre"].does,
                                   "mlp": configs.MLP_KINDS["gelu"].does,
                                   "tie_weights": configs.SWITCH_WORDS["tie_weights"][0]}
    modern = gptlite.GPTConfig(n_kv_head=2, qk_norm=True, tie_weights=False).choices_said()
    assert modern["qk_norm"].startswith("QK-norm") and modern["grouped_query"].startswith("grouped-query")
    assert modern["tie_weights"] == configs.SWITCH_WORDS["tie_weights"][1]


def test_a_throwaway_step_reaches_the_trace_and_the_pages_declarations(monkeypatch, tiny_model, tmp_path):
    # The step: one name declared with the others, one line of a layer that hands it over, one line of the view.
    monkeypatch.setattr(hook_points, "BLOCK_STEPS", (*hook_points.BLOCK_STEPS, "hidden_sign"))
    gelu = layers.FEED_FORWARD_KINDS["gelu"]

    def hidden(layer, expanded, hooks):
        made = gelu.hidden(layer, expanded, hooks)
        seen(hooks, "hidden_sign", ops.sign(made))
        return made

    monkeypatch.setitem(layers.FEED_FORWARD_KINDS, "gelu", layers.FeedForwardKind(hidden, 1))
    monkeypatch.setattr(views, "VIEW_STEPS", (*views.VIEW_STEPS, dict(id="hidden_sign", title="Signs", layer=True,
                                                                       needs="hidden_sign")))
    traced = gptlite.trace(tiny_model, TEXT)
    np.testing.assert_array_equal(traced.layers[1]["hidden_sign"], np.sign(traced.layers[1]["hidden"]))
    assert "hidden_sign" in traced.to_json()["layers"][0]
    declared = views.page_declarations(tiny_model.config)
    assert declared["views"][-1]["id"] == "hidden_sign" and "hidden_sign" in declared["block_steps"]
    gptlite.export_web(tiny_model, tmp_path / "site")
    config = json.loads((tmp_path / "site" / "config.json").read_text())
    assert config["inside"]["views"][-1] == {"id": "hidden_sign", "title": "Signs", "layer": True,
                                             "needs": "hidden_sign"}
    # Every analysis reads the same pass: a head knocked out, the scores, the lens.
    assert not np.any(gptlite.trace(tiny_model, TEXT, ablate=[(0, 1)]).layers[0]["heads"][1])
    assert gptlite.heads(tiny_model, TEXT, calibrate=False).ablation.shape == (2, 2)
    np.testing.assert_allclose(traced.logit_lens().sum(-1), 1, atol=1e-5)


def test_a_throwaway_feed_forward_kind_reaches_every_analysis_and_the_page_once_it_has_an_onnx_form(
        monkeypatch, tokenizer, tmp_path):
    # The kind: its choice (name and words), its computation, and, for the page, its ONNX form.
    monkeypatch.setitem(configs.MLP_KINDS, "relu", configs.Choice("ReLU", "ReLU: max(0, x)"))
    monkeypatch.setitem(layers.FEED_FORWARD_KINDS, "relu", layers.FeedForwardKind(
        lambda layer, expanded, hooks: ops.relu(seen(hooks, "expanded", expanded)), 1))
    keras.utils.set_random_seed(4)
    model = gptlite.GPT(vocab_size=tokenizer.vocabulary_size, tokenizer=tokenizer, n_layer=2, n_head=2, n_embd=16,
                        block_size=32, mlp="relu")
    model.build((None, 32))
    traced = gptlite.trace(model, TEXT)
    np.testing.assert_array_equal(traced.layers[0]["hidden"], np.maximum(traced.layers[0]["expanded"], 0))
    parts = traced.attribution(5, "a")
    assert parts.total() == pytest.approx(parts.logit, abs=1e-4)
    assert gptlite.heads(model, TEXT, calibrate=False).induction.shape == (2, 2)
    assert views.page_declarations(model.config)["choices"]["mlp"] == "ReLU: max(0, x)"
    assert "mlp (default 'gelu'; one of 'gelu', 'swiglu', 'relu2', 'relu')" in "\n".join(
        gptlite.setting.described(gptlite.GPTConfig, ["mlp"]))
    with pytest.raises(gptlite.ConfigError, match="no form of a ReLU feed-forward"):
        gptlite.export_web(model, tmp_path / "refused")
    assert not (tmp_path / "refused").exists()
    monkeypatch.setitem(onnx_graph.FEED_FORWARD_FORMS, "relu", lambda graph, expanded, keep: graph.node(
        "Relu", [keep(expanded, "expanded", unbatched=False)]))
    gptlite.export_web(model, tmp_path / "site")
    import onnxruntime

    session = onnxruntime.InferenceSession(str(tmp_path / "site" / "inside.onnx"), providers=["CPUExecutionProvider"])
    ones = np.ones((2, 2), np.float32)
    logits = session.run(["logits"], {"input_ids": traced.ids[None].astype(np.int64), "head_scale": ones})[0]
    assert np.abs(logits - traced.steps["logits"]).max() <= 1e-4 * np.abs(traced.steps["logits"]).max()
