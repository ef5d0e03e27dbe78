"""The model's building blocks, as Keras layers written with `keras.ops` only.

Shape letters used in comments:
    B batch, T sequence length (queries), S sequence length (keys),
    C model width (n_embd), H heads, D head size (C / H), V vocabulary size.
"""

import functools
import math

import keras
import ml_dtypes
import numpy as np
from keras import ops

register = keras.saving.register_keras_serializable(package="gptlite")

# GPT-2's initialisation: every matrix starts as N(0, 0.02^2).
_INIT_STDDEV = 0.02


def _normal_init():
    return keras.initializers.RandomNormal(stddev=_INIT_STDDEV)


def token_positions(start_positions, length):
    """Absolute positions (B, T) of `length` tokens per row, row b starting at start_positions[b]."""
    return ops.reshape(start_positions, (-1, 1)) + ops.arange(length)[None, :]


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


def scaled_dot_product_attention(query, key, value, mask=None):
    """softmax(Q K^T / sqrt(D) + mask) V, and the attention weights.

    query (B, H, T, D), key and value (B, H, S, D), mask broadcastable to
    (B, H, T, S) with True where attending is allowed. Masked scores are set to
    the most negative number of the compute dtype rather than -inf, so a row
    with nothing visible gives uniform weights instead of NaN.
    """
    head_size = ops.shape(query)[-1]
    scores = ops.matmul(query, ops.swapaxes(key, -1, -2))  # (B, H, T, S)
    scores = scores / ops.cast(math.sqrt(head_size), scores.dtype)
    if mask is not None:
        lowest = float(ml_dtypes.finfo(keras.backend.standardize_dtype(scores.dtype)).min)
        scores = ops.where(mask, scores, ops.cast(lowest, scores.dtype))
    if scores.shape[-1] == 1:
        # One key (a Seq2Seq's decoding starts from its start token alone): its weight is 1,
        # as softmax gives, but Keras warns of a softmax over one element.
        weights = ops.ones_like(scores)
    else:
        weights = ops.softmax(scores, axis=-1)  # (B, H, T, S)
    return ops.matmul(weights, value), weights  # (B, H, T, D), (B, H, T, S)


def split_heads(x, num_heads):
    """(B, T, C) -> (B, H, T, D)."""
    length, width = ops.shape(x)[1], ops.shape(x)[2]
    return ops.transpose(ops.reshape(x, (-1, length, num_heads, width // num_heads)), (0, 2, 1, 3))


def merge_heads(x):
    """(B, H, T, D) -> (B, T, C)."""
    heads, length, head_size = ops.shape(x)[1], ops.shape(x)[2], ops.shape(x)[3]
    return ops.reshape(ops.transpose(x, (0, 2, 1, 3)), (-1, length, heads * head_size))


def sinusoidal_position_encoding(length, width):
    """The fixed encoding of "Attention Is All You Need", as a (length, width) array.

    PE(pos, 2i) = sin(pos / 10000^(2i/width)), PE(pos, 2i+1) = cos(pos / 10000^(2i/width)).
    """
    positions = np.arange(length, dtype=np.float64)[:, None]  # (T, 1)
    two_i = np.arange(0, width, 2, dtype=np.float64)[None, :]  # (1, ceil(C/2))
    angles = positions / np.power(10000.0, two_i / width)  # (T, ceil(C/2))
    encoding = np.zeros((length, width), dtype=np.float64)
    encoding[:, 0::2] = np.sin(angles)
    encoding[:, 1::2] = np.cos(angles[:, : width // 2])
    return encoding.astype(np.float32)


def dense(layer, x):
    """A Dense layer applied to x (B, T, in), with its LoRA adapters, if it has them, on the side.

    With adapters (Keras's `Dense.enable_lora`) it computes x W + b +
    (alpha / rank) (x A) B, the same as Keras's Dense, which first merges the
    adapters into W, but without that merge: training then needs no gradient
    of the whole frozen W, only of A and B, which makes a LoRA step cheaper.
    """
    if not layer.lora_enabled:
        return layer(x)
    # Rows as one matrix: three 2-D products, where (B, T, in) operands make
    # TensorFlow build each product from a dozen shape operations.
    rows = ops.reshape(x, (-1, ops.shape(x)[-1]))  # (B*T, in)
    adapted = ops.matmul(ops.matmul(rows, layer.lora_kernel_a), layer.lora_kernel_b)  # (B*T, out)
    scale = layer.lora_alpha / layer.lora_rank
    y = ops.matmul(rows, layer._kernel) + (adapted if scale == 1 else scale * adapted)
    if layer.bias is not None:
        y = y + layer.bias
    return ops.reshape(y, (*ops.shape(x)[:-1], ops.shape(y)[-1]))  # (B, T, out)


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
class TokenAndPositionEmbedding(keras.layers.Layer):
    """Token embedding plus position information, and the tied output projection.

    Args:
        vocabulary_size: number of token ids.
        sequence_length: the longest sequence the position information covers.
        embedding_dim: model width C.
        position: "learned" (a trained table) or "sinusoidal" (the fixed
            encoding of `sinusoidal_position_encoding`, computed once).
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
        if position not in ("learned", "sinusoidal"):
            raise ValueError(f"position must be 'learned' or 'sinusoidal', got {position!r}")
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
        if self.position == "learned":
            self.position_embeddings = self.add_weight(
                name="position_embeddings",
                shape=(self.sequence_length, self.embedding_dim),
                initializer=_normal_init(),
            )
        else:
            # A non-trainable weight rather than a constant tensor: it is built
            # outside any traced function, and it travels inside model.keras.
            self.position_embeddings = self.add_weight(
                name="position_encoding",
                shape=(self.sequence_length, self.embedding_dim),
                initializer="zeros",
                trainable=False,
            )
            self.position_embeddings.assign(
                sinusoidal_position_encoding(self.sequence_length, self.embedding_dim)
            )

    def call(self, token_ids, start_positions=None):
        """token_ids (B, T); start_positions (B,), the position of each row's first token (default 0)."""
        length = ops.shape(token_ids)[-1]
        tokens = self.token_embedding(token_ids)  # (B, T, C)
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


@register
class CausalSelfAttention(keras.layers.Layer):
    """Multi-head self-attention where each position sees only itself and earlier ones.

    Args:
        num_heads: H; the input width must divide by it.
        dropout: rate for the output.
        use_bias: whether the Q/K/V and output projections have biases.
        attention_dropout: rate for the attention weights. Above zero, training
            computes the weights step by step instead of with the backend's
            fused (flash) attention, to drop some out.

    Call: x (B, T, C) -> (B, T, C); with `return_attention_scores=True`, also
    the attention weights (B, H, T, T) before dropout.
    """

    def __init__(self, num_heads, dropout=0.0, use_bias=True, attention_dropout=0.0, **kwargs):
        super().__init__(**kwargs)
        self.num_heads = num_heads
        self.dropout = dropout
        self.use_bias = use_bias
        self.attention_dropout_rate = attention_dropout

    def build(self, input_shape):
        width = input_shape[-1]
        if width % self.num_heads != 0:
            raise ValueError(
                f"the model width (n_embd={width}) must be divisible by the number "
                f"of heads (n_head={self.num_heads})"
            )
        self.head_size = width // self.num_heads
        # One projection for Q, K and V together: one matmul instead of three.
        self.qkv_projection = keras.layers.Dense(
            3 * width,
            use_bias=self.use_bias,
            kernel_initializer=_normal_init(),
            dtype=self.dtype_policy,
            name="qkv_projection",
        )
        self.qkv_projection.build(input_shape)
        self.output_projection = keras.layers.Dense(
            width,
            use_bias=self.use_bias,
            kernel_initializer=_normal_init(),
            dtype=self.dtype_policy,
            name="output_projection",
        )
        self.output_projection.build(input_shape)
        self.attention_dropout = keras.layers.Dropout(self.attention_dropout_rate, dtype=self.dtype_policy)
        self.output_dropout = keras.layers.Dropout(self.dropout, dtype=self.dtype_policy)

    def call(self, x, training=None, return_attention_scores=False):
        length = ops.shape(x)[1]
        weights_needed = return_attention_scores or (training and self.attention_dropout_rate > 0)
        if not weights_needed and _fused_attention_is_faster(self.compute_dtype):
            # The backend's fused attention (torch's scaled_dot_product_attention,
            # flash where it can; under XLA the same ops as below), on heads
            # that need no transposing.
            qkv = ops.reshape(dense(self.qkv_projection, x), (-1, length, 3, self.num_heads, self.head_size))
            # Unstacked rather than indexed three times: without XLA, TensorFlow's
            # gradient of each index writes a zero tensor of the whole (B, T, 3, H, D)
            # (~60 ms of operations in a ~500 ms LoRA step of GPT-2 small); unstacking's
            # gradient is one stack.
            query, key, value = ops.unstack(qkv, 3, axis=2)  # each (B, T, H, D)
            attended = ops.dot_product_attention(query, key, value, is_causal=True)  # (B, T, H, D)
            merged = dense(self.output_projection,
                           ops.reshape(attended, (-1, length, self.num_heads * self.head_size)))
            return self.output_dropout(merged, training=training)
        query, key, value = self._project_heads(x)  # each (B, H, T, D)
        mask = causal_mask(length, length)  # (T, T), broadcast over B and H
        attended, weights = _attend_with_dropout(
            query, key, value, mask, self.attention_dropout, training
        )  # (B, H, T, D), (B, H, T, T)
        output = self.output_dropout(self._merge_heads(attended), training=training)
        if return_attention_scores:
            return output, weights
        return output

    def call_with_cache(self, x, cache, start_positions):
        """Attend from new tokens over a key/value cache, and return the updated cache.

        x (B, T, C) holds tokens at positions start_positions[b] + t;
        cache (B, 2, H, S, D) holds keys and values for positions 0..S-1, of
        which those before start_positions[b] are filled. The new keys and
        values are written at their positions; each query then sees the cache
        up to its own position. Returns (B, T, C) and the cache.
        """
        length = ops.shape(x)[1]
        cache_length = ops.shape(cache)[3]
        query, key, value = self._project_heads(x)  # each (B, H, T, D)

        cache = _write_cache(cache, key, value, token_positions(start_positions, length))  # (B, 2, H, S, D)
        keys, values = cache[:, 0], cache[:, 1]

        mask = causal_mask(length, cache_length, start_positions)[:, None]  # (B, 1, T, S)
        attended, _ = scaled_dot_product_attention(query, keys, values, mask)  # (B, H, T, D)
        return self._merge_heads(attended), cache

    def _project_heads(self, x):
        length = ops.shape(x)[1]
        qkv = dense(self.qkv_projection, x)  # (B, T, 3C)
        qkv = ops.reshape(qkv, (-1, length, 3, self.num_heads, self.head_size))
        qkv = ops.transpose(qkv, (2, 0, 3, 1, 4))  # (3, B, H, T, D)
        query, key, value = ops.unstack(qkv, 3, axis=0)  # unstacked, as in `call`, for a cheap gradient
        return query, key, value

    def _merge_heads(self, attended):
        return dense(self.output_projection, merge_heads(attended))  # (B, T, C)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update(num_heads=self.num_heads, dropout=self.dropout, use_bias=self.use_bias,
                      attention_dropout=self.attention_dropout_rate)
        return config


@register
class Attention(keras.layers.Layer):
    """Multi-head attention from queries over a context that may be padded.

    Serves the encoder's self-attention (the context is the input itself,
    nothing is hidden but padding) and the decoder's cross-attention (the
    context is the encoder's output). The math is `scaled_dot_product_attention`,
    the same as `CausalSelfAttention`'s.

    Args:
        num_heads: H; the width must divide by it.
        dropout: rate for the output.
        use_bias: whether the projections have biases.
        attention_dropout: rate for the attention weights.

    Call: x (B, T, C); context (B, S, C), x itself by default; context_mask
    (B, S), True at the context's real (not padding) positions, all by
    default -> (B, T, C); with `return_attention_scores=True`, also the
    attention weights (B, H, T, S) before dropout.
    """

    def __init__(self, num_heads, dropout=0.0, use_bias=True, attention_dropout=0.0, **kwargs):
        super().__init__(**kwargs)
        self.num_heads = num_heads
        self.dropout = dropout
        self.use_bias = use_bias
        self.attention_dropout = attention_dropout

    def build(self, input_shape):
        width = input_shape[-1]
        if width % self.num_heads != 0:
            raise ValueError(f"the width ({width}) must be divisible by the number of heads ({self.num_heads})")

        def dense(units, name):
            layer = keras.layers.Dense(units, use_bias=self.use_bias, kernel_initializer=_normal_init(),
                                       dtype=self.dtype_policy, name=name)
            layer.build(input_shape)
            return layer

        self.query_projection = dense(width, "query_projection")
        # Keys and values come from the context together: one matmul.
        self.key_value_projection = dense(2 * width, "key_value_projection")
        self.output_projection = dense(width, "output_projection")
        self.weights_dropout = keras.layers.Dropout(self.attention_dropout, dtype=self.dtype_policy)
        self.output_dropout = keras.layers.Dropout(self.dropout, dtype=self.dtype_policy)

    def call(self, x, context=None, context_mask=None, training=None, return_attention_scores=False):
        key_values = self.key_values(x if context is None else context)
        return self.attend(x, key_values, context_mask, training, return_attention_scores)

    def key_values(self, context):
        """The context's keys and values, (B, 2, H, S, D): computed once, attended from any number of queries."""
        keys, values = ops.split(self.key_value_projection(context), 2, axis=-1)  # each (B, S, C)
        return ops.stack([split_heads(keys, self.num_heads), split_heads(values, self.num_heads)], axis=1)

    def attend(self, x, key_values, context_mask=None, training=None, return_attention_scores=False):
        """As `call`, over keys and values from `key_values`."""
        query = split_heads(self.query_projection(x), self.num_heads)  # (B, H, T, D)
        mask = None if context_mask is None else ops.cast(context_mask, "bool")[:, None, None, :]  # (B, 1, 1, S)
        attended, weights = _attend_with_dropout(
            query, key_values[:, 0], key_values[:, 1], mask, self.weights_dropout, training
        )  # (B, H, T, D), (B, H, T, S)
        output = self.output_dropout(self.output_projection(merge_heads(attended)), training=training)
        if return_attention_scores:
            return output, weights
        return output

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update(num_heads=self.num_heads, dropout=self.dropout, use_bias=self.use_bias,
                      attention_dropout=self.attention_dropout)
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


def _write_cache(cache, key, value, positions):
    """Put new keys and values (B, H, T, D) at `positions` (B, T) of the cache (B, 2, H, S, D)."""
    length, cache_length = key.shape[2], cache.shape[3]
    if length == cache_length:  # a whole window, necessarily from position 0
        return ops.stack([key, value], axis=1)
    if length == 1:
        # One token per row (each decode step): scatter just its key and value
        # instead of rewriting the cache.
        batch_size, _, heads, _, head_size = ops.shape(cache)
        b, kv, h, d = ops.meshgrid(
            ops.arange(batch_size), ops.arange(2), ops.arange(heads), ops.arange(head_size), indexing="ij"
        )  # each (B, 2, H, D)
        slot = ops.broadcast_to(ops.reshape(positions[:, 0], (-1, 1, 1, 1)), ops.shape(b))
        indices = ops.reshape(ops.stack([b, kv, h, slot, d], axis=-1), (-1, 5))
        updates = ops.reshape(ops.stack([key[:, :, 0], value[:, :, 0]], axis=1), (-1,))  # (B*2*H*D,)
        return ops.scatter_update(cache, indices, updates)
    slots = ops.arange(cache_length)  # (S,)
    placement = ops.cast(ops.equal(positions[:, :, None], slots[None, None, :]), key.dtype)  # (B, T, S)
    written = ops.max(placement, axis=1)[:, None, :, None]  # (B, 1, S, 1)
    new_keys_and_values = ops.stack(
        [ops.einsum("bts,bhtd->bhsd", placement, key), ops.einsum("bts,bhtd->bhsd", placement, value)], axis=1
    )  # (B, 2, H, S, D)
    return cache * (1 - written[:, None]) + new_keys_and_values


def _attend_with_dropout(query, key, value, mask, dropout_layer, training):
    """Attention whose weights pass through dropout; the weights returned are pre-dropout."""
    if not training or dropout_layer.rate == 0:
        return scaled_dot_product_attention(query, key, value, mask)
    _, weights = scaled_dot_product_attention(query, key, value, mask)
    return ops.matmul(dropout_layer(weights, training=training), value), weights


@register
class FeedForward(keras.layers.Layer):
    """Dense to 4C, GELU, Dense back to C, dropout. (B, T, C) -> (B, T, C)."""

    def __init__(self, dropout=0.0, use_bias=True, **kwargs):
        super().__init__(**kwargs)
        self.dropout = dropout
        self.use_bias = use_bias

    def build(self, input_shape):
        width = input_shape[-1]
        self.expand = keras.layers.Dense(
            4 * width,
            use_bias=self.use_bias,
            kernel_initializer=_normal_init(),
            dtype=self.dtype_policy,
            name="expand",
        )
        self.expand.build(input_shape)
        self.contract = keras.layers.Dense(
            width,
            use_bias=self.use_bias,
            kernel_initializer=_normal_init(),
            dtype=self.dtype_policy,
            name="contract",
        )
        self.contract.build((*input_shape[:-1], 4 * width))
        self.output_dropout = keras.layers.Dropout(self.dropout, dtype=self.dtype_policy)

    def call(self, x, training=None):
        # A LoRA step runs without XLA on TensorFlow (training.compile_for_training).
        adapted = self.expand.lora_enabled or self.contract.lora_enabled
        hidden = gelu(dense(self.expand, x), recompute_gradient=adapted)  # (B, T, 4C)
        return self.output_dropout(dense(self.contract, hidden), training=training)  # (B, T, C)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update(dropout=self.dropout, use_bias=self.use_bias)
        return config


@register
class TransformerBlock(keras.layers.Layer):
    """Pre-norm block: x + self_attention(norm(x)), [x + cross_attention(norm(x), context),]
    then x + feed_forward(norm(x)).

    Normalising before each sublayer keeps the residual path an identity,
    which lets deep stacks train without a careful learning-rate warm-up.

    Args:
        num_heads, dropout, use_bias, attention_dropout: as for the attention layers.
        layer_norm_epsilon: for the norms.
        causal: self-attention sees only earlier positions (`CausalSelfAttention`);
            False sees every position that is not padding (`Attention`).
        cross_attention: a decoder block of an encoder–decoder: after
            self-attention, attend over the encoder's output.

    Call: x (B, T, C) -> (B, T, C). `padding_mask` (B, T), True at x's real
    positions, hides padding from non-causal self-attention (causal
    attention needs none: padding comes last, after every real token).
    `context` (B, S, C) and `context_mask` (B, S) are what cross-attention
    attends over. With `return_attention_scores=True`, also the
    self-attention weights (B, H, T, T), and with cross-attention those
    too, (B, H, T, S).
    """

    def __init__(self, num_heads, dropout=0.0, use_bias=True, layer_norm_epsilon=1e-5, attention_dropout=0.0,
                 causal=True, cross_attention=False, **kwargs):
        super().__init__(**kwargs)
        self.num_heads = num_heads
        self.dropout = dropout
        self.use_bias = use_bias
        self.layer_norm_epsilon = layer_norm_epsilon
        self.attention_dropout = attention_dropout
        self.causal = causal
        self.has_cross_attention = cross_attention

    def build(self, input_shape):
        def layer_norm(name):
            norm = keras.layers.LayerNormalization(
                epsilon=self.layer_norm_epsilon,
                center=self.use_bias,
                dtype=self.dtype_policy,
                name=name,
            )
            norm.build(input_shape)
            return norm

        def attention(kind, name):
            layer = kind(self.num_heads, dropout=self.dropout, use_bias=self.use_bias,
                         attention_dropout=self.attention_dropout, dtype=self.dtype_policy, name=name)
            layer.build(input_shape)
            return layer

        self.attention_norm = layer_norm("attention_norm")
        self.attention = attention(CausalSelfAttention if self.causal else Attention, "attention")
        if self.has_cross_attention:
            self.cross_attention_norm = layer_norm("cross_attention_norm")
            self.cross_attention = attention(Attention, "cross_attention")
        self.feed_forward_norm = layer_norm("feed_forward_norm")
        self.feed_forward = FeedForward(
            dropout=self.dropout, use_bias=self.use_bias, dtype=self.dtype_policy, name="feed_forward"
        )
        self.feed_forward.build(input_shape)

    def call(self, x, padding_mask=None, context=None, context_mask=None, training=None,
             return_attention_scores=False):
        scores = return_attention_scores
        if self.causal:
            attended = self.attention(self.attention_norm(x), training=training, return_attention_scores=scores)
        else:
            attended = self.attention(self.attention_norm(x), context_mask=padding_mask, training=training,
                                      return_attention_scores=scores)
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

    def call_with_cache(self, x, cache, start_positions, cross_key_values=None, context_mask=None):
        """As `call`, for inference, attending over a key/value cache; returns (x, cache).

        A causal block only. With cross-attention, `cross_key_values` are the
        context's, from `cross_attention.key_values(context)`, computed once.
        """
        attended, cache = self.attention.call_with_cache(self.attention_norm(x), cache, start_positions)
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
            num_heads=self.num_heads,
            dropout=self.dropout,
            use_bias=self.use_bias,
            layer_norm_epsilon=self.layer_norm_epsilon,
            attention_dropout=self.attention_dropout,
            causal=self.causal,
            cross_attention=self.has_cross_attention,
        )
        return config


@register
class EncoderBlock(TransformerBlock):
    """An encoder's block: a `TransformerBlock` whose self-attention sees the
    whole input, before and after each position, but not its padding.

    Call: x (B, S, C), padding_mask (B, S) True at real positions -> (B, S, C).
    """

    def __init__(self, num_heads, **kwargs):
        super().__init__(num_heads, **kwargs, causal=False, cross_attention=False)

    def get_config(self):
        config = super().get_config()
        del config["causal"], config["cross_attention"]
        return config
