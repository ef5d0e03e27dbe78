"""Attention: the layer (`Attention`: self- or cross-, full, grouped-query or multi-query, with rotary
positions and QK-norm as the model asks), the attention function, the causal mask, and where a decoding
step's keys and values go in the cache (`CachePlacement`), and how rows that pack several texts keep them
apart (`PackedTexts`).

Shape letters in comments are those of `gptlite.model.layers`.
"""

import collections
import dataclasses
import functools
import math

import keras
import ml_dtypes
import numpy as np
from keras import ops

from gptlite.backend.runtime import running
from gptlite.model import positions as position_kinds
from gptlite.model.config import GPTConfig
from gptlite.model.hooks import seen
from gptlite.model.layers import Linear, register, weight_array
from gptlite.model.norms import RMSNorm
from gptlite.model.positions import token_positions

# The names `Attention.head_weights` gives each head's weights, and a block's (its cross-attention's as `cross_...`,
# as `hooks.BLOCK_STEPS` names its steps).
HEAD_WEIGHTS = ("query_weight", "key_weight", "value_weight", "query_bias", "key_bias", "value_bias")
BLOCK_HEAD_WEIGHTS = (*HEAD_WEIGHTS, *(f"cross_{name}" for name in HEAD_WEIGHTS))


def causal_mask(query_length, key_length, query_offset=0):
    """Boolean mask, True where query t may attend key s.

    Query t sits at absolute position `query_offset + t`; it sees every key at
    that position or earlier. With a number as offset the mask is (T, S); with
    one offset per row, (B,), it is (B, T, S), as when each row's new tokens
    are appended to a cache of earlier keys at its own position.
    """
    if isinstance(query_offset, int):
        query_positions = ops.arange(query_length) + query_offset  # (T,)
    else:
        query_positions = token_positions(query_offset, query_length)  # (B, T)
    return ops.greater_equal(query_positions[..., None], ops.arange(key_length))  # (T, S) or (B, T, S)


class PackedTexts(collections.namedtuple("PackedTexts", "positions mask")):
    """Rows that pack several texts, read as if each text were alone, the same for every layer of a model.

    positions (B, T): each token's position in its own text, 0 at the
    text's first token; mask (B, 1, T, T): True where query t may attend
    key s, s being t or before it in the same text.
    """

    @classmethod
    def of(cls, positions):
        # Within a text positions rise by one a token and a new text starts again from 0, so keys s <= t
        # share query t's text exactly when their positions are t - s apart.
        length = ops.shape(positions)[1]
        steps = ops.arange(length)
        apart = positions[:, :, None] - positions[:, None, :]  # (B, T, S)
        same_text = ops.equal(apart, ops.cast(steps[:, None] - steps[None, :], apart.dtype))
        return cls(positions, ops.logical_and(same_text, causal_mask(length, length))[:, None])


def scaled_dot_product_attention(query, key, value, mask=None, weights_dropout=None, hooks=None):
    """softmax(Q K^T / sqrt(D) + mask) V, and the attention weights.

    query (B, H, T, D), key and value (B, K, S, D), where K divides H: query
    heads h = k G .. k G + G - 1 share key/value head k (grouped-query
    attention; K = H is plain multi-head attention), read without copying
    the keys and values G times. mask broadcastable to (B, H, T, S) with True
    where attending is allowed. Masked scores are set to the most negative
    number of the compute dtype rather than -inf, so a row with nothing
    visible gives uniform weights instead of NaN. `weights_dropout`, a
    function, drops some weights before they weigh the values; the weights
    returned are those before it. `hooks` (`gptlite.model.hooks`) see
    `products`, `scores`, `attention` and `heads`, each with H heads.
    """
    heads, length, head_size = query.shape[1], ops.shape(query)[2], ops.shape(query)[3]
    groups = heads // key.shape[1]

    def by_query_head(x):  # (B, K, G, T, .) -> (B, H, T, .), as hooks see it, and back
        return x if groups == 1 else ops.reshape(x, (-1, heads, length, ops.shape(x)[-1]))

    def by_key_head(x):
        return x if groups == 1 else ops.reshape(x, (-1, key.shape[1], groups, length, ops.shape(x)[-1]))

    def through(step, x):
        return x if hooks is None or not hooks.wants(step) else by_key_head(hooks(step, by_query_head(x)))

    if groups > 1:  # (B, K, G, T, D) against (B, K, 1, S, D)
        query = by_key_head(query)
        key, value = key[:, :, None], value[:, :, None]
    scores = through("products", ops.matmul(query, ops.swapaxes(key, -1, -2)))  # (B, H, T, S), or (B, K, G, T, S)
    scores = through("scores", scores / ops.cast(math.sqrt(head_size), scores.dtype))
    if mask is not None:
        if groups > 1 and len(mask.shape) == 4:
            mask = mask[:, :, None]  # (B, 1, 1, T, S)
        lowest = float(ml_dtypes.finfo(keras.backend.standardize_dtype(scores.dtype)).min)
        scores = ops.where(mask, scores, ops.cast(lowest, scores.dtype))
    if scores.shape[-1] == 1:
        # One key (a Seq2Seq's decoding starts from its start token alone): its weight is 1,
        # as softmax gives, but Keras warns of a softmax over one element.
        weights = ops.ones_like(scores)
    else:
        weights = ops.softmax(scores, axis=-1)  # (B, H, T, S), or (B, K, G, T, S)
    weights = through("attention", weights)
    attended = ops.matmul(weights if weights_dropout is None else weights_dropout(weights), value)
    attended, weights = by_query_head(attended), by_query_head(weights)
    return seen(hooks, "heads", attended), weights  # (B, H, T, D), (B, H, T, S)


def merge_heads(x):
    """(B, H, T, D) -> (B, T, C)."""
    heads, length, head_size = ops.shape(x)[1], ops.shape(x)[2], ops.shape(x)[3]
    return ops.reshape(ops.transpose(x, (0, 2, 1, 3)), (-1, length, heads * head_size))


@register
class Attention(keras.layers.Layer):
    """Multi-head attention, in each of the forms a transformer needs.

    - causal: a decoder's self-attention, where each position sees itself
      and earlier ones, over the tokens given or, decoding, over a key/value
      cache as well (`cache`). Queries, keys and values come from one fused
      projection, `qkv_projection`: one matmul.
    - not causal: attention over a context that may be padded, the input
      itself (an encoder's self-attention) or another sequence (a decoder's
      cross-attention, `cross=True`). Queries come from `query_projection`;
      keys and values from `key_value_projection`, computed once per context
      (`key_values`) and attended from any number of queries (`attend`).

    Args:
        config: the model's `GPTConfig`: its heads H, key/value heads K (fewer
            than H is grouped-query attention, 1 multi-query: G = H / K query
            heads share each key/value head, and a key/value cache holds K
            heads), head size D, width C, dropout on the output and
            attention_dropout on the weights (above zero, training computes
            the weights step by step instead of with the backend's fused
            attention, to drop some out), biases, positions ("rotary" rotates
            queries and keys by their positions here, `positions.rotate`; the
            others are the embedding's business) and qk_norm (each head's
            query and key RMS-normalised, with learned scales, before they
            are rotated, which keeps attention logits from growing).
        causal: as above.
        cross: keys and values come from a context given at call time; no
            rotary positions (the two sequences' positions do not compare).

    Call: x (B, T, C); context (B, S, C) for cross-attention; context_mask
    (B, S), True at the context's real (not padding) positions, all by
    default; for causal attention over rows that pack several texts,
    `packed`, from `PackedTexts.of`: each text is then attended as if it
    were alone -> (B, T, C). Causal attention decoding with a key/value
    cache takes `cache` (B, 2, K, S, D), holding keys (rotated, with rotary
    positions) and values for positions 0..S-1, and `placement`, from
    `CachePlacement.of`, where x's tokens go in it: the new keys and values
    are written there, each query sees the cache up to its own position,
    and the call returns (B, T, C) and the updated cache. `hooks`
    (`gptlite.model.hooks.Hooks`, for this layer's steps) see each step
    of `ATTENTION_STEPS` and may change it.
    """

    def __init__(self, config, causal=True, cross=False, **kwargs):
        super().__init__(**kwargs)
        if causal and cross:
            raise ValueError("cross-attention is not causal")
        self.config = config = GPTConfig.of(config)
        self.causal = causal
        self.cross = cross
        self.n_head, self.kv_heads, self.head_size = config.n_head, config.kv_heads, config.head_size
        self.rotary = config.position == "rotary" and not cross

    def build(self, input_shape):
        config, width = self.config, self.config.n_embd
        heads, kv_heads, size = self.n_head, self.kv_heads, self.head_size

        def linear(units, bias, name, input_width=width):
            layer = Linear(units, use_bias=bias, dtype=self.dtype_policy, name=name)
            layer.build((None, input_width))
            return layer

        if self.causal:
            self.qkv_projection = linear((heads + 2 * kv_heads) * size, config.qkv_has_bias, "qkv_projection")
        else:
            self.query_projection = linear(heads * size, config.qkv_has_bias, "query_projection")
            self.key_value_projection = linear(2 * kv_heads * size, config.qkv_has_bias, "key_value_projection")
        self.output_projection = linear(width, config.bias, "output_projection", heads * size)
        if config.qk_norm:
            self.query_norm = RMSNorm(config.norm_epsilon, dtype=self.dtype_policy, name="query_norm")
            self.key_norm = RMSNorm(config.norm_epsilon, dtype=self.dtype_policy, name="key_norm")
            self.query_norm.build((None, size))
            self.key_norm.build((None, size))
        self.weights_dropout = keras.layers.Dropout(config.attention_dropout, dtype=self.dtype_policy)
        self.output_dropout = keras.layers.Dropout(config.dropout, dtype=self.dtype_policy)

    def projections(self):
        """The layer's projections by LoRA target name: "qkv" (one layer, or the query's and the key/value's)
        and "attention_output"."""
        qkv = [self.qkv_projection] if self.causal else [self.query_projection, self.key_value_projection]
        return {"qkv": qkv, "attention_output": [self.output_projection]}

    def head_weights(self):
        """Each head's slice of the projections that make its query, key and value from the width-C vector, as
        float32 numpy arrays (LoRA merged), by the names of HEAD_WEIGHTS: `query_weight` (H, C, D), `key_weight` and `value_weight` (K, C, D),
        and where the projections have biases `query_bias` (H, D), `key_bias` and `value_bias` (K, D); head h's
        query of x (C,) is x @ query_weight[h] + query_bias[h]."""
        heads, kv_heads, size = self.n_head, self.kv_heads, self.head_size
        if self.causal:
            parts = [(self.qkv_projection, ("query", "key", "value"), [heads, kv_heads, kv_heads])]
        else:
            parts = [(self.query_projection, ("query",), [heads]),
                     (self.key_value_projection, ("key", "value"), [kv_heads, kv_heads])]
        found = {}
        for projection, names, counts in parts:
            kernel = weight_array(projection, "kernel")  # (C, (counts) D), the heads side by side
            splits = np.cumsum(counts)[:-1]
            by_head = np.split(kernel.reshape(kernel.shape[0], -1, size), splits, axis=1)  # each (C, n, D)
            found.update({f"{name}_weight": part.transpose(1, 0, 2) for name, part in zip(names, by_head)})
            if projection.bias is not None:
                bias = weight_array(projection, "bias").reshape(-1, size)
                found.update({f"{name}_bias": part for name, part in zip(names, np.split(bias, splits))})
        return found

    def call(self, x, context=None, context_mask=None, packed=None, training=None, cache=None, placement=None,
             hooks=None):
        if not self.causal:
            return self.attend(x, self.key_values(x if context is None else context, hooks), context_mask, training,
                               hooks)
        length = ops.shape(x)[1]
        if cache is not None:
            positions = placement.positions  # (B, T)
        else:
            positions = ops.arange(length) if packed is None else packed.positions  # (T,) or (B, T)
        query, key, value = self._project(x, self._angles(positions), hooks)  # (B, T, H|K, D)
        if cache is not None:
            query, key, value = (ops.transpose(part, (0, 2, 1, 3)) for part in (query, key, value))  # (B, H|K, T, D)
            cache = _write_cache(cache, key, value, placement)  # (B, 2, K, S, D)
            attended, _ = scaled_dot_product_attention(query, cache[:, 0], cache[:, 1], placement.mask, hooks=hooks)
            return self._joined(attended, hooks), cache
        mask = None if packed is None else packed.mask  # (B, 1, T, T)
        if hooks is None and not (training and self.config.attention_dropout > 0) and \
                _fused_attention_is_faster(self.compute_dtype):
            # The backend's fused attention (torch's scaled_dot_product_attention,
            # flash where it can; under XLA the same ops as below), on heads
            # that need no transposing.
            if self.kv_heads != self.n_head and not running().attends_grouped_heads:
                # JAX's takes fewer key/value heads as they are; the others' repeat them, or, for one, cannot.
                groups = self.n_head // self.kv_heads
                key, value = ops.repeat(key, groups, axis=2), ops.repeat(value, groups, axis=2)
            attended = ops.dot_product_attention(query, key, value, mask=mask, is_causal=mask is None)  # (B, T, H, D)
            merged = self.output_projection(ops.reshape(attended, (-1, length, self.n_head * self.head_size)))
            return self.output_dropout(merged, training=training)
        query, key, value = (ops.transpose(part, (0, 2, 1, 3)) for part in (query, key, value))  # (B, H|K, T, D)
        if mask is None:
            mask = causal_mask(length, length)  # (T, T), broadcast over B and H
        attended, _ = _attend_with_dropout(query, key, value, mask, self.weights_dropout, training, hooks)
        return self.output_dropout(self._joined(attended, hooks), training=training)

    def _joined(self, attended, hooks):
        """The heads' outputs attended (B, H, T, D) side by side and projected back to the width: (B, T, C)."""
        if hooks is not None and hooks.wants("head_outputs"):
            # Each head's share of the output projection: its D rows of the kernel (LoRA merged), its bias apart.
            kernel = ops.reshape(self.output_projection.merged_kernel(), (self.n_head, self.head_size, -1))
            hooks("head_outputs", ops.einsum("bhtd,hdc->bhtc", attended, ops.cast(kernel, attended.dtype)))
        return self.output_projection(seen(hooks, "joined", merge_heads(attended)))  # (B, T, H D) -> (B, T, C)

    def _project(self, x, angles, hooks=None):
        """Causal attention's queries (B, T, H, D), keys and values (B, T, K, D) of x, normed and rotated."""
        length = ops.shape(x)[1]
        qkv = ops.reshape(self.qkv_projection(x), (-1, length, self.n_head + 2 * self.kv_heads,
                                                   self.head_size))
        # Split rather than indexed three times: without XLA, TensorFlow's gradient of each index writes
        # a zero tensor of the whole (B, T, H + 2K, D); a split's gradient is one concatenation.
        query, key, value = ops.split(qkv, [self.n_head, self.n_head + self.kv_heads], axis=2)
        query, key = self._normed_and_rotated(query, "query", angles, hooks), \
            self._normed_and_rotated(key, "key", angles, hooks)
        return query, key, _seen_heads(hooks, "value", value)

    def _angles(self, positions):
        """Rotary positions' angles (..., D/2) for positions (...); None without rotary positions."""
        if not self.rotary:
            return None
        return position_kinds.rotary_angles(positions, self.head_size, self.config.rope_theta)

    def _normed_and_rotated(self, heads, part, angles, hooks=None):
        """Queries or keys (B, T, H|K, D), `part` saying which: RMS-normed with QK-norm, rotated by `angles`
        (None: not rotated). The one place where attention applies either, whatever its form; hooks see each."""
        heads = _seen_heads(hooks, part, heads)
        if self.config.qk_norm:
            heads = _seen_heads(hooks, f"{part}_normed", (self.query_norm if part == "query" else self.key_norm)(heads))
        return heads if angles is None else _seen_heads(hooks, f"{part}_rotated", position_kinds.rotate(heads, angles))

    def key_values(self, context, hooks=None):
        """The context's keys and values, (B, 2, K, S, D): computed once, attended from any number of queries."""
        length = ops.shape(context)[1]
        key_value = ops.reshape(self.key_value_projection(context), (-1, length, 2 * self.kv_heads,
                                                                      self.head_size))
        key, value = ops.split(key_value, 2, axis=2)  # each (B, S, K, D)
        key = self._normed_and_rotated(key, "key", self._angles(ops.arange(length)), hooks)
        value = _seen_heads(hooks, "value", value)
        return ops.stack([ops.transpose(key, (0, 2, 1, 3)), ops.transpose(value, (0, 2, 1, 3))], axis=1)

    def attend(self, x, key_values, context_mask=None, training=None, hooks=None):
        """As `call`, over keys and values from `key_values`, for attention that is not causal."""
        length = ops.shape(x)[1]
        query = ops.reshape(self.query_projection(x), (-1, length, self.n_head, self.head_size))  # (B, T, H, D)
        query = self._normed_and_rotated(query, "query", self._angles(ops.arange(length)), hooks)
        query = ops.transpose(query, (0, 2, 1, 3))  # (B, H, T, D)
        mask = None if context_mask is None else ops.cast(context_mask, "bool")[:, None, None, :]  # (B, 1, 1, S)
        attended, _ = _attend_with_dropout(query, key_values[:, 0], key_values[:, 1], mask, self.weights_dropout,
                                           training, hooks)  # (B, H, T, D)
        return self.output_dropout(self._joined(attended, hooks), training=training)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update(config=dataclasses.asdict(self.config), causal=self.causal, cross=self.cross)
        return config


def _seen_heads(hooks, step, heads):
    """Queries, keys or values (B, T, H|K, D) through `hooks` as `step`, which see them heads first."""
    if hooks is None or not hooks.wants(step):
        return heads
    return ops.transpose(hooks(step, ops.transpose(heads, (0, 2, 1, 3))), (0, 2, 1, 3))


@functools.cache
def _fused_attention_is_faster(compute_dtype):
    """Whether `ops.dot_product_attention` beats the step-by-step ops here.

    It does but for torch on a CPU in 16 bits (the backend's runtime says).
    """
    return running().fused_attention_is_faster(compute_dtype)


class CachePlacement(collections.namedtuple("CachePlacement", "positions mask indices slots")):
    """Where one call's new tokens go in a key/value cache, the same for every layer of a model.

    positions (B, T): each new token's position; mask (B, 1, T, S): True
    where a new token may attend a cached one; for one token per row (a
    decode step), indices (B*2*K, 4): the (row, key or value, head, slot) of
    each row of D numbers to scatter, else None; for several, slots (B, T, S):
    1 where a new token goes, else None.
    """

    @classmethod
    def of(cls, start_positions, length, cache):
        """For `length` new tokens per row, row b's from start_positions[b] (B,), in cache (B, 2, K, S, D)."""
        cache_length = ops.shape(cache)[3]
        positions = token_positions(start_positions, length)  # (B, T)
        mask = ops.greater_equal(positions[..., None], ops.arange(cache_length))[:, None]  # (B, 1, T, S)
        indices = slots = None
        if length == 1 and cache.shape[3] != 1:
            batch_size, _, heads = ops.shape(cache)[:3]
            b, kv, h = ops.meshgrid(ops.arange(batch_size), ops.arange(2), ops.arange(heads), indexing="ij")
            slot = ops.broadcast_to(ops.reshape(positions[:, 0], (-1, 1, 1)), ops.shape(b))  # (B, 2, K)
            # Whole rows of D numbers: an index per (row, key or value, head), not per number.
            indices = ops.reshape(ops.stack([b, kv, h, slot], axis=-1), (-1, 4))
        elif length != cache.shape[3]:
            slots = ops.cast(ops.equal(positions[:, :, None], ops.arange(cache_length)[None, None, :]),
                             cache.dtype)  # (B, T, S)
        return cls(positions, mask, indices, slots)


def _write_cache(cache, key, value, placement):
    """Put new keys and values (B, K, T, D) where `placement` says in the cache (B, 2, K, S, D)."""
    length, cache_length = key.shape[2], cache.shape[3]
    if length == cache_length:  # a whole window, necessarily from position 0
        return ops.stack([key, value], axis=1)
    if length == 1:
        # One token per row (each decode step): scatter just its key and value
        # instead of rewriting the cache.
        updates = ops.reshape(ops.stack([key[:, :, 0], value[:, :, 0]], axis=1), (-1, key.shape[-1]))  # (B*2*K, D)
        return ops.scatter_update(cache, placement.indices, updates)
    slots = ops.cast(placement.slots, key.dtype)  # (B, T, S)
    written = ops.max(slots, axis=1)[:, None, :, None]  # (B, 1, S, 1)
    new_keys_and_values = ops.stack(
        [ops.einsum("bts,bhtd->bhsd", slots, key), ops.einsum("bts,bhtd->bhsd", slots, value)], axis=1
    )  # (B, 2, K, S, D)
    return cache * (1 - written[:, None]) + new_keys_and_values


def _attend_with_dropout(query, key, value, mask, dropout_layer, training, hooks=None):
    """Attention whose weights pass through dropout in training; the weights returned are pre-dropout."""
    if not training or dropout_layer.rate == 0:
        return scaled_dot_product_attention(query, key, value, mask, hooks=hooks)
    return scaled_dot_product_attention(query, key, value, mask,
                                        lambda weights: dropout_layer(weights, training=training), hooks)
