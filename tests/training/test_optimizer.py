import dataclasses

import keras
import numpy as np
import pytest

import gptlite
from gptlite.training.optimizer import FlatAdamW, learning_rate_schedule, make_optimizer


def _variables():
    rng = np.random.default_rng(0)
    return [keras.Variable(rng.normal(size=shape).astype("float32"), name=name)
            for shape, name in (((6, 3), "a"), ((3, 5), "b"), ((4,), "bias"))]


def _gradients(scale):
    rng = np.random.default_rng(1)
    shapes = ((6, 3), (3, 5), (4,))
    return [keras.ops.convert_to_tensor(scale * rng.normal(size=shape).astype("float32")) for shape in shapes]


def _train(optimizer_class):
    variables = _variables()
    schedule = keras.optimizers.schedules.CosineDecay(0.01, decay_steps=10, warmup_target=0.05, warmup_steps=2)
    optimizer = optimizer_class(learning_rate=schedule, weight_decay=0.1, beta_2=0.99, global_clipnorm=1.0)
    optimizer.exclude_from_weight_decay(var_list=variables[2:])
    # The first gradients are far above the clipping norm, the later ones below it.
    for scale in (10.0, 0.05, 0.02):
        optimizer.apply(_gradients(scale), variables)
    return [keras.ops.convert_to_numpy(v) for v in variables], optimizer


def test_flat_adamw_moves_the_variables_as_keras_adamw_does():
    flat, optimizer = _train(FlatAdamW)
    reference, _ = _train(keras.optimizers.AdamW)
    start = [keras.ops.convert_to_numpy(v) for v in _variables()]
    for moved, expected, before in zip(flat, reference, start):
        np.testing.assert_allclose(moved, expected, rtol=1e-5, atol=1e-6)
        assert np.abs(moved - before).max() > 1e-3
    # Two moment vectors over all 37 numbers, not two per variable.
    assert sorted(tuple(v.shape) for v in optimizer.variables if v.name.startswith("flat_")) == [(37,), (37,)]


def test_flat_adamw_refuses_clipping_it_does_not_do():
    with pytest.raises(ValueError, match="global_clipnorm"):
        FlatAdamW(clipnorm=1.0)


def test_learning_rate_warms_up_then_decays_to_min_lr():
    config = gptlite.TrainingConfig(lr=1e-3, min_lr=1e-4, warmup_iters=100, max_iters=2000)
    schedule = learning_rate_schedule(config)
    rate = lambda step: float(keras.ops.convert_to_numpy(schedule(step)))
    assert rate(0) == pytest.approx(1e-3 / 101)
    assert rate(50) < rate(99) < rate(100) == pytest.approx(1e-3)
    assert rate(1050) == pytest.approx((1e-3 + 1e-4) / 2, rel=1e-3)
    assert rate(2000) == pytest.approx(1e-4)
    # Accumulating gradients, Keras counts micro-batches: each optimizer step's are given its rate.
    accumulated = learning_rate_schedule(dataclasses.replace(config, grad_accum=4))
    for micro_batch in (0, 3, 4, 401, 4 * 1050 + 3, 8000):
        assert float(keras.ops.convert_to_numpy(accumulated(micro_batch))) == pytest.approx(rate(micro_batch // 4))


def test_weight_decay_applies_to_weight_matrices_only(tiny_model):
    optimizer = make_optimizer(tiny_model, gptlite.TrainingConfig())
    decayed = {v.path for v in tiny_model.trainable_variables if optimizer._use_weight_decay(v)}
    assert decayed, "some matrices must decay"
    for variable in tiny_model.trainable_variables:
        is_embedding = variable.name in ("embeddings", "position_embeddings")
        should_decay = len(variable.shape) == 2 and not is_embedding
        assert (variable.path in decayed) == should_decay, variable.path


@pytest.mark.parametrize("setting,keras_name,values,refused,refusal", [
    ("newton_schulz_steps", "ns_steps", (1, 5), (0,), "a positive whole number"),
    ("muon_momentum", "momentum", (0.5, 0.95), (-0.1, 1.0), r"in \[0, 1\)"),
])
def test_muons_settings_change_the_matrices_updates_alone(tiny_model, setting, keras_name, values, refused, refusal):
    """Another count of orthogonalising iterations, or another momentum (which weighs the first step's gradient
    in the second step's update), moves each block's matrix elsewhere within two steps; the weights AdamW moves
    (embeddings, norms) move the same."""
    rng = np.random.default_rng(3)
    gradients = [[keras.ops.convert_to_tensor(rng.normal(size=v.shape).astype("float32"))
                  for v in tiny_model.trainable_variables] for _ in range(2)]
    start = [keras.ops.convert_to_numpy(v) for v in tiny_model.trainable_variables]
    moved = []
    for value in values:
        optimizer = make_optimizer(tiny_model, gptlite.TrainingConfig(optimizer="muon", warmup_iters=0,
                                                                      **{setting: value}))
        assert optimizer.get_config()[keras_name] == value
        for step_gradients in gradients:
            optimizer.apply(step_gradients, tiny_model.trainable_variables)
        moved.append([keras.ops.convert_to_numpy(v) for v in tiny_model.trainable_variables])
        for variable, initial in zip(tiny_model.trainable_variables, start):
            variable.assign(initial)
    for variable, first, second in zip(tiny_model.trainable_variables, *moved):
        by_muon = len(variable.shape) == 2 and "embedding" not in variable.path
        assert not np.allclose(first, second) if by_muon else np.array_equal(first, second), variable.path
    for value in refused:
        with pytest.raises(gptlite.ConfigError, match=f"{setting} must be {refusal}"):
            gptlite.TrainingConfig(optimizer="muon", **{setting: value})
