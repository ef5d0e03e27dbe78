"""The model's shape (`GPTConfig`): every architecture setting, its one name and default, checked; the
architecture's choices and the parts LoRA may adapt.

Nothing here imports Keras: the command line reads these to build its flags before it chooses the Keras
backend.
"""

import dataclasses

from gptlite.errors import ConfigError, divisors_near, is_count, is_fraction, require
from gptlite.setting import check_choices, declared, setting


@dataclasses.dataclass(frozen=True)
class Choice:
    """One choice of an architecture setting: its `name` in a message ("SwiGLU"), and what it `does`, in the words
    a reader of the page's Inside view is given (which the page shows, and writes no words of its own for)."""

    name: str
    does: str


# The architecture's choices, which gptlite.model.layers builds, each declared once here, its name and its words: a
# setting's choices are these tables themselves (a new one is an entry, and its computation in the layers, its ONNX
# form in gptlite.web.onnx_graph).
POSITION_KINDS = {
    "learned": Choice("learned positions", "a table the model learned, one row per position, added to the token "
                                           "vector"),
    "sinusoidal": Choice("sinusoidal positions", "the fixed sinusoidal table (sines and cosines of the position at "
                                                 "many frequencies), one row per position, added to the token vector"),
    "rotary": Choice("rotary positions", "nothing added to the vector: inside attention, each head's query and key "
                                         "are turned by angles that grow with the position, so that a query-key "
                                         "product depends only on how far apart the two tokens are"),
}
NORM_KINDS = {
    "layer": Choice("LayerNorm", "LayerNorm: x less its mean, divided by its standard deviation, times a learned "
                                 "scale (plus a learned shift, where the model has biases)"),
    "rms": Choice("RMSNorm", "RMSNorm: x divided by the root of its mean square, times a learned scale"),
}
# Where each block normalises: before each sublayer, on its input (today's models), or after the residual
# addition, on the sum (the original Transformer's "Add & Norm").
NORM_POSITION_KINDS = {
    "pre": Choice("pre-norm", "each sublayer reads its input normalised, and its output is added to the residual "
                              "stream as it is; a final norm comes before the head"),
    "post": Choice("post-norm", "each sublayer reads the residual stream as it is, and the sum after each "
                                "addition is normalised; no final norm comes before the head"),
}
MLP_KINDS = {
    "gelu": Choice("GELU", "GELU (GPT-2's smooth ReLU)"),
    "swiglu": Choice("SwiGLU", "SwiGLU: silu(gate) × up, two widened vectors, one gating the other"),
    "relu2": Choice("ReLU²", "ReLU squared: max(0, x)²"),
}
# Each setting's choices, by the setting's name.
CHOICES = {"position": POSITION_KINDS, "norm": NORM_KINDS, "norm_position": NORM_POSITION_KINDS, "mlp": MLP_KINDS}
# What the switches that are on or off do, in the page's words, by the setting (`grouped_query`: fewer key/value
# heads than query heads, `n_kv_head` below `n_head`): (on, off), None where off says nothing.
SWITCH_WORDS = {
    "qk_norm": ("QK-norm: each head's query and key are RMS-normalised, with learned scales, so that their products, "
                "the attention scores, cannot grow without bound", None),
    "tie_weights": ("the output layer reuses the token table: a token's logit is the dot product of the vector with "
                    "its row of the same table as the embedding",
                    "the output layer is a matrix of its own: a token's logit is the dot product of the vector with "
                    "its row of that matrix"),
    "grouped_query": ("grouped-query attention: groups of query heads share one key/value head, read by each of "
                      "them", None),
}


@dataclasses.dataclass(frozen=True)
class GPTConfig:
    """The shape of a GPT, or of a Seq2Seq. Its defaults are the `cpu` preset's shape (a run that names no preset
    takes `laptop`'s). Each field is declared once (`gptlite.setting`): its default, help and choices, and whether
    it is the model's shape."""

    vocab_size: int = setting(256, "number of token ids; None: the tokenizer's, set when the model is made")
    n_layer: int = setting(4, "transformer blocks", shape=True)
    n_head: int = setting(4, "attention heads per block", shape=True)
    n_embd: int = setting(128, "the model's width; must divide by `n_head`", shape=True)
    block_size: int = setting(64, "the longest context the model sees", shape=True)
    dropout: float = setting(0.0, "dropout on embeddings and residual branches")
    attention_dropout: float = setting(0.0, "dropout on attention weights; above 0, training cannot use fused "
                                            "attention")
    bias: bool = setting(False, "biases in the projections and norms", shape=True)
    tie_weights: bool = setting(True, "the output head reuses the token embedding's matrix", shape=True)
    position: str = setting("learned", "learned (a trained table, GPT-2's), sinusoidal (a fixed table) or rotary "
                                       "(RoPE: queries and keys turned by position inside attention)",
                            choices=POSITION_KINDS, shape=True)
    rope_theta: float = setting(10000.0, "rotary positions' base", shape=True)
    norm: str = setting("layer", "layer (LayerNorm, GPT-2's) or rms (RMSNorm, Llama's)", choices=NORM_KINDS, shape=True)
    norm_epsilon: float = setting(1e-5, "added to the variance in every norm", shape=True)
    norm_position: str = setting("pre", "pre (each sublayer reads a normalised input, x + f(norm(x)), and a final "
                                        "norm comes before the head) or post (the sum is normalised, norm(x + f(x)), "
                                        "the original Transformer's; no final norm)",
                                 choices=NORM_POSITION_KINDS, shape=True)
    mlp: str = setting("gelu", "the feed-forward: gelu (GPT-2's), swiglu (Llama's) or relu2 (ReLU squared)",
                       choices=MLP_KINDS, shape=True)
    mlp_hidden_size: int = setting(None, "the feed-forward's hidden width (None: 4 x `n_embd` for gelu and relu2, "
                                         "8/3 x rounded up to a multiple of 16 for swiglu)", shape=True)
    n_kv_head: int = setting(None, "key/value heads, shared by groups of query heads (grouped-query attention; 1: "
                                   "multi-query); the key/value cache holds this many (None: `n_head`)", shape=True)
    qk_norm: bool = setting(False, "RMS-normalise each head's queries and keys", shape=True)
    qkv_bias: bool = setting(None, "biases on the query/key/value projection alone (Qwen2's; None: as `bias`)",
                             shape=True)
    head_dim: int = setting(None, "each attention head's size (None: `n_embd` / `n_head`; Qwen3's heads are "
                                  "wider)", shape=True)

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
        check_choices(self)
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

    def choices_said(self):
        """What each of this model's architecture choices does, in words: {setting: words} (`CHOICES`, and the
        switches of `SWITCH_WORDS` that say something as they are)."""
        said = {name: kinds[getattr(self, name)].does for name, kinds in CHOICES.items()}
        switches = {"qk_norm": self.qk_norm, "tie_weights": self.tie_weights,
                    "grouped_query": self.kv_heads < self.n_head}
        for name, on in switches.items():
            words = SWITCH_WORDS[name][0 if on else 1]
            if words is not None:
                said[name] = words
        return said


# What a resumed run cannot change: the weights' shapes and meaning.
MODEL_SHAPE_SETTINGS = tuple(name for name, field in declared(GPTConfig).items() if field.metadata["shape"])


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
