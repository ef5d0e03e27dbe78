"""Every analysis for every architecture switch (the architecture tests' covering set of combinations, a LoRA-tuned
model and a chat model): an ablated trace against an edit made by hand with keras.ops, head scores, patching, the
logit lens and attribution. The suite runs under each backend."""

import keras
import numpy as np
import pytest

import gptlite
from conftest import REPO
from gptlite.model.hooks import Hooks
from test_architectures import _build, _name, COMBINATIONS

FIXTURES = REPO / "tests" / "fixtures"
SAVED = {"LoRA": "made_lora.keras", "chat": "made_chat.keras"}


@pytest.fixture(params=[*COMBINATIONS, *SAVED], ids=lambda param: param if isinstance(param, str) else _name(param))
def model(request, tokenizer):
    if isinstance(request.param, str):
        return gptlite.load(FIXTURES / SAVED[request.param])
    return _build(request.param, tokenizer.vocabulary)


def _ids(model, length=14, seed=1):
    return np.random.default_rng(seed).integers(0, model.config.vocab_size, length).astype("int32")


def _numpy(x):
    return np.asarray(keras.ops.convert_to_numpy(x), np.float64)


@pytest.mark.parametrize("ablation", ["zero", "mean"])
def test_an_ablated_trace_is_the_model_with_that_heads_values_replaced_by_hand(model, ablation):
    ids, layer, head = _ids(model), model.config.n_layer - 1, model.config.n_head - 1
    traced = gptlite.trace(model, ids, ablate=[(layer, head)], ablation=ablation)

    def by_hand(values):  # (B, H, T, D): the head's values zeroed, or each replaced by their mean over T
        parts = [values[:, h:h + 1] for h in range(values.shape[1])]
        replaced = parts[head] * 0 if ablation == "zero" else \
            keras.ops.broadcast_to(keras.ops.mean(parts[head], axis=2, keepdims=True), keras.ops.shape(parts[head]))
        return keras.ops.concatenate(parts[:head] + [replaced] + parts[head + 1:], axis=1)

    expected = _numpy(model(ids[None], hooks=Hooks(edits={f"layer_{layer}.heads": by_hand})))[0]
    scale = np.abs(expected).max()
    assert np.abs(traced.steps["logits"] - expected).max() <= 1e-5 * scale
    clean = gptlite.trace(model, ids)
    assert np.abs(clean.steps["logits"] - traced.steps["logits"]).max() > 1e-4 * scale
    # The other heads of the layer, those sharing the ablated head's key/value head too, are as before.
    others = [h for h in range(model.config.n_head) if h != head]
    np.testing.assert_allclose(traced.layers[layer]["heads"][others], clean.layers[layer]["heads"][others], atol=1e-6)
    assert traced.ablated == ((layer, head, "decoder"),)


def test_head_scores_are_shares_of_attention_and_ablation_is_the_loss_it_costs(model):
    report = gptlite.heads(model, _ids(model).tolist(), calibrate=False)
    shape = (model.config.n_layer, model.config.n_head)
    for pattern in ("previous_token", "first_token", "current_token", "induction"):
        scores = getattr(report, pattern)
        assert scores.shape == shape and np.all((scores >= -1e-9) & (scores <= 1 + 1e-9)), pattern
    assert report.ablation.shape == shape and np.all(np.isfinite(report.ablation))
    assert np.abs(report.ablation).max() > 1e-6  # knocking a head out changes the loss


def test_patching_the_one_position_where_two_texts_differ_restores_everything(model):
    clean = _ids(model)
    corrupted = clean.copy()
    corrupted[6] = (corrupted[6] + 1) % model.config.vocab_size
    logits = _numpy(model(clean[None]))[0, -1]
    answer, wrong = int(np.argmax(logits)), int(np.argmin(logits))
    found = gptlite.patching(model, clean.tolist(), corrupted.tolist(), answer, wrong)
    assert found.residual[0, 6] == pytest.approx(1, abs=1e-3)  # the first block's input there is all that differs
    assert np.abs(found.residual[0, :6]).max() < 1e-3  # before it the two texts agree: nothing to restore
    assert found.heads.shape == (model.config.n_layer, model.config.n_head) and np.all(np.isfinite(found.heads))


def test_the_logit_lens_ends_at_the_models_own_probabilities_and_attribution_sums_to_the_logit(model):
    ids = _ids(model)
    traced = gptlite.trace(model, ids)
    lens = traced.logit_lens()
    assert lens.shape == (model.config.n_layer + 1, len(ids), model.config.vocab_size)
    np.testing.assert_allclose(lens.sum(-1), 1, atol=1e-5)
    logits = traced.steps["logits"].astype(np.float64)
    expected = np.exp(logits - logits.max(-1, keepdims=True))
    np.testing.assert_allclose(lens[-1], expected / expected.sum(-1, keepdims=True), atol=1e-5)
    position, token = 9, int(ids[10])
    if model.config.norm_position == "post":
        with pytest.raises(gptlite.ConfigError, match="post-norm"):
            traced.attribution(position, token)
        return
    parts = traced.attribution(position, token)
    assert parts.logit == pytest.approx(float(logits[position, token]), abs=1e-6)
    assert parts.total() == pytest.approx(parts.logit, abs=1e-4 * max(1.0, np.abs(logits[position]).max()))
    assert parts.heads.shape == (model.config.n_layer, model.config.n_head)
