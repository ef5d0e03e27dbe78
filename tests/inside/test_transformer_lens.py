"""The same numbers as TransformerLens: a model of the `cpu` preset's shape (GPT-2's layout) exported to Hugging Face
and booted in TransformerLens 4 offline (`TransformerBridge.boot_transformers` on the folder, compatibility mode with
no processing), on the same ids: head scores against its head detector's similarity score ("mul"), ablation against
zeroing its `hook_z`, the logit lens against its accumulated residual through `ln_final` and the unembedding, and
attribution against its per-head results through the same frozen scale. Each within 1e-4.

Needs the `lens` extra (TransformerLens, and torch). It runs once, under TensorFlow: the analyses' own numbers are
checked under every backend by test_switches.py and the others here.
"""

import os

import keras
import numpy as np
import pytest

import gptlite
from conftest import SHAKESPEARE

pytestmark = [pytest.mark.extras, pytest.mark.once("TransformerLens's numbers are compared under one backend")]
TEXT = "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n"
WITHIN = 1e-4


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    """(gptlite's model, TransformerLens's bridge of its Hugging Face export): the `cpu` preset's shape, weights
    drawn and moved away from their initial values so that every head attends somewhere of its own."""
    pytest.importorskip("transformer_lens", reason="needs the lens extra (TransformerLens)")
    os.environ["HF_HUB_OFFLINE"] = "1"  # nothing reaches for the Hub: the model is a local folder
    from transformer_lens.model_bridge import TransformerBridge

    characters = SHAKESPEARE.read_text() if SHAKESPEARE.exists() else TEXT + "abcdefghijklmnopqrstuvwxyz"
    tokenizer = gptlite.CharTokenizer.from_text(characters)
    preset = gptlite.PRESETS["cpu"]
    keras.utils.set_random_seed(0)
    model = gptlite.GPT(tokenizer=tokenizer, vocab_size=tokenizer.vocabulary_size, n_layer=preset["n_layer"],
                        n_head=preset["n_head"], n_embd=preset["n_embd"], block_size=preset["block_size"])
    model.build((None, preset["block_size"]))
    rng = np.random.default_rng(0)
    for weight in model.weights:
        weight.assign(keras.ops.convert_to_numpy(weight) + rng.normal(0, 0.1, weight.shape).astype("float32"))
    folder = tmp_path_factory.mktemp("lens") / "hf"
    gptlite.export_hugging_face(model, folder)
    bridge = TransformerBridge.boot_transformers(str(folder), device="cpu")
    bridge.enable_compatibility_mode(no_processing=True)
    return model, bridge


def _tokens(ids):
    import torch

    return torch.tensor(np.asarray(ids, np.int64)[None])


def test_head_scores_are_transformer_lenss_head_detector_on_the_same_ids(both):
    from transformer_lens import head_detector

    model, bridge = both
    report = gptlite.heads(model, TEXT)
    _, cache = bridge.run_with_cache(_tokens(report.ids))
    length = len(report.ids)
    import torch

    first = torch.zeros(length, length)
    first[:, 0] = 1
    patterns = {"previous_token": head_detector.get_previous_token_head_detection_pattern(_tokens(report.ids)),
                "current_token": torch.eye(length), "first_token": first}
    _, probe_cache = bridge.run_with_cache(_tokens(report.probe))
    induction = head_detector.get_induction_head_detection_pattern(_tokens(report.probe))
    layers, heads = report.ablation.shape
    for name, pattern, on in [*((name, pattern, cache) for name, pattern in patterns.items()),
                              ("induction", induction, probe_cache)]:
        expected = np.array([[head_detector.compute_head_attention_similarity_score(
            on["pattern", layer][0][head], pattern, exclude_bos=False, exclude_current_token=False,
            error_measure="mul") for head in range(heads)] for layer in range(layers)])
        assert np.abs(getattr(report, name) - expected).max() <= WITHIN, name
    assert np.abs(report.previous_token).max() > 0.05  # the heads attend somewhere: the scores are not all alike


def test_ablation_is_the_loss_with_transformer_lenss_hook_z_zeroed(both):
    model, bridge = both
    report = gptlite.heads(model, TEXT, calibrate=False)
    tokens = _tokens(report.ids)
    clean = bridge(tokens, return_type="loss").item()
    assert report.loss == pytest.approx(clean, abs=WITHIN)
    layers, heads = report.ablation.shape
    for layer in range(layers):
        for head in range(heads):
            def zeroed(z, hook, head=head):  # z (batch, position, head, d_head)
                z = z.clone()
                z[:, :, head] = 0
                return z

            ablated = bridge.run_with_hooks(tokens, return_type="loss",
                                            fwd_hooks=[(f"blocks.{layer}.attn.hook_z", zeroed)]).item()
            assert report.ablation[layer, head] == pytest.approx(ablated - clean, abs=WITHIN), (layer, head)


def test_the_logit_lens_and_attribution_are_transformer_lenss_residual_through_its_final_norm(both):
    import torch

    model, bridge = both
    trace = gptlite.trace(model, TEXT)
    _, cache = bridge.run_with_cache(_tokens(trace.ids))
    streams = cache.accumulated_resid(apply_ln=True)[:, 0]  # (L + 1, T, C), each through ln_final
    unembedded = streams @ bridge.W_U + (bridge.b_U if getattr(bridge, "b_U", None) is not None else 0)
    expected = torch.softmax(unembedded, -1).detach().numpy()
    assert np.abs(trace.logit_lens() - expected).max() <= WITHIN
    position = len(trace.ids) - 2
    token = int(trace.ids[-1])
    parts = trace.attribution(position, token)
    stack = cache.stack_head_results(layer=-1, apply_ln=True)[:, 0, position]  # (L H, C), at the frozen scale
    gamma = getattr(bridge.ln_final, "w", None)
    gamma = bridge.ln_final.weight if gamma is None else gamma
    per_head = ((stack * gamma) @ bridge.W_U[:, token]).detach().numpy().reshape(parts.heads.shape)
    assert np.abs(parts.heads - per_head).max() <= WITHIN
    assert parts.total() == pytest.approx(parts.logit, abs=WITHIN * max(1, abs(parts.logit)))
