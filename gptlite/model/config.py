"""The model's shape (`GPTConfig`): every architecture setting, its one name and default, checked; the
architecture's choices and the parts LoRA may adapt.

Nothing here imports Keras: the command line reads these to build its flags before it chooses the Keras
backend.
"""

import dataclasses

from gptlite.errors import ConfigError, divisors_near, is_count, is_fraction, one_of, require


@dataclasses.dataclass(frozen=True)
class GPTConfig:
    """The shape of a GPT, or of a Seq2Seq. Defaults are the `cpu` training preset."""

    vocab_size: int = 256  # number of token ids; None: the tokenizer's, set when the model is made
    n_layer: int = 4  # transformer blocks
    n_head: int = 4  # attention heads per block
    n_embd: int = 128  # model width C; must divide by n_head
    block_size: int = 64  # longest context the model sees
    dropout: float = 0.0  # on embeddings and residual branches
    attention_dropout: float = 0.0  # on attention weights; above 0, training cannot use fused attention
    bias: bool = False  # biases in the projections and LayerNorms
    tie_weights: bool = True  # LM head reuses the token embedding matrix
    position: str = "learned"  # "learned", "sinusoidal" (tables added to the embedding) or "rotary" (RoPE)
    rope_theta: float = 10000.0  # rotary positions' base
    norm: str = "layer"  # "layer" (LayerNorm) or "rms" (RMSNorm)
    norm_epsilon: float = 1e-5  # added to the variance in every norm
    norm_position: str = "pre"  # "pre": x + f(norm(x)), a final norm before the head; "post": norm(x + f(x)), none
    mlp: str = "gelu"  # feed-forward: "gelu" (GPT-2's), "swiglu" (Llama's) or "relu2" (ReLU squared)
    mlp_hidden_size: int = None  # the feed-forward's hidden width; None: 4 n_embd (gelu, relu2), about 8/3 (swiglu)
    n_kv_head: int = None  # key/value heads (grouped-query attention); None: n_head; 1: multi-query
    qk_norm: bool = False  # RMS-normalise each head's queries and keys
    qkv_bias: bool = None  # biases on the query/key/value projection; None: as `bias`
    head_dim: int = None  # each attention head's size; None: n_embd / n_head (Qwen3's heads are wider)

    def __post_init__(self):
        for name in ("n_layer", "n_head", "n_embd", "block_size"):
            require(name, getattr(self, name), is_count, "a positive whole number")
        require("vocab_size", self.vocab_size, lambda v: v is None or is_count(v), "a positive whole number")
        require("head_dim", self.head_dim, lambda v: v is None or is_count(v), "a positive whole number")
        if self.n_embd % self.n_head != 0 and self.head_dim is None:
            raise ConfigError(
                f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head}); "
                f"try n_head {divisors_near(self.n_embd, self.n_head)}"
            )
        for name in ("dropout", "attention_dropout"):
            require(name, getattr(self, name), is_fraction, "in [0, 1)")
        require("position", self.position, lambda v: v in POSITIONS, one_of(POSITIONS))
        require("norm", self.norm, lambda v: v in NORMS, one_of(NORMS))
        require("norm_position", self.norm_position, lambda v: v in NORM_POSITIONS, one_of(NORM_POSITIONS))
        require("mlp", self.mlp, lambda v: v in MLPS, one_of(MLPS))
        require("rope_theta", self.rope_theta, lambda v: not isinstance(v, bool) and v > 1, "a number above 1")
        require("norm_epsilon", self.norm_epsilon, lambda v: not isinstance(v, bool) and 0 < v < 1,
                 "a small positive number")
        require("mlp_hidden_size", self.mlp_hidden_size, lambda v: v is None or is_count(v),
                 "a positive whole number")
        require("n_kv_head", self.n_kv_head, lambda v: v is None or is_count(v), "a positive whole number")
        for name in ("bias", "tie_weights", "qk_norm"):
            require(name, getattr(self, name), lambda v: isinstance(v, bool), "true or false")
        require("qkv_bias", self.qkv_bias, lambda v: v is None or isinstance(v, bool), "true or false")
        if self.n_head % self.kv_heads:
            raise ConfigError(f"n_head ({self.n_head}) must be divisible by n_kv_head ({self.n_kv_head}): each "
                              f"key/value head serves the same number of query heads; try n_kv_head "
                              f"{divisors_near(self.n_head, self.kv_heads)}")
        if self.position == "rotary" and self.head_size % 2:
            raise ConfigError(f"rotary positions turn pairs of dimensions, so the head size (head_dim, or n_embd / "
                              f"n_head) must be even, not {self.head_size}")

    @property
    def kv_heads(self):
        """The key/value heads: n_kv_head, or n_head where it is not set."""
        return self.n_head if self.n_kv_head is None else self.n_kv_head

    @property
    def head_size(self):
        """Each attention head's size: head_dim, or n_embd / n_head where it is not set."""
        return self.n_embd // self.n_head if self.head_dim is None else self.head_dim

    @property
    def qkv_has_bias(self):
        """Whether the query, key and value projections have biases: qkv_bias, or bias where it is not set."""
        return self.bias if self.qkv_bias is None else self.qkv_bias

    @classmethod
    def of(cls, value):
        """A GPTConfig from itself or from its fields as a dict (a layer's saved config)."""
        return value if isinstance(value, cls) else cls(**value)


# The architecture's choices, which gptlite.model.layers builds.
POSITIONS = ("learned", "sinusoidal", "rotary")
NORMS = ("layer", "rms")
# Where each block normalises: before each sublayer, on its input (today's models), or after the residual
# addition, on the sum (the original Transformer's "Add & Norm").
NORM_POSITIONS = ("pre", "post")
MLPS = ("gelu", "swiglu", "relu2")
# Each feed-forward's name in words, for messages and summaries.
MLP_NAMES = {"gelu": "GELU", "swiglu": "SwiGLU", "relu2": "ReLU²"}


# The projections LoRA may adapt in each block: the fused query/key/value
# projection, the attention's output projection, and the feed-forward's two.
LORA_TARGETS = ("qkv", "attention_output", "expand", "contract")
# Besides them, LoRA may train whole: the token embedding (and an untied output head), whose rows of tokens a
# base never met (digits in a base trained on a play, new turn markers) adapters cannot move; and every norm's
# scale (and shift), a small share of the weights, without which a small base's adapters learned a chat task late with
# some seeds (BENCHMARKS.md, "Direct answers from a pretrained base with the norms trained too").
LORA_WHOLE = ("embedding", "norms")


def lora_targets(value):
    """The parts named by a `lora_targets` setting ("qkv,expand"), checked: a tuple of LORA_TARGETS and
    LORA_WHOLE names."""
    names = tuple(name.strip() for name in str(value).split(",") if name.strip())
    unknown = [name for name in names if name not in LORA_TARGETS + LORA_WHOLE]
    if unknown or not names or not isinstance(value, str):
        raise ConfigError(f"lora_targets must name projections from {', '.join(LORA_TARGETS)} or "
                          f"{', '.join(LORA_WHOLE)}, separated by commas; got {value!r}")
    return names


# Which attention a map shows: the encoder's, the decoder's self-attention, or its cross-attention.
ATTENTION_PARTS = ("encoder", "decoder", "cross")
