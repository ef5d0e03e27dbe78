import keras
import numpy as np
import pytest

from gptlite.training.optimizer import FlatAdamW


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
