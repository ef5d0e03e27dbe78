"""Choosing the next token: the sampler, the noise it draws from, each row's settings as tensors, and beam
search's choice of beams (the settings themselves, `SamplingConfig`, are declared in `decode.settings`).

The sampler is written with `keras.ops`, to be traced into the compiled
decode loop. Every setting is a tensor with one value per row, so rows with
different settings decode in one batch and changing one never recompiles.
"""

import collections

import keras
import numpy as np
from keras import ops

from gptlite.decode.settings import SamplingConfig, TOP_LOGPROBS
from gptlite.errors import ConfigError


def row_configs(sampling, count):
    """Each of `count` rows' SamplingConfig, seeded: `sampling` is one config for every row (each row's seed made
    from its seed, see `SamplingConfig.for_rows`) or a list of one each, whose seeds are kept (None: a random
    one)."""
    if isinstance(sampling, SamplingConfig):
        return sampling.for_rows(count)
    return [config if config.seed is not None else config.for_rows(1)[0] for config in sampling]


class RowSettings(collections.namedtuple("RowSettings", "temperature top_k top_p min_p repetition_penalty")):
    """Each row's sampling settings as the sampler reads them: one float32 (B,) array or tensor a setting.

    The one place where SamplingConfigs become numbers (`of`); a top_k of
    None is the whole vocabulary. Host-side questions (`filters`,
    `samples`, `penalises`) decide which program a call needs.
    """

    __slots__ = ()

    @classmethod
    def of(cls, configs, vocabulary_size):
        """The settings of SamplingConfigs, one row each."""
        def column(values):
            return np.array(list(values), np.float32)

        return cls(column(config.temperature for config in configs),
                   column(vocabulary_size if config.top_k is None else min(config.top_k, vocabulary_size)
                          for config in configs),
                   column(config.top_p for config in configs), column(config.min_p for config in configs),
                   column(config.repetition_penalty for config in configs))

    def rows(self, index):
        """The settings of the rows `index` (an index array or mask), on the host."""
        return RowSettings(*(np.asarray(values)[index] for values in self))

    def filters(self, vocabulary_size):
        """Whether some row keeps fewer than all tokens: a top_k below the vocabulary, a top_p below 1 or a min_p
        above 0."""
        return bool(np.any(np.asarray(self.top_k) < vocabulary_size) or np.any(np.asarray(self.top_p) < 1.0)
                    or np.any(np.asarray(self.min_p) > 0))

    def samples(self):
        """Whether some row samples (a temperature above 0), and so needs noise."""
        return bool(np.any(np.asarray(self.temperature) > 0))

    def penalises(self):
        """Whether some row has a repetition penalty."""
        return bool(np.any(np.asarray(self.repetition_penalty) != 1.0))


def sample_next_token(logits, settings, noise, seen=None, filtering=True):
    """Draw one token id per row from float logits (B, V), given uniform noise (B, V) in (0, 1).

    `settings`: each row's, a RowSettings of (B,) tensors.
    `seen` (B, V), where some row's repetition_penalty is not 1: how often
    each token is in the row's context. The draw is the arg-max of the kept
    logits plus Gumbel noise, which picks each token with its softmax
    probability. Each filter leaves a row alone where its setting keeps
    every token, so a row's token is the same whatever rows share its batch.
    `noise` None says that every row is greedy (temperature 0; see
    `samples`). `filtering=False` says that no row filters (see `filters`):
    the sort the filters need is then left out of the program; None decides
    at each call, in the program, skipping the sort where no row filters.
    """
    temperature = ops.convert_to_tensor(settings.temperature, "float32")[:, None]  # (B, 1)
    logits = _penalised(logits, settings, seen)
    if noise is None:  # every row takes the likeliest token (see samples)
        return ops.cast(ops.argmax(logits, axis=-1), "int32")
    kept = _kept_scores(logits, settings, filtering)
    gumbel = -ops.log(-ops.log(noise))
    sampled = ops.argmax(kept + gumbel, axis=-1)
    greedy = ops.argmax(logits, axis=-1)  # (B,)
    return ops.cast(ops.where(ops.equal(temperature[:, 0], 0), greedy, sampled), "int32")


def next_token_probabilities(logits, config, seen=None):
    """One row's next-token probabilities (V,) after a SamplingConfig's settings, NumPy in and out: what
    `sample_next_token` draws from (all of it on the likeliest token at temperature 0). `seen` (V,): how often
    each token is in the context, for the repetition penalty."""
    settings = RowSettings.of([config], len(logits))
    row = _penalised(np.asarray(logits, np.float32)[None], settings, None if seen is None else
                     np.asarray(seen, np.float32)[None])
    if config.temperature == 0:
        chosen = np.zeros(len(logits), np.float32)
        chosen[int(ops.convert_to_numpy(ops.argmax(row[0])))] = 1
        return chosen
    return np.asarray(ops.convert_to_numpy(ops.softmax(_kept_scores(row, settings, True), axis=-1))[0], np.float32)


def _penalised(logits, settings, seen):
    """Float logits (B, V) with each row's repetition penalty applied to the tokens it has `seen` (B, V)."""
    logits = ops.cast(logits, "float32")
    if seen is None:
        return logits
    # (B, 1); eager torch is handed NumPy arrays as they are.
    penalty = ops.convert_to_tensor(settings.repetition_penalty, "float32")[:, None]
    penalised = ops.where(ops.greater(logits, 0), logits / penalty, logits * penalty)
    return ops.where(ops.logical_and(ops.greater(seen, 0), ops.not_equal(penalty, 1.0)), penalised, logits)


def _kept_scores(logits, settings, filtering):
    """Logits (B, V) divided by each row's temperature, the tokens its top_k, top_p and min_p leave out at -1e9:
    the draw's scores (see `sample_next_token` for `filtering`)."""
    temperature, top_k, top_p, min_p = (ops.convert_to_tensor(values, "float32")[:, None]
                                        for values in settings[:4])  # (B, 1) each
    vocabulary_size = ops.shape(logits)[-1]
    scaled = logits / ops.maximum(temperature, 1e-6)  # (B, V)
    keeps_all = ops.logical_and(ops.greater_equal(top_k, vocabulary_size),
                                ops.logical_and(ops.greater_equal(top_p, 1.0), ops.less_equal(min_p, 0.0)))  # (B, 1)

    def filtered():
        descending = ops.flip(ops.sort(scaled, axis=-1), axis=-1)  # (B, V)
        k = ops.cast(ops.clip(top_k[:, 0], 1, vocabulary_size), "int32")
        rows = ops.shape(scaled)[0]
        kth_largest = ops.take(ops.reshape(descending, (-1,)), ops.arange(rows) * vocabulary_size + k - 1)  # (B,)
        probabilities = ops.softmax(descending, axis=-1)
        mass_ranked_above = ops.cumsum(probabilities, axis=-1) - probabilities  # (B, V)
        # The likeliest token is always in the nucleus; a row whose top_p is 1 keeps every token.
        in_nucleus = ops.logical_or(ops.less(mass_ranked_above, top_p), ops.greater_equal(top_p, 1.0))
        nucleus_floor = ops.min(ops.where(in_nucleus, descending, float("inf")), axis=-1)  # (B,)
        min_p_floor = ops.where(ops.greater(min_p[:, 0], 0.0),
                                descending[:, 0] + ops.log(ops.maximum(min_p[:, 0], 1e-30)), float("-inf"))
        floor = ops.maximum(ops.maximum(kth_largest, nucleus_floor), min_p_floor)[:, None]  # (B, 1)
        kept = ops.where(ops.greater_equal(scaled, floor), scaled, -1e9)
        return ops.where(keeps_all, scaled, kept)

    if filtering is None:
        return ops.cond(ops.all(keeps_all), lambda: scaled, filtered)
    return filtered() if filtering else scaled


def token_log_probabilities(logits, tokens):
    """The model's log-probabilities (temperature 1, nothing filtered) of `tokens` (B,) and of the
    TOP_LOGPROBS likeliest tokens: (chosen (B,), top ids (B, TOP_LOGPROBS), top log-probabilities)."""
    log_probabilities = ops.log_softmax(ops.cast(logits, "float32"), axis=-1)  # (B, V)
    rows, vocabulary_size = ops.shape(logits)[0], ops.shape(logits)[1]
    chosen = ops.take(ops.reshape(log_probabilities, (-1,)), ops.arange(rows) * vocabulary_size + tokens)
    top_values, top_ids = ops.top_k(log_probabilities, min(TOP_LOGPROBS, vocabulary_size))
    return chosen, ops.cast(top_ids, "int32"), top_values


def token_counts(window, lengths, vocabulary_size):
    """How often each token is in each row's window[:, :lengths]: float32 (B, V), for repetition_penalty."""
    window, lengths = ops.convert_to_tensor(window, "int32"), ops.convert_to_tensor(lengths, "int32")
    rows, width = ops.shape(window)[0], ops.shape(window)[1]
    real = ops.cast(ops.less(ops.arange(width)[None, :], lengths[:, None]), "float32")  # (B, T)
    flat = ops.reshape(ops.arange(rows)[:, None] * vocabulary_size + window, (-1, 1))
    return ops.reshape(ops.scatter(flat, ops.reshape(real, (-1,)), (rows * vocabulary_size,)), (rows, vocabulary_size))


def uniform_noise(seeds, indices, vocabulary_size):
    """Uniform noise in (0, 1) for each token index of each row's seed: seeds and indices (int32) broadcast
    together to a shape S; the noise is S + (V,), one number per (seed, index, vocabulary entry).

    A hash of the three numbers rather than a random generator: one
    program's worth of integer operations for every row at once, where a
    generator needs a seed, and so an operation of its own, for each row
    (the compile then grew with the batch: 6.6 s at 16 rows against 1.6 s
    at one, for the `cpu` preset's decode loop). The same integers on every
    backend, so the same noise.
    """
    key = _mixed(ops.bitwise_xor(_mixed(ops.convert_to_tensor(seeds, "int32")),
                                 ops.convert_to_tensor(indices, "int32")))  # S
    entries = ops.arange(vocabulary_size, dtype="int32") * _GOLDEN  # (V,): entries apart, bit patterns apart
    bits = _mixed(ops.bitwise_xor(ops.expand_dims(key, -1), entries))  # S + (V,)
    return (ops.cast(_shifted(bits, 8), "float32") + 0.5) * (1.0 / (1 << 24))


_GOLDEN = -1640531527  # 0x9e3779b9 as an int32: the golden ratio's bits, an odd step that spreads entries


def _shifted(x, bits):
    """x >> bits for int32 x, filling with zeros as an unsigned shift does (ops.right_shift keeps the sign)."""
    return ops.bitwise_and(ops.right_shift(x, bits), (1 << (32 - bits)) - 1)


def _mixed(x):
    """An int32 hash whose every output bit depends on every input bit (the `lowbias32` finalizer: xor-shifts
    and multiplications by odd constants, each a bijection, so distinct inputs never collide). Multiplication
    wraps around in int32 on every backend."""
    x = ops.bitwise_xor(x, _shifted(x, 16)) * 0x7FEB352D
    x = ops.bitwise_xor(x, _shifted(x, 15)) * -2073254261  # 0x846ca68b as an int32
    return ops.bitwise_xor(x, _shifted(x, 16))


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


def check_beams(num_beams, vocabulary_size):
    if isinstance(num_beams, bool) or not isinstance(num_beams, int) or num_beams < 1:
        raise ConfigError(f"num_beams must be a whole number of at least 1, got {num_beams!r}")
    if num_beams > vocabulary_size:
        raise ConfigError(f"num_beams can be at most the vocabulary size, {vocabulary_size}; got {num_beams}")
