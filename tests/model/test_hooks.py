"""The hook points of the one forward pass: hooks keep the steps asked for, by their full names, and edit them; absent,
the pass computes what it always did."""

import keras
import numpy as np
import pytest

from gptlite.model.hooks import BLOCK_STEPS, Hooks, MODEL_STEPS, step_name


def _numpy(x):
    return keras.ops.convert_to_numpy(x)


def test_hooks_keep_what_is_asked_by_full_name_and_scope_parts_under_their_prefix():
    hooks = Hooks(keep=["layer_0.query", "logits"])
    block = hooks.within("layer_0.")
    assert block("query", 1) == 1 and block("key", 2) == 2 and hooks("logits", 3) == 3
    assert hooks.kept == {"layer_0.query": 1, "logits": 3}
    assert block.keeps("query") and not block.keeps("key") and not hooks.keeps("query")
    every = Hooks(keep=True)
    every.within("layer_1.").within("cross_")("heads", 4)
    assert every.kept == {"layer_1.cross_heads": 4}
    by_rule = Hooks(keep=lambda name: name.endswith(".attention"))
    assert by_rule.within("layer_3.").keeps("attention") and not by_rule.keeps("attention")
    assert not Hooks().keeps("logits") and not Hooks().wants("logits")


def test_an_edit_changes_the_step_and_what_is_kept_is_the_edited_value():
    hooks = Hooks(keep=True, edits={"layer_1.heads": lambda value: value * 10})
    assert hooks.within("layer_1.")("heads", 2) == 20 and hooks.within("layer_0.")("heads", 2) == 2
    assert hooks.kept == {"layer_1.heads": 20, "layer_0.heads": 2}
    assert Hooks(edits={"logits": abs}).wants("logits") and step_name("heads", 2, "encoder_layer") == \
        "encoder_layer_2.heads"


def test_a_forward_pass_keeps_every_step_named_as_declared_and_gives_the_models_own_logits(tiny_model):
    ids = np.arange(10)[None] % tiny_model.config.vocab_size
    hooks = Hooks(keep=True)
    logits = _numpy(tiny_model(ids, hooks=hooks))
    np.testing.assert_allclose(logits, _numpy(tiny_model(ids)), atol=1e-5)  # the fused attention, without hooks
    np.testing.assert_array_equal(_numpy(hooks.kept["logits"]), logits)
    for name in hooks.kept:
        block, _, step = name.rpartition(".")
        assert step in (BLOCK_STEPS if block else MODEL_STEPS), name
    # Every step of a pre-norm block with learned positions and GELU, and no QK-norm, is there (each head's share
    # of the output projection too, which is computed only where asked for, as keeping every step asks).
    others = {"query_normed", "key_normed", "query_rotated", "key_rotated", "gate", "up"}
    cross = {step for step in BLOCK_STEPS if step.startswith("cross_")}
    assert {name.split(".")[1] for name in hooks.kept if name.startswith("layer_1.")} == \
        set(BLOCK_STEPS) - others - cross
    assert _numpy(hooks.kept["layer_0.attention"]).shape == (1, 2, 10, 10)
    assert _numpy(hooks.kept["layer_0.query"]).shape == (1, 2, 10, 8)  # heads first


def test_each_heads_output_is_its_share_of_the_projection_and_they_sum_to_it_with_the_bias(tiny_model):
    ids = np.arange(9)[None] % tiny_model.config.vocab_size
    hooks = Hooks(keep=["layer_1.head_outputs", "layer_1.attention_output"])
    tiny_model(ids, hooks=hooks)
    shares = _numpy(hooks.kept["layer_1.head_outputs"])  # (1, H, T, C)
    assert shares.shape == (1, 2, 9, tiny_model.config.n_embd)
    np.testing.assert_allclose(shares.sum(axis=1), _numpy(hooks.kept["layer_1.attention_output"]), atol=1e-5)


@pytest.mark.parametrize("head", [0, 1])
def test_zeroing_a_heads_values_with_keras_ops_is_the_same_edit_everywhere_after_it(tiny_model, head):
    ids = np.arange(12)[None] % tiny_model.config.vocab_size

    def zeroed(values):  # (B, H, T, D): head `head` zeroed by hand
        keep = np.ones((1, values.shape[1], 1, 1), "float32")
        keep[0, head] = 0
        return values * keras.ops.convert_to_tensor(keep)

    clean, edited = Hooks(keep=True), Hooks(keep=True, edits={"layer_0.heads": zeroed})
    before, after = _numpy(tiny_model(ids, hooks=clean)), _numpy(tiny_model(ids, hooks=edited))
    assert np.abs(after - before).max() > 1e-4
    assert not np.any(_numpy(edited.kept["layer_0.heads"])[0, head])
    np.testing.assert_array_equal(_numpy(edited.kept["layer_0.attention"]), _numpy(clean.kept["layer_0.attention"]))
    np.testing.assert_array_equal(_numpy(edited.kept["embedding"]), _numpy(clean.kept["embedding"]))
    # By hand: the zeroed values through the output projection and on through the rest of the model.
    by_hand = tiny_model.blocks[0].attention.output_projection(
        keras.ops.reshape(keras.ops.transpose(edited.kept["layer_0.heads"], (0, 2, 1, 3)), (1, 12, -1)))
    np.testing.assert_allclose(_numpy(edited.kept["layer_0.attention_output"]), _numpy(by_hand), atol=1e-6)
