"""The transformer blocks: a pre-norm decoder block (self-attention, optional cross-attention, feed-forward)
and the encoder's block, what GPT and Seq2Seq stack.

Shape letters in comments are those of `gptlite.model.layers`.
"""

import keras

from gptlite.model.attention import Attention
from gptlite.model.config import GPTConfig, NORMS
from gptlite.model.layers import FeedForward, make_norm, register, settings_by_their_names


@register
class TransformerBlock(keras.layers.Layer):
    """Pre-norm block: x + self_attention(norm(x)), [x + cross_attention(norm(x), context),]
    then x + feed_forward(norm(x)).

    Normalising before each sublayer keeps the residual path an identity,
    which lets deep stacks train without a careful learning-rate warm-up.

    Args:
        n_head, n_kv_head, dropout, attention_dropout, bias, qkv_bias,
            position, rope_theta, qk_norm, head_dim: as for `Attention`
            (bias also for LayerNorm's shift and the feed-forward).
        norm_epsilon: for the norms.
        causal: self-attention sees only earlier positions; False sees every
            position that is not padding.
        cross_attention: a decoder block of an encoder–decoder: after
            self-attention, attend over the encoder's output.
        norm: "layer" (LayerNorm) or "rms" (RMSNorm).
        mlp, mlp_hidden_size: the feed-forward's kind and width F (`FeedForward`).

    Call: x (B, T, C) -> (B, T, C). `padding_mask` (B, T), True at x's real
    positions, hides padding from non-causal self-attention (causal
    attention needs none: padding comes last, after every real token).
    `packed`, from `attention.PackedTexts.of`, where rows pack several
    texts: causal self-attention then keeps to each text.
    `context` (B, S, C) and `context_mask` (B, S) are what cross-attention
    attends over. With `return_attention_scores=True`, also the
    self-attention weights (B, H, T, T), and with cross-attention those
    too, (B, H, T, S).
    """

    def __init__(self, n_head, n_kv_head=None, dropout=0.0, bias=True, norm_epsilon=GPTConfig.norm_epsilon,
                 attention_dropout=0.0, causal=True, cross_attention=False, norm="layer", mlp="gelu",
                 mlp_hidden_size=None, qkv_bias=None, position=GPTConfig.position, rope_theta=GPTConfig.rope_theta,
                 qk_norm=False, head_dim=None, **kwargs):
        super().__init__(**kwargs)
        if norm not in NORMS:
            raise ValueError(f"norm must be one of {', '.join(NORMS)}, got {norm!r}")
        self.n_head = n_head
        self.n_kv_head = n_head if n_kv_head is None else n_kv_head
        self.dropout = dropout
        self.bias = bias
        self.norm_epsilon = norm_epsilon
        self.attention_dropout = attention_dropout
        self.causal = causal
        self.has_cross_attention = cross_attention
        self.norm = norm
        self.mlp = mlp
        self.mlp_hidden_size = mlp_hidden_size
        self.qkv_bias = bias if qkv_bias is None else qkv_bias
        self.position = position
        self.rope_theta = rope_theta
        self.qk_norm = qk_norm
        self.head_dim = head_dim

    def build(self, input_shape):
        def norm(name):
            layer = make_norm(self.norm, self.norm_epsilon, self.bias, self.dtype_policy, name)
            layer.build(input_shape)
            return layer

        def attention(name, causal, cross=False):
            layer = Attention(self.n_head, self.n_kv_head, causal=causal, cross=cross, dropout=self.dropout,
                              attention_dropout=self.attention_dropout, bias=self.bias,
                              qkv_bias=self.qkv_bias, position=self.position, rope_theta=self.rope_theta,
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
        self.feed_forward = FeedForward(dropout=self.dropout, bias=self.bias, mlp=self.mlp,
                                        hidden_size=self.mlp_hidden_size, dtype=self.dtype_policy,
                                        name="feed_forward")
        self.feed_forward.build(input_shape)

    def projections(self):
        """Every projection of the block by LoRA target name (`config.LORA_TARGETS`): a list of `Linear`s each."""
        found = {**self.attention.projections(), **self.feed_forward.projections()}
        if self.has_cross_attention:
            for name, layers in self.cross_attention.projections().items():
                found[name] = found[name] + layers
        return found

    def call(self, x, padding_mask=None, context=None, context_mask=None, packed=None, training=None,
             return_attention_scores=False):
        scores = return_attention_scores
        attended = self.attention(self.attention_norm(x), context_mask=None if self.causal else padding_mask,
                                  packed=packed, training=training, return_attention_scores=scores)
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
            n_head=self.n_head, n_kv_head=self.n_kv_head, dropout=self.dropout, bias=self.bias,
            norm_epsilon=self.norm_epsilon, attention_dropout=self.attention_dropout, causal=self.causal,
            cross_attention=self.has_cross_attention, norm=self.norm, mlp=self.mlp,
            mlp_hidden_size=self.mlp_hidden_size, qkv_bias=self.qkv_bias, position=self.position,
            rope_theta=self.rope_theta, qk_norm=self.qk_norm, head_dim=self.head_dim,
        )
        return config

    @classmethod
    def from_config(cls, config):
        return cls(**settings_by_their_names(config))


@register
class EncoderBlock(TransformerBlock):
    """An encoder's block: a `TransformerBlock` whose self-attention sees the
    whole input, before and after each position, but not its padding.

    Call: x (B, S, C), padding_mask (B, S) True at real positions -> (B, S, C).
    """

    def __init__(self, n_head, n_kv_head=None, **kwargs):
        super().__init__(n_head, n_kv_head, **kwargs, causal=False, cross_attention=False)

    def get_config(self):
        config = super().get_config()
        del config["causal"], config["cross_attention"]
        return config
