"""The transformer blocks: a decoder block (self-attention, optional cross-attention, feed-forward), pre-norm
or post-norm, and the encoder's block, what GPT and Seq2Seq stack.

Shape letters in comments are those of `gptlite.model.layers`.
"""

import dataclasses

import keras

from gptlite.model.attention import Attention
from gptlite.model.config import GPTConfig
from gptlite.model.hooks import seen, within
from gptlite.model.layers import FeedForward, register
from gptlite.model.norms import make_norm


@register
class TransformerBlock(keras.layers.Layer):
    """A transformer block: self-attention, [cross-attention,] then a feed-forward, each added to the
    residual stream and normalised, before it or after (`config.norm_position`):

        pre-norm (the default):           post-norm (the original Transformer's "Add & Norm"):
        x = x + self_attention(norm(x))   x = norm(x + self_attention(x))
        x = x + feed_forward(norm(x))     x = norm(x + feed_forward(x))

    Normalising before each sublayer keeps the residual path an identity,
    which lets deep stacks train without a careful learning-rate warm-up;
    after it, every block's output is normalised, so the model needs no
    final norm (see GPT).

    Args:
        config: the model's `GPTConfig`: what `Attention` reads, and the
            norms' kind ("layer" or "rms"), their epsilon, bias and position,
            and the feed-forward's kind and width (`FeedForward`).
        causal: self-attention sees only earlier positions; False sees every
            position that is not padding.
        cross_attention: a decoder block of an encoder–decoder: after
            self-attention, attend over the encoder's output.

    Call: x (B, T, C) -> (B, T, C). `padding_mask` (B, T), True at x's real
    positions, hides padding from non-causal self-attention (causal
    attention needs none: padding comes last, after every real token).
    `packed`, from `attention.PackedTexts.of`, where rows pack several
    texts: causal self-attention then keeps to each text.
    `context` (B, S, C) and `context_mask` (B, S) are what cross-attention
    attends over; decoding, its keys and values come computed once instead
    (`cross_key_values`, from `cross_attention.key_values(context)`).
    Decoding, a causal block attends over a key/value `cache` too, where
    `placement` says its new tokens go (see `Attention`), and returns
    (B, T, C) and the updated cache. `hooks` (`gptlite.model.hooks.Hooks`,
    for this block's steps) see each step of `BLOCK_STEPS` and may change it.
    """

    def __init__(self, config, causal=True, cross_attention=False, **kwargs):
        super().__init__(**kwargs)
        self.config = GPTConfig.of(config)
        self.causal = causal
        self.has_cross_attention = cross_attention

    def build(self, input_shape):
        config = self.config

        def norm(name):
            layer = make_norm(config.norm, config.norm_epsilon, config.bias, self.dtype_policy, name)
            layer.build(input_shape)
            return layer

        def attention(name, causal, cross=False):
            layer = Attention(config, causal=causal, cross=cross, dtype=self.dtype_policy, name=name)
            layer.build(input_shape)
            return layer

        self.attention_norm = norm("attention_norm")
        self.attention = attention("attention", self.causal)
        if self.has_cross_attention:
            self.cross_attention_norm = norm("cross_attention_norm")
            self.cross_attention = attention("cross_attention", causal=False, cross=True)
        self.feed_forward_norm = norm("feed_forward_norm")
        self.feed_forward = FeedForward(dropout=config.dropout, bias=config.bias, mlp=config.mlp,
                                        mlp_hidden_size=config.mlp_hidden_size, dtype=self.dtype_policy,
                                        name="feed_forward")
        self.feed_forward.build(input_shape)

    def projections(self):
        """Every projection of the block by LoRA target name (`config.LORA_TARGETS`): a list of `Linear`s each."""
        found = {**self.attention.projections(), **self.feed_forward.projections()}
        if self.has_cross_attention:
            for name, layers in self.cross_attention.projections().items():
                found[name] = found[name] + layers
        return found

    def call(self, x, padding_mask=None, context=None, context_mask=None, packed=None, training=None, cache=None,
             placement=None, cross_key_values=None, hooks=None):
        x = seen(hooks, "input", x)
        normed = self._input(x, self.attention_norm, hooks, "attention_normed")
        if cache is None:
            attended = self.attention(normed, context_mask=None if self.causal else padding_mask, packed=packed,
                                      training=training, hooks=hooks)
        else:  # decoding: called as it is, every step, not through Keras's __call__
            attended, cache = self.attention.call(normed, cache=cache, placement=placement, hooks=hooks)
        x = seen(hooks, "attention_residual", self._add(x, seen(hooks, "attention_output", attended),
                                                         self.attention_norm))
        if self.has_cross_attention:
            cross = within(hooks, "cross_")
            normed = self._input(x, self.cross_attention_norm, hooks, "cross_normed")
            if cross_key_values is None:
                attended = self.cross_attention(normed, context, context_mask, training=training, hooks=cross)
            else:  # the context's keys and values, computed once for every decoding step
                attended = self.cross_attention.attend(normed, cross_key_values, context_mask, hooks=cross)
            x = seen(hooks, "cross_residual", self._add(x, seen(hooks, "cross_output", attended),
                                                         self.cross_attention_norm))
        normed = self._input(x, self.feed_forward_norm, hooks, "feed_forward_normed")
        fed_forward = seen(hooks, "feed_forward_output", self.feed_forward(normed, **_given(training=training,
                                                                                            hooks=hooks)))
        x = seen(hooks, "output", self._add(x, fed_forward, self.feed_forward_norm))
        return x if cache is None else (x, cache)

    @property
    def post_norm(self):
        """Whether each norm comes after its residual addition (`config.norm_position`)."""
        return self.config.norm_position == "post"

    def _input(self, x, norm, hooks, step):
        """What a sublayer reads: the residual stream, normalised in a pre-norm block (which hooks see as `step`)."""
        return x if self.post_norm else seen(hooks, step, norm(x))

    def _add(self, x, sublayer_output, norm):
        """The residual stream with a sublayer's output added, normalised after it in a post-norm block."""
        x = x + sublayer_output
        return norm(x) if self.post_norm else x

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update(config=dataclasses.asdict(self.config), causal=self.causal,
                      cross_attention=self.has_cross_attention)
        return config


def _given(**arguments):
    """The keyword arguments that are not None: a layer called through Keras's `__call__` walks every argument it
    is given, which, for a decoding step under torch (run as it comes, not compiled), is time on every token."""
    return {name: value for name, value in arguments.items() if value is not None}


@register
class EncoderBlock(TransformerBlock):
    """An encoder's block: a `TransformerBlock` whose self-attention sees the
    whole input, before and after each position, but not its padding.

    Call: x (B, S, C), padding_mask (B, S) True at real positions -> (B, S, C).
    """

    def __init__(self, config, **kwargs):
        super().__init__(config, **kwargs, causal=False, cross_attention=False)

    def get_config(self):
        config = super().get_config()
        del config["causal"], config["cross_attention"]
        return config
