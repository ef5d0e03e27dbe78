"""Choosing the next token: the sampler (temperature, top-k, top-p), the noise it
draws from, and beam search's choice of beams. Written with `keras.ops`, to
be traced into the compiled decode loop; every setting is a tensor, so
changing one never recompiles."""

import math

import keras
import numpy as np
from keras import ops

from gptlite.errors import ConfigError


def sample_next_token(logits, settings, noise):
    """Draw one token id per row from float logits (B, V), given uniform noise (B, V) in (0, 1).

    `settings` is a float tensor [temperature, top_k, top_p]: temperature 0
    takes the arg-max; otherwise logits are divided by the temperature, only
    the top_k likeliest tokens are kept, and of those only the smallest set
    whose probability reaches top_p (the nucleus). top_k >= V and top_p = 1
    keep every token. The draw is the arg-max of the kept logits plus Gumbel
    noise, which picks each token with its softmax probability.
    """
    temperature, top_k, top_p = settings[0], settings[1], settings[2]
    vocabulary_size = ops.shape(logits)[-1]
    scaled = logits / ops.maximum(temperature, 1e-6)  # (B, V)

    def filtered():
        descending = ops.flip(ops.sort(scaled, axis=-1), axis=-1)  # (B, V)
        k = ops.cast(ops.clip(top_k, 1, vocabulary_size), "int32")
        kth_largest = ops.take(descending, k - 1, axis=-1)  # (B,)
        probabilities = ops.softmax(descending, axis=-1)
        mass_ranked_above = ops.cumsum(probabilities, axis=-1) - probabilities  # (B, V)
        in_nucleus = ops.less(mass_ranked_above, top_p)  # the likeliest token always is
        nucleus_floor = ops.min(ops.where(in_nucleus, descending, float("inf")), axis=-1)  # (B,)
        floor = ops.maximum(kth_largest, nucleus_floor)[:, None]  # (B, 1)
        return ops.where(ops.greater_equal(scaled, floor), scaled, -1e9)

    # The sort is skipped when every token is kept.
    keeps_all = ops.logical_and(ops.greater_equal(top_k, vocabulary_size), ops.greater_equal(top_p, 1.0))
    kept = ops.cond(keeps_all, lambda: scaled, filtered)
    gumbel = -ops.log(-ops.log(noise))
    sampled = ops.argmax(kept + gumbel, axis=-1)
    greedy = ops.argmax(logits, axis=-1)  # (B,)
    return ops.cast(ops.where(ops.equal(temperature, 0), greedy, sampled), "int32")


def uniform_noise(seed_generator, seed, block, shape):
    """Uniform noise in (0, 1) of `shape`, that depends on (seed, block) alone.

    `seed_generator`'s state is swapped for one made of (seed, block), so it
    is never advanced and needs no care between calls.
    """
    backend = keras.backend.backend()
    if backend == "jax":
        # The key itself: a scope for the seed generator would hide the one that maps the weights.
        key = ops.cast(ops.stack([seed, block]), "uint32")
        return keras.random.uniform(shape, minval=1e-20, maxval=1.0, seed=key)
    if backend == "torch":
        # Torch seeds from the sum of the state's two (int32) numbers: mix seed and block into one
        # so that neighbouring seeds do not share blocks' noise (an odd multiplier spreads them).
        mixed = (ops.cast(seed, "int64") * 2654435761 + ops.cast(block, "int64")) % 2**31
        state = ops.stack([mixed, ops.zeros_like(mixed)])
    else:
        state = ops.stack([ops.cast(seed, "int32"), ops.cast(block, "int32")])
    with keras.StatelessScope(state_mapping=[(seed_generator.state, state)]):
        return keras.random.uniform(shape, minval=1e-20, maxval=1.0, seed=seed_generator)


def choose_beams(logits, scores, finished, end_token, state):
    """Keep the `beams` likeliest one-token extensions of each row's beams.

    logits (B * beams, V); scores (B, beams). Returns the chosen tokens and
    their parent beams (B * beams,), the new scores and finished flags, and
    `state` (a structure of per-beam tensors) reordered to follow the parents.
    """
    rows, beams = ops.shape(scores)[0], ops.shape(scores)[1]
    vocabulary_size = ops.shape(logits)[-1]
    log_probabilities = ops.log_softmax(ops.cast(logits, "float32"), axis=-1)  # (B * beams, V)
    # A finished beam continues only with the end token, at no cost, so its score stays.
    is_end = ops.equal(ops.arange(vocabulary_size), end_token)[None, :]
    log_probabilities = ops.where(finished[:, None], ops.where(is_end, 0.0, float("-inf")), log_probabilities)
    extended = ops.reshape(scores, (-1, 1)) + log_probabilities  # (B * beams, V)
    scores, best = ops.top_k(ops.reshape(extended, (rows, beams * vocabulary_size)), beams)  # (B, beams)
    parents = ops.reshape(best // vocabulary_size + ops.arange(rows)[:, None] * beams, (-1,))
    tokens = ops.cast(ops.reshape(best % vocabulary_size, (-1,)), "int32")
    finished = ops.logical_or(ops.take(finished, parents, axis=0), ops.equal(tokens, end_token))
    state = keras.tree.map_structure(lambda tensor: ops.take(tensor, parents, axis=0), state)
    return tokens, ops.cast(parents, "int32"), scores, finished, state


def check_sampling_settings(max_new_tokens, temperature, top_k=None, top_p=1.0):
    """Raise a ConfigError naming the first setting that cannot work."""
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ConfigError(f"max_new_tokens must be zero or a positive whole number, got {max_new_tokens!r}")
    if not (_is_number(temperature) and math.isfinite(temperature) and temperature >= 0):
        raise ConfigError(f"temperature must be 0 (greedy) or positive, got {temperature}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer)) or top_k < 1):
        raise ConfigError(f"top_k must be a whole number of at least 1, got {top_k}")
    if not (_is_number(top_p) and 0 < top_p <= 1):
        raise ConfigError(f"top_p must be in (0, 1], got {top_p}")


def _is_number(value):
    return isinstance(value, (int, float, np.floating, np.integer)) and not isinstance(value, bool)


def sampler_settings(vocabulary_size, temperature, top_k, top_p):
    """The sampler's settings tensor [temperature, top_k, top_p]; top_k None keeps every token."""
    top_k = vocabulary_size if top_k is None else top_k
    return np.array([temperature, top_k, top_p], dtype=np.float32)


def check_beams(num_beams, vocabulary_size):
    if isinstance(num_beams, bool) or not isinstance(num_beams, int) or num_beams < 1:
        raise ConfigError(f"num_beams must be a whole number of at least 1, got {num_beams!r}")
    if num_beams > vocabulary_size:
        raise ConfigError(f"num_beams can be at most the vocabulary size, {vocabulary_size}; got {num_beams}")
