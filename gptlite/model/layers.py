"""The model's smallest parts, as Keras layers written with `keras.ops` only: the projection (`Linear`,
with LoRA), the token and position embedding and the feed-forward network. The norms are in
`gptlite.model.norms`, attention in `gptlite.model.attention`, the transformer blocks that put them together in
`gptlite.model.blocks`.

Shape letters used in comments:
    B batch, T sequence length (queries), S sequence length (keys),
    C model width (n_embd), H query heads, K key/value heads (H for full
    multi-head attention, fewer for grouped-query attention), G = H / K query
    heads per key/value head, D head size (C / H), F feed-forward width,
    V vocabulary size.
"""

import collections
import contextlib
import math
import random
import threading

import keras
import numpy as np
from keras import ops

from gptlite.backend.runtime import running
from gptlite.model import positions as position_kinds
from gptlite.model.config import POSITION_KINDS
from gptlite.model.hooks import seen
from gptlite.model.positions import token_positions

register = keras.saving.register_keras_serializable(package="gptlite")

# GPT-2's initialisation: every matrix starts as N(0, 0.02^2).
_INIT_STDDEV = 0.02


def _normal_init():
    return keras.initializers.RandomNormal(stddev=_INIT_STDDEV)


# While a saved model is built to have its weights read in (`weights_arriving`), each weight starts as zeros from
# NumPy, not drawn by its initializer: the saved weights replace them at once, and under JAX every initializer of
# a new shape compiles a program first (1.6 s of a fresh process's load of the cpu preset's model; zeros from NumPy
# took 0.1 s). A thread's own: another building a new model meanwhile draws its weights as ever.
_arriving = threading.local()


@contextlib.contextmanager
def weights_arriving():
    earlier = getattr(_arriving, "now", False)
    _arriving.now = True
    try:
        yield
    finally:
        _arriving.now = earlier


@contextlib.contextmanager
def seeded_weights(seed):
    """Weights built within it are drawn from `seed` (each initializer seeded in turn from it), not from Keras's
    global random generator: a model's shape with fresh weights, the same each time. The random draws of the
    process go on as they would have without it: Keras's layers draw their own seeds from Python's `random` as they
    are made, whose state it restores."""
    earlier, state = getattr(_arriving, "seeds", None), random.getstate()
    _arriving.seeds = np.random.default_rng(seed)
    try:
        yield
    finally:
        _arriving.seeds = earlier
        random.setstate(state)


def initializer_now(initializer):
    """`initializer`, or zeros from NumPy within `weights_arriving`, or seeded within `seeded_weights`."""
    if getattr(_arriving, "now", False):
        return _zeros_from_numpy
    seeds = getattr(_arriving, "seeds", None)
    if seeds is None or not isinstance(initializer, keras.initializers.Initializer):
        return initializer  # a name ("zeros", "ones") draws nothing
    config = initializer.get_config()
    if "seed" not in config:
        return initializer
    return type(initializer).from_config({**config, "seed": int(seeds.integers(2**31))})


def _zeros_from_numpy(shape, dtype=None):
    return np.zeros(shape, "float32")  # the variable takes its own dtype


def layers_within(layer):
    """Every layer inside `layer` (not itself), depth first, in the order its attributes were set: found through
    their public attributes, a layer or a list of them, as gptlite's layers hold their parts (Keras's own walk
    is private). Under torch a layer is a `torch.nn.Module`, which keeps the layers set on it among its children
    (`named_children`, torch's public walk) rather than its attributes. Two models built from one config give
    their layers in the same order."""
    found, seen = [], {id(layer)}

    def parts(value):
        children = value.named_children() if hasattr(value, "named_children") else ()
        return [part for name, part in (*vars(value).items(), *children) if not name.startswith("_")]

    def visit(value):
        if isinstance(value, keras.layers.Layer):
            if id(value) not in seen:
                seen.add(id(value))
                found.append(value)
                for part in parts(value):
                    visit(part)
        elif isinstance(value, (list, tuple)):
            for part in value:
                visit(part)

    for part in parts(layer):
        visit(part)
    return found


def feed_forward_width(width, mlp):
    """The feed-forward's hidden width F by default: 4C for GELU and ReLU²; for SwiGLU, whose three matrices
    would otherwise hold 1.5x GELU's two, 8C/3 rounded up to a multiple of 16 (the same weights, near enough)."""
    if mlp != "swiglu":
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
        use_bias: whether it adds a bias b. (Keras's Dense's name: `bias` is
            the weight; the layers above take GPTConfig's `bias`.)

    Call: x (..., in) -> (..., units).
    """

    def __init__(self, units, use_bias=True, **kwargs):
        super().__init__(**kwargs)
        self.units = units
        self.use_bias = use_bias
        self.lora_rank = 0
        self.lora_alpha = None

    def build(self, input_shape):
        self.kernel = self.add_weight(name="kernel", shape=(input_shape[-1], self.units),
                                      initializer=initializer_now(_normal_init()))
        self.bias = (self.add_weight(name="bias", shape=(self.units,), initializer=initializer_now("zeros"))
                     if self.use_bias else None)

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
                                          initializer=initializer_now(keras.initializers.HeUniform()), dtype="float32")
            self.lora_b = self.add_weight(name="lora_b", shape=(rank, self.units), initializer=initializer_now("zeros"),
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


# Settings a layer saved before it took GPTConfig's names called otherwise.
_FORMER_NAMES = {"use_bias": "bias", "vocabulary_size": "vocab_size", "sequence_length": "block_size",
                 "embedding_dim": "n_embd", "hidden_size": "mlp_hidden_size"}


def settings_by_their_names(config):
    """A saved layer's config with the settings' names of layers saved before they took GPTConfig's
    (`_FORMER_NAMES`: `use_bias` is `bias`, `sequence_length` is `block_size`, ...), and `rotary=True` as
    `position="rotary"`."""
    config = {_FORMER_NAMES.get(name, name): value for name, value in config.items()}
    if "rotary" in config:
        config["position"] = "rotary" if config.pop("rotary") else "learned"
    return config


@register
class TokenAndPositionEmbedding(keras.layers.Layer):
    """Token embedding, with the position table added where positions are one, and the output head.

    Args (named as GPTConfig names them):
        vocab_size: number of token ids, V.
        block_size: the longest sequence the position table covers.
        n_embd: model width C.
        position: "learned" (a trained table), "sinusoidal" (the fixed table
            of `positions.sinusoidal_position_encoding`, computed once), or
            "rotary" (no table: attention rotates queries and keys).
        tie_weights: whether `logits()` reuses the token embedding matrix as
            the output projection (True) or has a matrix of its own.

    Call: token ids (B, T) with T <= block_size -> embeddings (B, T, C).
    """

    def __init__(
        self,
        vocab_size,
        block_size,
        n_embd,
        position="learned",
        tie_weights=True,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if position not in POSITION_KINDS:
            raise ValueError(f"position must be one of {', '.join(POSITION_KINDS)}, got {position!r}")
        self.vocab_size = vocab_size
        self.block_size = block_size
        self.n_embd = n_embd
        self.position = position
        self.tie_weights = tie_weights
        # Keras's ReversibleEmbedding holds the embedding and, tied or not, the
        # output projection, so both paths save and load the same way.
        self.token_embedding = keras.layers.ReversibleEmbedding(
            vocab_size,
            n_embd,
            tie_weights=tie_weights,
            embeddings_initializer=_normal_init(),
            reverse_dtype="float32",
            dtype=self.dtype_policy,
            name="token_embedding",
        )

    def build(self, input_shape):
        # Keras's embedding draws from the initializer it was made with, which its config saves: lent a zeros
        # initializer while weights arrive, it gets its own back after.
        drawn = self.token_embedding.embeddings_initializer
        self.token_embedding.embeddings_initializer = initializer_now(drawn)
        try:
            self.token_embedding.build(input_shape)
        finally:
            self.token_embedding.embeddings_initializer = drawn
        self.position_embeddings = None
        if self.position == "learned":
            self.position_embeddings = self.add_weight(
                name="position_embeddings",
                shape=(self.block_size, self.n_embd),
                initializer=initializer_now(_normal_init()),
            )
        elif self.position == "sinusoidal":
            # A non-trainable weight rather than a constant tensor: it is built
            # outside any traced function, and it travels inside model.keras.
            self.position_embeddings = self.add_weight(
                name="position_encoding",
                shape=(self.block_size, self.n_embd),
                initializer="zeros",
                trainable=False,
            )
            self.position_embeddings.assign(
                position_kinds.sinusoidal_position_encoding(self.block_size, self.n_embd)
            )

    def call(self, token_ids, start_positions=None, positions=None, hooks=None):
        """token_ids (B, T); start_positions (B,), the position of each row's first token (default 0), or
        positions (B, T), each token's own (rows that pack several texts count each from 0). `hooks` see
        `token_embedding` and, where a table adds positions, `position` (B, T, C)."""
        tokens = seen(hooks, "token_embedding", self.token_embedding(token_ids))  # (B, T, C)
        if self.position_embeddings is None:
            return tokens
        length = ops.shape(token_ids)[-1]
        # The variable's value, not the variable: JAX no longer converts one inside ops.
        table = self.position_embeddings.value  # (block_size, C)
        if start_positions is not None:
            positions = token_positions(start_positions, length)  # (B, T)
        if positions is None:
            added = ops.slice(table, (0, 0), (length, self.n_embd))  # (T, C)
        else:
            added = ops.take(table, positions, axis=0)  # (B, T, C)
        if hooks is not None:
            added = hooks("position", ops.broadcast_to(added, ops.shape(tokens)))
        return tokens + ops.cast(added, tokens.dtype)

    def logits(self, hidden, decoding=False):
        """Project hidden states (B, T, C) to float32 vocabulary logits (B, T, V); `decoding`: for writing text,
        where no gradient is taken."""
        embedding = self.token_embedding
        if not (decoding and embedding.tie_weights) or embedding.quantization_mode or embedding.logit_soft_cap:
            return embedding(hidden, reverse=True)
        # Contracted along the table's rows as they lie. Keras multiplies by the table's transpose, which XLA on
        # a CPU made a loop of its own, copying the table transposed as it read it (GPT-2 small under JAX: 8.5
        # ms of a 28 ms token, against 6 as a product). Training keeps Keras's form: with this one TensorFlow's
        # step took 15% longer at the cpu preset.
        table = embedding.embeddings
        table = table.value if isinstance(table, keras.Variable) else table  # LoRA's is a tensor already
        return ops.einsum("...c,vc->...v", ops.cast(hidden, "float32"), ops.cast(table, "float32"))

    def compute_output_shape(self, input_shape):
        return (*input_shape, self.n_embd)

    def get_config(self):
        config = super().get_config()
        config.update(
            vocab_size=self.vocab_size,
            block_size=self.block_size,
            n_embd=self.n_embd,
            position=self.position,
            tie_weights=self.tie_weights,
        )
        return config

    @classmethod
    def from_config(cls, config):
        return cls(**settings_by_their_names(config))


def gelu(x, recompute_gradient=False):
    """GELU with GPT-2's tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).

    recompute_gradient: where the backend's runtime does so
        (`recomputes_gelu_gradient`: TensorFlow), compute the gradient again
        from x alone. TensorFlow's own gradient of the formula keeps four more
        tensors of the feed-forward's width per block until the backward
        pass, which matters where no XLA fuses them: on GPT-2 small at
        context 256 they held ~90 MB of a LoRA step's peak memory.
    """
    if not recompute_gradient or not running().recomputes_gelu_gradient:
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



class FeedForwardKind(collections.namedtuple("FeedForwardKind", "hidden widened")):
    """How a kind of feed-forward (`config.MLP_KINDS`, its name and words) computes: `hidden(layer, expanded,
    hooks)`, its hidden activations (B, T, F) from its widened vector, each step handed to the hooks; `widened`,
    how many vectors of F its first projection makes (a gated kind: the gate and the up)."""


def _gelu_hidden(layer, expanded, hooks):
    # A large model's LoRA step runs without XLA on TensorFlow (training.compile_for_training).
    adapted = layer.expand.lora_enabled or layer.contract.lora_enabled
    return gelu(seen(hooks, "expanded", expanded), recompute_gradient=adapted)


def _swiglu_hidden(layer, expanded, hooks):
    gate, up = ops.split(expanded, 2, axis=-1)  # each (B, T, F)
    return ops.silu(seen(hooks, "gate", gate)) * seen(hooks, "up", up)


def _relu2_hidden(layer, expanded, hooks):
    return ops.square(ops.relu(seen(hooks, "expanded", expanded)))


# Each feed-forward kind's computation, by its name in `config.MLP_KINDS`: a new kind is a line there and one here
# (and, for the web page, its ONNX form in `gptlite.web.onnx_graph`).
FEED_FORWARD_KINDS = {"gelu": FeedForwardKind(_gelu_hidden, 1), "swiglu": FeedForwardKind(_swiglu_hidden, 2),
                      "relu2": FeedForwardKind(_relu2_hidden, 1)}


@register
class FeedForward(keras.layers.Layer):
    """The position-wise feed-forward network, then dropout. (B, T, C) -> (B, T, C).

    mlp "gelu" (GPT-2's): x -> gelu(x W1) W2, with W1 `expand` (C, F) and
    W2 `contract` (F, C). mlp "swiglu" (Shazeer 2020; Llama's):
    x -> (silu(x W_gate) * (x W_up)) W_down, with W_gate and W_up side by
    side in `expand` (C, 2F): one matmul; W_down is `contract`. mlp "relu2"
    (So et al. 2021, Primer; the speedrun's): x -> relu(x W1)² W2.

    Args:
        dropout: rate for the output.
        bias: whether the projections have biases.
        mlp: "gelu", "swiglu" or "relu2".
        mlp_hidden_size: F (None: `feed_forward_width`'s default for the width).

    `hooks` (`gptlite.model.hooks.Hooks`) see `expanded` (or SwiGLU's `gate` and `up`) and `hidden`.
    """

    def __init__(self, dropout=0.0, bias=True, mlp="gelu", mlp_hidden_size=None, **kwargs):
        super().__init__(**kwargs)
        if mlp not in FEED_FORWARD_KINDS:
            raise ValueError(f"mlp must be one of {', '.join(FEED_FORWARD_KINDS)}, got {mlp!r}")
        self.dropout = dropout
        self.bias = bias
        self.mlp = mlp
        self.mlp_hidden_size = mlp_hidden_size

    def build(self, input_shape):
        width = input_shape[-1]
        hidden = self.mlp_hidden_size or feed_forward_width(width, self.mlp)
        self.expand = Linear(hidden * FEED_FORWARD_KINDS[self.mlp].widened, use_bias=self.bias,
                             dtype=self.dtype_policy, name="expand")
        self.expand.build(input_shape)
        self.contract = Linear(width, use_bias=self.bias, dtype=self.dtype_policy, name="contract")
        self.contract.build((*input_shape[:-1], hidden))
        self.output_dropout = keras.layers.Dropout(self.dropout, dtype=self.dtype_policy)

    def projections(self):
        """The layer's projections by LoRA target name: "expand" (gate and up, for SwiGLU) and "contract"."""
        return {"expand": [self.expand], "contract": [self.contract]}

    def call(self, x, training=None, hooks=None):
        hidden = FEED_FORWARD_KINDS[self.mlp].hidden(self, self.expand(x), hooks)  # (B, T, F)
        return self.output_dropout(self.contract(seen(hooks, "hidden", hidden)), training=training)  # (B, T, C)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update(dropout=self.dropout, bias=self.bias, mlp=self.mlp, mlp_hidden_size=self.mlp_hidden_size)
        return config

    @classmethod
    def from_config(cls, config):
        return cls(**settings_by_their_names(config))


def weight_array(layer, attribute):
    """A layer's weight (`getattr(layer, attribute)`) as a float32 numpy array; a `Linear`'s kernel with its
    LoRA adapters, if any, merged in."""
    if isinstance(layer, Linear) and attribute == "kernel":
        return np.asarray(ops.convert_to_numpy(layer.merged_kernel()), np.float32)
    return np.asarray(ops.convert_to_numpy(getattr(layer, attribute)), np.float32)
