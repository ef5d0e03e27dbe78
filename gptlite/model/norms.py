"""The norms a model holds: LayerNorm (Keras's own) and RMSNorm, made by `make_norm` as a config asks, and what
a norm does to a sum of parts, held at the sum's statistics (`frozen_norm`), for a logit's attribution."""

import keras
import numpy as np
from keras import ops

from gptlite.model.config import GPTConfig
from gptlite.model.layers import initializer_now, register, weight_array


@register
class RMSNorm(keras.layers.Layer):
    """x / sqrt(mean(x^2) + epsilon) * gamma, over the last axis, computed in float32.

    LayerNorm without its centring and shift (Zhang and Sennrich, 2019):
    cheaper, and what Llama-family models use. (..., C) -> (..., C).
    """

    def __init__(self, epsilon=GPTConfig.norm_epsilon, **kwargs):
        super().__init__(**kwargs)
        self.epsilon = epsilon

    def build(self, input_shape):
        self.gamma = self.add_weight(name="gamma", shape=(input_shape[-1],), initializer=initializer_now("ones"))

    def call(self, x):
        x32 = ops.cast(x, "float32")
        normed = x32 * ops.rsqrt(ops.mean(ops.square(x32), axis=-1, keepdims=True) + self.epsilon)
        return ops.cast(normed * ops.cast(self.gamma, "float32"), x.dtype)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update(epsilon=self.epsilon)
        return config


def make_norm(kind, epsilon, bias, dtype, name):
    """A LayerNorm ("layer"; with a shift where bias) or an RMSNorm ("rms"): one of NORM_LAYERS."""
    if kind == "rms":
        return RMSNorm(epsilon, dtype=dtype, name=name)
    return keras.layers.LayerNormalization(epsilon=epsilon, center=bias, dtype=dtype, name=name)


# Every kind of norm a model holds: make_norm's two (QK-norm's are RMSNorms too).
NORM_LAYERS = (RMSNorm, keras.layers.LayerNormalization)


def frozen_norm(norm, x):
    """What `norm` (one of NORM_LAYERS) does to vectors x (..., C), held at x's own statistics, as NumPy arrays
    (centred, scale (..., C), shift (C,)): for any y, (y - its mean where `centred`, else y) * scale + shift, which
    is norm(x) for x itself. Linear in y but for the shift, so the parts of a sum go through it one by one, as a
    logit's attribution sends them (TransformerLens freezes its norms' scale so)."""
    x = np.asarray(x, np.float64)
    gamma = weight_array(norm, "gamma").astype(np.float64)
    centred = not isinstance(norm, RMSNorm)
    if centred:  # LayerNorm: (x - mean) / sqrt(variance + epsilon) * gamma + beta
        spread = np.sqrt(x.var(axis=-1, keepdims=True) + norm.epsilon)
        shift = weight_array(norm, "beta") if getattr(norm, "beta", None) is not None else np.zeros(x.shape[-1])
    else:  # RMSNorm: x / sqrt(mean(x^2) + epsilon) * gamma
        spread = np.sqrt(np.mean(np.square(x), axis=-1, keepdims=True) + norm.epsilon)
        shift = np.zeros(x.shape[-1])
    return centred, gamma / spread, np.asarray(shift, np.float64)
