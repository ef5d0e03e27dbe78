"""The model's building blocks, as Keras layers written with `keras.ops` only.

Shape letters used in comments:
    B batch, T sequence length (queries), S sequence length (keys),
    C model width (n_embd), H query heads, K key/value heads (H for full
    multi-head attention, fewer for grouped-query attention), G = H / K query
    heads per key/value head, D head size (C / H), F feed-forward width,
    V vocabulary size.
"""

import collections
import functools
import math

import keras
import ml_dtypes
from keras import ops

from gptlite import positions as position_kinds
from gptlite.positions import token_positions
from gptlite.settings import MLPS, NORMS, POSITIONS

register = keras.saving.register_keras_serializable(package="gptlite")

# GPT-2's initialisation: every matrix starts as N(0, 0.02^2).
_INIT_STDDEV = 0.02


def _normal_init():
    return keras.initializers.RandomNormal(stddev=_INIT_STDDEV)


def feed_forward_width(width, mlp):
    """The feed-forward's hidden width F by default: 4C for GELU; for SwiGLU, whose three matrices would
    otherwise hold 1.5x GELU's two, 8C/3 rounded up to a multiple of 16 (the same weights, near enough)."""
    if mlp == "gelu":
        return 4 * width
    return -(-8 * width // (3 * 16)) * 16


@register
class Linear(keras.layers.Layer):
    """y = x W + b, which can carry LoRA adapters.

    `enable_lora(rank, alpha)` freezes W and b and adds A (in, rank) and
    B (rank, out), B starting at zero; the layer then computes
    x W + b + (alpha / rank) (x A) B without merging the adapters into W, so
    training needs no gradient of the whole W, only of A and B, which makes a
    LoRA step cheaper. A saved layer holds the merged kernel
    (`merged_kernel()`) and no adapters, as Keras's Dense does, and loads into
    a layer with or without them.

    Args:
        units: the output width.
        use_bias: whether it adds a bias b.

    Call: x (..., in) -> (..., units).
    """

    def __init__(self, units, use_bias=True, **kwargs):
        super().__init__(**kwargs)
        self.units = units
        self.use_bias = use_bias
        self.lora_rank = 0
        self.lora_alpha = None

    def build(self, input_shape):
        self.kernel = self.add_weight(name="kernel", shape=(input_shape[-1], self.units), initializer=_normal_init())
        self.bias = self.add_weight(name="bias", shape=(self.units,), initializer="zeros") if self.use_bias else None

    @property
    def lora_enabled(self):
        return self.lora_rank > 0

    def enable_lora(self, rank, alpha=None):
        """Freeze the kernel and bias and add adapters of `rank`, scaled by alpha / rank (alpha: the rank)."""
        if self.lora_enabled:
            raise ValueError("this layer has adapters already")
        # Keras locks a built layer's state; adapters come after building, as in Keras's own Dense.enable_lora.
        self._tracker.unlock()
        try:
            self.lora_a = self.add_weight(name="lora_a", shape=(self.kernel.shape[0], rank),
                                          initializer=keras.initializers.HeUniform(), dtype="float32")
            self.lora_b = self.add_weight(name="lora_b", shape=(rank, self.units), initializer="zeros",
                                          dtype="float32")
        finally:
            self._tracker.lock()
        self.kernel.trainable = False
        if self.bias is not None:
            self.bias.trainable = False
        self.lora_rank, self.lora_alpha = rank, rank if alpha is None else alpha

    def merged_kernel(self):
        """W with the adapters, if any, added: what the layer computes, as one matrix."""
        if not self.lora_enabled:
            return self.kernel.value
        scale = self.lora_alpha / self.lora_rank
        update = ops.matmul(self.lora_a.value, self.lora_b.value) * scale
        return self.kernel.value + ops.cast(update, self.kernel.dtype)

    def call(self, x):
        if not self.lora_enabled:
            y = ops.matmul(x, self.kernel)
        else:
            # Rows as one matrix: three 2-D products, where (B, T, in) operands make
            # TensorFlow build each product from a dozen shape operations.
            rows = ops.reshape(x, (-1, ops.shape(x)[-1]))  # (B*T, in)
            adapted = ops.matmul(ops.matmul(rows, self.lora_a), self.lora_b)  # (B*T, out)
            scale = self.lora_alpha / self.lora_rank
            y = ops.matmul(rows, self.kernel) + (adapted if scale == 1 else scale * adapted)
            y = ops.reshape(y, (*ops.shape(x)[:-1], self.units))
        return y if self.bias is None else y + self.bias

    def save_own_variables(self, store):
        store["0"] = self.merged_kernel()
        if self.bias is not None:
            store["1"] = self.bias.value

    def load_own_variables(self, store):
        self.kernel.assign(store["0"])
        if self.bias is not None:
            self.bias.assign(store["1"])
        if self.lora_enabled:  # the kernel loaded holds what the adapters added: they start again from zero
            self.lora_b.assign(ops.zeros(self.lora_b.shape, self.lora_b.dtype))

    def compute_output_shape(self, input_shape):
        return (*input_shape[:-1], self.units)

    def get_config(self):
        config = super().get_config()
        config.update(units=self.units, use_bias=self.use_bias)
        return config


@register
class RMSNorm(keras.layers.Layer):
    """x / sqrt(mean(x^2) + epsilon) * gamma, over the last axis, computed in float32.

    LayerNorm without its centring and shift (Zhang and Sennrich, 2019):
    cheaper, and what Llama-family models use. (..., C) -> (..., C).
    """

    def __init__(self, epsilon=1e-5, **kwargs):
        super().__init__(**kwargs)
        self.epsilon = epsilon

    def build(self, input_shape):
        self.gamma = self.add_weight(name="gamma", shape=(input_shape[-1],), initializer="ones")

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


def make_norm(kind, epsilon, use_bias, dtype, name):
    """A LayerNorm ("layer"; with a shift where use_bias) or an RMSNorm ("rms")."""
    if kind == "rms":
        return RMSNorm(epsilon, dtype=dtype, name=name)
    return keras.layers.LayerNormalization(epsilon=epsilon, center=use_bias, dtype=dtype, name=name)


@register
class TokenAndPositionEmbedding(keras.layers.Layer):
    """Token embedding, with the position table added where positions are one, and the output head.

    Args:
        vocabulary_size: number of token ids.
        sequence_length: the longest sequence the position table covers.
        embedding_dim: model width C.
        position: "learned" (a trained table), "sinusoidal" (the fixed table
            of `positions.sinusoidal_position_encoding`, computed once), or
            "rotary" (no table: attention rotates queries and keys).
        tie_weights: whether `logits()` reuses the token embedding matrix as
            the output projection (True) or has a matrix of its own.

    Call: token ids (B, T) with T <= sequence_length -> embeddings (B, T, C).
    """

    def __init__(
        self,
        vocabulary_size,
        sequence_length,
        embedding_dim,
        position="learned",
        tie_weights=True,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if position not in POSITIONS:
            raise ValueError(f"position must be one of {', '.join(POSITIONS)}, got {position!r}")
        self.vocabulary_size = vocabulary_size
        self.sequence_length = sequence_length
        self.embedding_dim = embedding_dim
        self.position = position
        self.tie_weights = tie_weights
        # Keras's ReversibleEmbedding holds the embedding and, tied or not, the
        # output projection, so both paths save and load the same way.
        self.token_embedding = keras.layers.ReversibleEmbedding(
            vocabulary_size,
            embedding_dim,
            tie_weights=tie_weights,
            embeddings_initializer=_normal_init(),
            reverse_dtype="float32",
            dtype=self.dtype_policy,
            name="token_embedding",
        )

    def build(self, input_shape):
        self.token_embedding.build(input_shape)
        self.position_embeddings = None
        if self.position == "learned":
            self.position_embeddings = self.add_weight(
                name="position_embeddings",
                shape=(self.sequence_length, self.embedding_dim),
                initializer=_normal_init(),
            )
        elif self.position == "sinusoidal":
            # A non-trainable weight rather than a constant tensor: it is built
            # outside any traced function, and it travels inside model.keras.
            self.position_embeddings = self.add_weight(
                name="position_encoding",
                shape=(self.sequence_length, self.embedding_dim),
                initializer="zeros",
                trainable=False,
            )
            self.position_embeddings.assign(
                position_kinds.sinusoidal_position_encoding(self.sequence_length, self.embedding_dim)
            )

    def call(self, token_ids, start_positions=None):
        """token_ids (B, T); start_positions (B,), the position of each row's first token (default 0)."""
        tokens = self.token_embedding(token_ids)  # (B, T, C)
        if self.position_embeddings is None:
            return tokens
        length = ops.shape(token_ids)[-1]
        # The variable's value, not the variable: JAX no longer converts one inside ops.
        table = self.position_embeddings.value  # (block_size, C)
        if start_positions is None:
            positions = ops.slice(table, (0, 0), (length, self.embedding_dim))  # (T, C)
        else:
            indices = token_positions(start_positions, length)  # (B, T)
            positions = ops.take(table, indices, axis=0)  # (B, T, C)
        return tokens + ops.cast(positions, tokens.dtype)

    def logits(self, hidden):
        """Project hidden states (B, T, C) to float32 vocabulary logits (B, T, V)."""
        return self.token_embedding(hidden, reverse=True)

    def compute_output_shape(self, input_shape):
        return (*input_shape, self.embedding_dim)

    def get_config(self):
        config = super().get_config()
        config.update(
            vocabulary_size=self.vocabulary_size,
            sequence_length=self.sequence_length,
            embedding_dim=self.embedding_dim,
            position=self.position,
            tie_weights=self.tie_weights,
        )
        return config


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


def scaled_dot_product_attention(query, key, value, mask=None, weights_dropout=None):
    """softmax(Q K^T / sqrt(D) + mask) V, and the attention weights.

    query (B, H, T, D), key and value (B, K, S, D), where K divides H: query
    heads h = k G .. k G + G - 1 share key/value head k (grouped-query
    attention; K = H is plain multi-head attention), read without copying
    the keys and values G times. mask broadcastable to (B, H, T, S) with True
    where attending is allowed. Masked scores are set to the most negative
    number of the compute dtype rather than -inf, so a row with nothing
    visible gives uniform weights instead of NaN. `weights_dropout`, a
    function, drops some weights before they weigh the values; the weights
    returned are those before it.
    """
    heads, length, head_size = query.shape[1], ops.shape(query)[2], ops.shape(query)[3]
    groups = heads // key.shape[1]
    if groups > 1:  # (B, K, G, T, D) against (B, K, 1, S, D)
        query = ops.reshape(query, (-1, key.shape[1], groups, length, head_size))
        key, value = key[:, :, None], value[:, :, None]
    scores = ops.matmul(query, ops.swapaxes(key, -1, -2))  # (B, H, T, S), or (B, K, G, T, S)
    scores = scores / ops.cast(math.sqrt(head_size), scores.dtype)
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
    attended = ops.matmul(weights if weights_dropout is None else weights_dropout(weights), value)
    if groups > 1:
        attended = ops.reshape(attended, (-1, heads, length, head_size))
        weights = ops.reshape(weights, (-1, heads, length, ops.shape(weights)[-1]))
    return attended, weights  # (B, H, T, D), (B, H, T, S)


def merge_heads(x):
    """(B, H, T, D) -> (B, T, C)."""
    heads, length, head_size = ops.shape(x)[1], ops.shape(x)[2], ops.shape(x)[3]
    return ops.reshape(ops.transpose(x, (0, 2, 1, 3)), (-1, length, heads * head_size))


@register
class Attention(keras.layers.Layer):
    """Multi-head attention, in each of the forms a transformer needs.

    - causal: a decoder's self-attention, where each position sees itself
      and earlier ones, and which can decode with a key/value cache
      (`call_with_cache`). Queries, keys and values come from one fused
      projection, `qkv_projection`: one matmul.
    - not causal: attention over a context that may be padded, the input
      itself (an encoder's self-attention) or another sequence (a decoder's
      cross-attention, `cross=True`). Queries come from `query_projection`;
      keys and values from `key_value_projection`, computed once per context
      (`key_values`) and attended from any number of queries (`attend`).

    Args:
        num_heads: H; the width must divide by it, unless head_dim is given.
        num_kv_heads: K, heads of keys and values (None: H). Fewer than H is
            grouped-query attention (1: multi-query): G = H / K query heads
            share each key/value head, and a key/value cache holds K heads.
        causal: as above.
        cross: keys and values come from a context given at call time; no
            rotary positions (the two sequences' positions do not compare).
        dropout: rate for the output.
        attention_dropout: rate for the attention weights. Above zero,
            training computes the weights step by step instead of with the
            backend's fused (flash) attention, to drop some out.
        use_bias: whether the projections have biases.
        qkv_bias: whether the query, key and value projections do (None:
            use_bias); Qwen2 has them there only.
        rotary: rotate queries and keys by their positions (`positions.rotate`).
        rope_theta: the rotary base: the slowest pair turns once in about
            2 pi theta positions.
        qk_norm: RMS-normalise each head's query and key, with learned scales,
            before rotating them, which keeps attention logits from growing.
        norm_epsilon: for qk_norm.
        head_dim: D, each head's size (None: C / H); Qwen3's heads are wider
            than that, and their H D wide output is projected back to C.

    Call: x (B, T, C); context (B, S, C) for cross-attention; context_mask
    (B, S), True at the context's real (not padding) positions, all by
    default -> (B, T, C); with `return_attention_scores=True`, also the
    attention weights (B, H, T, S) before dropout.
    """

    def __init__(self, num_heads, num_kv_heads=None, causal=True, cross=False, dropout=0.0, attention_dropout=0.0,
                 use_bias=True, qkv_bias=None, rotary=False, rope_theta=position_kinds.DEFAULT_ROPE_THETA,
                 qk_norm=False, norm_epsilon=1e-5, head_dim=None, **kwargs):
        super().__init__(**kwargs)
        if causal and cross:
            raise ValueError("cross-attention is not causal")
        self.num_heads = num_heads
        self.num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        if num_heads % self.num_kv_heads != 0:
            raise ValueError(f"the heads ({num_heads}) must divide by the key/value heads ({self.num_kv_heads})")
        self.causal = causal
        self.cross = cross
        self.dropout = dropout
        self.attention_dropout_rate = attention_dropout
        self.use_bias = use_bias
        self.qkv_bias = use_bias if qkv_bias is None else qkv_bias
        self.rotary = rotary and not cross
        self.rope_theta = rope_theta
        self.qk_norm = qk_norm
        self.norm_epsilon = norm_epsilon
        self.head_dim = head_dim

    def build(self, input_shape):
        width = input_shape[-1]
        if width % self.num_heads != 0 and self.head_dim is None:
            raise ValueError(f"the width ({width}) must be divisible by the number of heads ({self.num_heads})")
        self.head_size = self.head_dim or width // self.num_heads
        if self.rotary and self.head_size % 2:
            raise ValueError(f"rotary positions turn pairs of dimensions; the head size ({self.head_size}) is odd")
        heads, kv_heads, size = self.num_heads, self.num_kv_heads, self.head_size

        def linear(units, use_bias, name, input_width=width):
            layer = Linear(units, use_bias=use_bias, dtype=self.dtype_policy, name=name)
            layer.build((None, input_width))
            return layer

        if self.causal:
            self.qkv_projection = linear((heads + 2 * kv_heads) * size, self.qkv_bias, "qkv_projection")
        else:
            self.query_projection = linear(heads * size, self.qkv_bias, "query_projection")
            self.key_value_projection = linear(2 * kv_heads * size, self.qkv_bias, "key_value_projection")
        self.output_projection = linear(width, self.use_bias, "output_projection", heads * size)
        if self.qk_norm:
            self.query_norm = RMSNorm(self.norm_epsilon, dtype=self.dtype_policy, name="query_norm")
            self.key_norm = RMSNorm(self.norm_epsilon, dtype=self.dtype_policy, name="key_norm")
            self.query_norm.build((None, size))
            self.key_norm.build((None, size))
        self.weights_dropout = keras.layers.Dropout(self.attention_dropout_rate, dtype=self.dtype_policy)
        self.output_dropout = keras.layers.Dropout(self.dropout, dtype=self.dtype_policy)

    def projections(self):
        """The layer's projections by LoRA target name: "qkv" (one layer, or the query's and the key/value's)
        and "attention_output"."""
        qkv = [self.qkv_projection] if self.causal else [self.query_projection, self.key_value_projection]
        return {"qkv": qkv, "attention_output": [self.output_projection]}

    def call(self, x, context=None, context_mask=None, training=None, return_attention_scores=False):
        if not self.causal:
            key_values = self.key_values(x if context is None else context)
            return self.attend(x, key_values, context_mask, training, return_attention_scores)
        length = ops.shape(x)[1]
        query, key, value = self._project(x, self._angles(ops.arange(length)))
        weights_needed = return_attention_scores or (training and self.attention_dropout_rate > 0)
        if not weights_needed and _fused_attention_is_faster(self.compute_dtype):
            # The backend's fused attention (torch's scaled_dot_product_attention,
            # flash where it can; under XLA the same ops as below), on heads
            # that need no transposing.
            if self.num_kv_heads != self.num_heads and keras.backend.backend() != "jax":
                # JAX's takes fewer key/value heads as they are; the others' repeat them, or, for one, cannot.
                groups = self.num_heads // self.num_kv_heads
                key, value = ops.repeat(key, groups, axis=2), ops.repeat(value, groups, axis=2)
            attended = ops.dot_product_attention(query, key, value, is_causal=True)  # (B, T, H, D)
            merged = self.output_projection(ops.reshape(attended, (-1, length, self.num_heads * self.head_size)))
            return self.output_dropout(merged, training=training)
        query, key, value = (ops.transpose(part, (0, 2, 1, 3)) for part in (query, key, value))  # (B, H|K, T, D)
        mask = causal_mask(length, length)  # (T, T), broadcast over B and H
        attended, weights = _attend_with_dropout(query, key, value, mask, self.weights_dropout, training)
        output = self.output_dropout(self.output_projection(merge_heads(attended)), training=training)
        return (output, weights) if return_attention_scores else output

    def call_with_cache(self, x, cache, start_positions, placement=None):
        """Attend from new tokens over a key/value cache, and return the updated cache.

        Causal attention only. x (B, T, C) holds tokens at positions
        start_positions[b] + t; cache (B, 2, K, S, D) holds keys (rotated, with
        rotary positions) and values for positions 0..S-1, of which those
        before start_positions[b] are filled. The new keys and values are
        written at their positions; each query then sees the cache up to its
        own position. `placement`, from `CachePlacement.of`, is where they
        go, computed once for every layer of a model. Returns (B, T, C) and
        the cache.
        """
        if placement is None:
            placement = CachePlacement.of(start_positions, ops.shape(x)[1], cache)
        query, key, value = (ops.transpose(part, (0, 2, 1, 3))
                             for part in self._project(x, self._angles(placement.positions)))
        cache = _write_cache(cache, key, value, placement)  # (B, 2, K, S, D)
        attended, _ = scaled_dot_product_attention(query, cache[:, 0], cache[:, 1], placement.mask)  # (B, H, T, D)
        return self.output_projection(merge_heads(attended)), cache

    def _project(self, x, angles):
        """Causal attention's queries (B, T, H, D), keys and values (B, T, K, D) of x, normed and rotated."""
        length = ops.shape(x)[1]
        qkv = ops.reshape(self.qkv_projection(x), (-1, length, self.num_heads + 2 * self.num_kv_heads,
                                                   self.head_size))
        # Split rather than indexed three times: without XLA, TensorFlow's gradient of each index writes
        # a zero tensor of the whole (B, T, H + 2K, D); a split's gradient is one concatenation.
        query, key, value = ops.split(qkv, [self.num_heads, self.num_heads + self.num_kv_heads], axis=2)
        return (*self._normed_and_rotated(query, key, angles), value)

    def _angles(self, positions):
        """Rotary positions' angles (..., D/2) for positions (...); None without rotary positions."""
        return position_kinds.rotary_angles(positions, self.head_size, self.rope_theta) if self.rotary else None

    def _normed_and_rotated(self, query, key, angles):
        if self.qk_norm:
            query, key = self.query_norm(query), self.key_norm(key)
        if angles is not None:
            query, key = position_kinds.rotate(query, angles), position_kinds.rotate(key, angles)
        return query, key

    def key_values(self, context):
        """The context's keys and values, (B, 2, K, S, D): computed once, attended from any number of queries."""
        length = ops.shape(context)[1]
        key_value = ops.reshape(self.key_value_projection(context), (-1, length, 2 * self.num_kv_heads,
                                                                      self.head_size))
        key, value = ops.split(key_value, 2, axis=2)  # each (B, S, K, D)
        if self.qk_norm:
            key = self.key_norm(key)
        if self.rotary:
            key = position_kinds.rotate(key, self._angles(ops.arange(length)))
        return ops.stack([ops.transpose(key, (0, 2, 1, 3)), ops.transpose(value, (0, 2, 1, 3))], axis=1)

    def attend(self, x, key_values, context_mask=None, training=None, return_attention_scores=False):
        """As `call`, over keys and values from `key_values`, for attention that is not causal."""
        length = ops.shape(x)[1]
        query = ops.reshape(self.query_projection(x), (-1, length, self.num_heads, self.head_size))  # (B, T, H, D)
        if self.qk_norm:
            query = self.query_norm(query)
        if self.rotary:
            query = position_kinds.rotate(query, self._angles(ops.arange(length)))
        query = ops.transpose(query, (0, 2, 1, 3))  # (B, H, T, D)
        mask = None if context_mask is None else ops.cast(context_mask, "bool")[:, None, None, :]  # (B, 1, 1, S)
        attended, weights = _attend_with_dropout(
            query, key_values[:, 0], key_values[:, 1], mask, self.weights_dropout, training
        )  # (B, H, T, D), (B, H, T, S)
        output = self.output_dropout(self.output_projection(merge_heads(attended)), training=training)
        return (output, weights) if return_attention_scores else output

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update(num_heads=self.num_heads, num_kv_heads=self.num_kv_heads, causal=self.causal,
                      cross=self.cross, dropout=self.dropout, attention_dropout=self.attention_dropout_rate,
                      use_bias=self.use_bias, qkv_bias=self.qkv_bias, rotary=self.rotary,
                      rope_theta=self.rope_theta, qk_norm=self.qk_norm, norm_epsilon=self.norm_epsilon,
                      head_dim=self.head_dim)
        return config


@functools.cache
def _fused_attention_is_faster(compute_dtype):
    """Whether `ops.dot_product_attention` beats the step-by-step ops here.

    It does but for torch on a CPU in 16 bits, where torch's flash kernel is
    slower than plain matmuls and softmax (BENCHMARKS.md, "Fused attention").
    """
    if keras.backend.backend() != "torch" or compute_dtype == "float32":
        return True
    import torch

    return torch.cuda.is_available() or torch.backends.mps.is_available()


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


def _attend_with_dropout(query, key, value, mask, dropout_layer, training):
    """Attention whose weights pass through dropout in training; the weights returned are pre-dropout."""
    if not training or dropout_layer.rate == 0:
        return scaled_dot_product_attention(query, key, value, mask)
    return scaled_dot_product_attention(query, key, value, mask,
                                        lambda weights: dropout_layer(weights, training=training))


def gelu(x, recompute_gradient=False):
    """GELU with GPT-2's tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).

    recompute_gradient: under TensorFlow, compute the gradient again from x
        alone. TensorFlow's own gradient of the formula keeps four more
        tensors of the feed-forward's width per block until the backward
        pass, which matters where no XLA fuses them: on GPT-2 small at
        context 256 they held ~90 MB of a LoRA step's peak memory.
    """
    if not recompute_gradient or keras.backend.backend() != "tensorflow":
        return ops.gelu(x, approximate=True)
    return ops.custom_gradient(_gelu_recomputing_gradient)(x)


def _gelu_recomputing_gradient(x):
    scale = math.sqrt(2 / math.pi)

    def gradient(*args, upstream=None):
        upstream = args[0] if upstream is None else upstream
        tanh = ops.tanh(scale * (x + 0.044715 * x * x * x))
        slope = 0.5 * (1 + tanh) + 0.5 * x * (1 - tanh * tanh) * scale * (1 + 3 * 0.044715 * x * x)
        return upstream * slope

    return ops.gelu(x, approximate=True), gradient



@register
class FeedForward(keras.layers.Layer):
    """The position-wise feed-forward network, then dropout. (B, T, C) -> (B, T, C).

    mlp "gelu" (GPT-2's): x -> gelu(x W1) W2, with W1 `expand` (C, F) and
    W2 `contract` (F, C). mlp "swiglu" (Shazeer 2020; Llama's):
    x -> (silu(x W_gate) * (x W_up)) W_down, with W_gate and W_up side by
    side in `expand` (C, 2F): one matmul; W_down is `contract`.

    Args:
        dropout: rate for the output.
        use_bias: whether the projections have biases.
        mlp: "gelu" or "swiglu".
        hidden_size: F (None: `feed_forward_width`'s default for the width).
    """

    def __init__(self, dropout=0.0, use_bias=True, mlp="gelu", hidden_size=None, **kwargs):
        super().__init__(**kwargs)
        if mlp not in MLPS:
            raise ValueError(f"mlp must be one of {', '.join(MLPS)}, got {mlp!r}")
        self.dropout = dropout
        self.use_bias = use_bias
        self.mlp = mlp
        self.hidden_size = hidden_size

    def build(self, input_shape):
        width = input_shape[-1]
        hidden = self.hidden_size or feed_forward_width(width, self.mlp)
        self.expand = Linear(hidden * (2 if self.mlp == "swiglu" else 1), use_bias=self.use_bias,
                             dtype=self.dtype_policy, name="expand")
        self.expand.build(input_shape)
        self.contract = Linear(width, use_bias=self.use_bias, dtype=self.dtype_policy, name="contract")
        self.contract.build((*input_shape[:-1], hidden))
        self.output_dropout = keras.layers.Dropout(self.dropout, dtype=self.dtype_policy)

    def projections(self):
        """The layer's projections by LoRA target name: "expand" (gate and up, for SwiGLU) and "contract"."""
        return {"expand": [self.expand], "contract": [self.contract]}

    def call(self, x, training=None):
        if self.mlp == "swiglu":
            gate, up = ops.split(self.expand(x), 2, axis=-1)  # each (B, T, F)
            hidden = ops.silu(gate) * up
        else:
            # A LoRA step runs without XLA on TensorFlow (training.compile_for_training).
            adapted = self.expand.lora_enabled or self.contract.lora_enabled
            hidden = gelu(self.expand(x), recompute_gradient=adapted)  # (B, T, F)
        return self.output_dropout(self.contract(hidden), training=training)  # (B, T, C)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update(dropout=self.dropout, use_bias=self.use_bias, mlp=self.mlp, hidden_size=self.hidden_size)
        return config


@register
class TransformerBlock(keras.layers.Layer):
    """Pre-norm block: x + self_attention(norm(x)), [x + cross_attention(norm(x), context),]
    then x + feed_forward(norm(x)).

    Normalising before each sublayer keeps the residual path an identity,
    which lets deep stacks train without a careful learning-rate warm-up.

    Args:
        num_heads, num_kv_heads, dropout, attention_dropout, use_bias,
            qkv_bias, rope_theta, qk_norm, head_dim: as for `Attention`.
        norm_epsilon: for the norms.
        causal: self-attention sees only earlier positions; False sees every
            position that is not padding.
        cross_attention: a decoder block of an encoder–decoder: after
            self-attention, attend over the encoder's output.
        norm: "layer" (LayerNorm) or "rms" (RMSNorm).
        mlp, mlp_hidden_size: the feed-forward's kind and width F (`FeedForward`).
        rotary: self-attention rotates queries and keys by position.

    Call: x (B, T, C) -> (B, T, C). `padding_mask` (B, T), True at x's real
    positions, hides padding from non-causal self-attention (causal
    attention needs none: padding comes last, after every real token).
    `context` (B, S, C) and `context_mask` (B, S) are what cross-attention
    attends over. With `return_attention_scores=True`, also the
    self-attention weights (B, H, T, T), and with cross-attention those
    too, (B, H, T, S).
    """

    def __init__(self, num_heads, num_kv_heads=None, dropout=0.0, use_bias=True, norm_epsilon=1e-5,
                 attention_dropout=0.0, causal=True, cross_attention=False, norm="layer", mlp="gelu",
                 mlp_hidden_size=None, qkv_bias=None, rotary=False, rope_theta=position_kinds.DEFAULT_ROPE_THETA,
                 qk_norm=False, head_dim=None, **kwargs):
        super().__init__(**kwargs)
        if norm not in NORMS:
            raise ValueError(f"norm must be one of {', '.join(NORMS)}, got {norm!r}")
        self.num_heads = num_heads
        self.num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        self.dropout = dropout
        self.use_bias = use_bias
        self.norm_epsilon = norm_epsilon
        self.attention_dropout = attention_dropout
        self.causal = causal
        self.has_cross_attention = cross_attention
        self.norm = norm
        self.mlp = mlp
        self.mlp_hidden_size = mlp_hidden_size
        self.qkv_bias = use_bias if qkv_bias is None else qkv_bias
        self.rotary = rotary
        self.rope_theta = rope_theta
        self.qk_norm = qk_norm
        self.head_dim = head_dim

    def build(self, input_shape):
        def norm(name):
            layer = make_norm(self.norm, self.norm_epsilon, self.use_bias, self.dtype_policy, name)
            layer.build(input_shape)
            return layer

        def attention(name, causal, cross=False):
            layer = Attention(self.num_heads, self.num_kv_heads, causal=causal, cross=cross, dropout=self.dropout,
                              attention_dropout=self.attention_dropout, use_bias=self.use_bias,
                              qkv_bias=self.qkv_bias, rotary=self.rotary, rope_theta=self.rope_theta,
                              qk_norm=self.qk_norm, norm_epsilon=self.norm_epsilon, head_dim=self.head_dim,
                              dtype=self.dtype_policy, name=name)
            layer.build(input_shape)
            return layer

        self.attention_norm = norm("attention_norm")
        self.attention = attention("attention", self.causal)
        if self.has_cross_attention:
            self.cross_attention_norm = norm("cross_attention_norm")
            self.cross_attention = attention("cross_attention", causal=False, cross=True)
        self.feed_forward_norm = norm("feed_forward_norm")
        self.feed_forward = FeedForward(dropout=self.dropout, use_bias=self.use_bias, mlp=self.mlp,
                                        hidden_size=self.mlp_hidden_size, dtype=self.dtype_policy,
                                        name="feed_forward")
        self.feed_forward.build(input_shape)

    def projections(self):
        """Every projection of the block by LoRA target name (`settings.LORA_TARGETS`): a list of `Linear`s each."""
        found = {**self.attention.projections(), **self.feed_forward.projections()}
        if self.has_cross_attention:
            for name, layers in self.cross_attention.projections().items():
                found[name] = found[name] + layers
        return found

    def call(self, x, padding_mask=None, context=None, context_mask=None, training=None,
             return_attention_scores=False):
        scores = return_attention_scores
        attended = self.attention(self.attention_norm(x), context_mask=None if self.causal else padding_mask,
                                  training=training, return_attention_scores=scores)
        attended, *weights = attended if scores else (attended,)
        x = x + attended
        if self.has_cross_attention:
            attended = self.cross_attention(self.cross_attention_norm(x), context, context_mask,
                                            training=training, return_attention_scores=scores)
            attended, *cross_weights = attended if scores else (attended,)
            x = x + attended
            weights += cross_weights
        x = x + self.feed_forward(self.feed_forward_norm(x), training=training)
        return (x, *weights) if scores else x

    def call_with_cache(self, x, cache, start_positions, cross_key_values=None, context_mask=None, placement=None):
        """As `call`, for inference, attending over a key/value cache; returns (x, cache).

        A causal block only. With cross-attention, `cross_key_values` are the
        context's, from `cross_attention.key_values(context)`, computed once;
        so can `placement` be (see `Attention.call_with_cache`).
        """
        attended, cache = self.attention.call_with_cache(self.attention_norm(x), cache, start_positions, placement)
        x = x + attended
        if self.has_cross_attention:
            x = x + self.cross_attention.attend(self.cross_attention_norm(x), cross_key_values, context_mask)
        x = x + self.feed_forward(self.feed_forward_norm(x))
        return x, cache

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update(
            num_heads=self.num_heads, num_kv_heads=self.num_kv_heads, dropout=self.dropout, use_bias=self.use_bias,
            norm_epsilon=self.norm_epsilon, attention_dropout=self.attention_dropout, causal=self.causal,
            cross_attention=self.has_cross_attention, norm=self.norm, mlp=self.mlp,
            mlp_hidden_size=self.mlp_hidden_size, qkv_bias=self.qkv_bias, rotary=self.rotary,
            rope_theta=self.rope_theta, qk_norm=self.qk_norm, head_dim=self.head_dim,
        )
        return config


@register
class EncoderBlock(TransformerBlock):
    """An encoder's block: a `TransformerBlock` whose self-attention sees the
    whole input, before and after each position, but not its padding.

    Call: x (B, S, C), padding_mask (B, S) True at real positions -> (B, S, C).
    """

    def __init__(self, num_heads, num_kv_heads=None, **kwargs):
        super().__init__(num_heads, num_kv_heads, **kwargs, causal=False, cross_attention=False)

    def get_config(self):
        config = super().get_config()
        del config["causal"], config["cross_attention"]
        return config
