"""Settings: the model's shape (`GPTConfig`), how to train (`TrainingConfig`), the
presets, how a run's settings are chosen from a preset, overrides and a
checkpoint, the choices a run offers (tasks, tokenizers) and how the server
batches (`ServeSettings`).

Nothing here imports Keras: the command line reads these to build its flags
before it chooses the Keras backend.
"""

import dataclasses
import math

from gptlite.errors import ConfigError
from gptlite.packing import pack_lengths


@dataclasses.dataclass(frozen=True)
class GPTConfig:
    """The shape of a GPT, or of a Seq2Seq. Defaults are the `cpu` training preset."""

    vocab_size: int = 256  # number of token ids; set from the tokenizer
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
    mlp: str = "gelu"  # feed-forward: "gelu" (GPT-2's) or "swiglu" (Llama's)
    mlp_hidden_size: int = None  # the feed-forward's hidden width; None: 4 n_embd for gelu, about 8/3 for swiglu
    n_kv_head: int = None  # key/value heads (grouped-query attention); None: n_head; 1: multi-query
    qk_norm: bool = False  # RMS-normalise each head's queries and keys
    qkv_bias: bool = None  # biases on the query/key/value projection; None: as `bias`
    head_dim: int = None  # each attention head's size; None: n_embd / n_head (Qwen3's heads are wider)

    def __post_init__(self):
        for name in ("vocab_size", "n_layer", "n_head", "n_embd", "block_size"):
            _require(name, getattr(self, name), _is_count, "a positive whole number")
        _require("head_dim", self.head_dim, lambda v: v is None or _is_count(v), "a positive whole number")
        if self.n_embd % self.n_head != 0 and self.head_dim is None:
            raise ConfigError(
                f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head}); "
                f"try n_head {_divisors_near(self.n_embd, self.n_head)}"
            )
        for name in ("dropout", "attention_dropout"):
            _require(name, getattr(self, name), lambda v: 0.0 <= v < 1.0, "in [0, 1)")
        _require("position", self.position, lambda v: v in POSITIONS, _choices(POSITIONS))
        _require("norm", self.norm, lambda v: v in NORMS, _choices(NORMS))
        _require("mlp", self.mlp, lambda v: v in MLPS, _choices(MLPS))
        _require("rope_theta", self.rope_theta, lambda v: not isinstance(v, bool) and v > 1, "a number above 1")
        _require("norm_epsilon", self.norm_epsilon, lambda v: not isinstance(v, bool) and 0 < v < 1,
                 "a small positive number")
        _require("mlp_hidden_size", self.mlp_hidden_size, lambda v: v is None or _is_count(v),
                 "a positive whole number")
        _require("n_kv_head", self.n_kv_head, lambda v: v is None or _is_count(v), "a positive whole number")
        for name in ("bias", "tie_weights", "qk_norm"):
            _require(name, getattr(self, name), lambda v: isinstance(v, bool), "true or false")
        _require("qkv_bias", self.qkv_bias, lambda v: v is None or isinstance(v, bool), "true or false")
        if self.n_head % self.kv_heads:
            raise ConfigError(f"n_head ({self.n_head}) must be divisible by n_kv_head ({self.n_kv_head}): each "
                              f"key/value head serves the same number of query heads; try n_kv_head "
                              f"{_divisors_near(self.n_head, self.kv_heads)}")
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


def _choices(names):
    return "one of " + ", ".join(repr(name) for name in names)


# The architecture's choices, which gptlite.layers builds.
POSITIONS = ("learned", "sinusoidal", "rotary")
NORMS = ("layer", "rms")
MLPS = ("gelu", "swiglu")
# Keras dtype policies: mixed ones keep float32 weights and optimizer state,
# and compute in 16 bits; float16 also scales the loss (Keras does it in compile).
PRECISIONS = {"fp32": "float32", "bf16": "mixed_bfloat16", "fp16": "mixed_float16"}


@dataclasses.dataclass(frozen=True)
class TrainingConfig:
    """How to train. Defaults are the `cpu` preset."""

    batch_size: int = 12  # sequences per micro-batch; a step takes grad_accum of them
    grad_accum: int = 1  # micro-batches whose gradients add up to one optimizer step
    max_iters: int = 2000  # optimizer steps in the whole run
    lr: float = 1e-3  # peak learning rate, reached after warm-up
    min_lr: float = 1e-4  # learning rate at the end of the cosine decay
    warmup_iters: int = 100  # steps of linear warm-up
    beta2: float = 0.99  # AdamW's second-moment decay; 0.99 suits small batches
    weight_decay: float = 0.1  # AdamW decay, on weight matrices only
    eval_interval: int = 250  # steps between validation-loss evaluations
    eval_iters: int = 20  # validation batches per evaluation
    checkpoint_interval: int = 250  # steps between resumable checkpoints
    seed: int = 1337  # seeds weights, batches and dropout
    precision: str = "fp32"  # "fp32"; "bf16" or "fp16": mixed, float32 weights, 16-bit compute
    lora_rank: int = 0  # above 0: train rank-r adapters on the lora_targets projections, all else frozen
    lora_alpha: float = None  # the adapters' scale is lora_alpha / lora_rank; None: the rank (scale 1)
    lora_targets: str = "qkv,attention_output,expand,contract"  # comma-separated, from LORA_TARGETS

    def __post_init__(self):
        for name in ("batch_size", "grad_accum", "max_iters", "eval_interval", "eval_iters", "checkpoint_interval"):
            _require(name, getattr(self, name), _is_count, "a positive whole number")
        _require("warmup_iters", self.warmup_iters, lambda v: v == 0 or _is_count(v), "zero or a positive whole number")
        _require("lr", self.lr, lambda v: v > 0, "positive")
        _require("min_lr", self.min_lr, lambda v: v > 0, "positive")
        if self.min_lr > self.lr:
            raise ConfigError(f"min_lr ({self.min_lr}) must not be above lr ({self.lr})")
        if self.warmup_iters >= self.max_iters:
            raise ConfigError(f"warmup_iters ({self.warmup_iters}) must be below max_iters ({self.max_iters})")
        _require("beta2", self.beta2, lambda v: 0 <= v < 1, "in [0, 1)")
        _require("weight_decay", self.weight_decay, lambda v: v >= 0, "zero or positive")
        _require("precision", self.precision, lambda v: v in PRECISIONS, f"one of {', '.join(PRECISIONS)}")
        _require("lora_rank", self.lora_rank, lambda v: v == 0 or _is_count(v),
                 "zero (off) or a positive whole number")
        _require("lora_alpha", self.lora_alpha, lambda v: v is None or v > 0, "positive")
        lora_targets(self.lora_targets)


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


def _is_count(value):
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _require(name, value, is_valid, description):
    try:
        valid = is_valid(value)
    except TypeError:  # a value of the wrong type altogether
        valid = False
    if not valid:
        raise ConfigError(f"{name} must be {description}, got {value!r}")


def _divisors_near(width, heads):
    divisors = [d for d in range(1, width + 1) if width % d == 0]
    closest = sorted(divisors, key=lambda d: (abs(d - heads), d))[:2]
    return " or ".join(str(d) for d in sorted(closest))


PRESETS = {
    # nanoGPT's CPU configuration for Tiny Shakespeare, so results compare
    # directly, but for the peak learning rate: 3e-3 rather than 1e-3 takes
    # this small model further in its 2000 steps (BENCHMARKS.md).
    "cpu": dict(
        n_layer=4, n_head=4, n_embd=128, block_size=64, dropout=0.0,
        batch_size=12, max_iters=2000, lr=3e-3, min_lr=1e-4, warmup_iters=100,
        beta2=0.99, weight_decay=0.1, eval_interval=250, eval_iters=20, checkpoint_interval=250,
    ),
    # The cpu preset's budget (steps, batch, context, width) with the architecture of today's small
    # models: rotary positions, RMSNorm, SwiGLU, 2 key/value heads for 4 (half the cache) and QK-norm.
    # On Tiny Shakespeare it reached a validation loss of 1.66 against the cpu preset's 1.78, at 0.9x
    # its time per step (BENCHMARKS.md, "Architectures on Tiny Shakespeare").
    "modern": dict(
        n_layer=4, n_head=4, n_embd=128, block_size=64, dropout=0.0,
        batch_size=12, max_iters=2000, lr=3e-3, min_lr=1e-4, warmup_iters=100,
        beta2=0.99, weight_decay=0.1, eval_interval=250, eval_iters=20, checkpoint_interval=250,
        position="rotary", norm="rms", mlp="swiglu", n_kv_head=2, qk_norm=True,
    ),
    # nanoGPT's GPU configuration for Tiny Shakespeare, in bfloat16 (on a GPU
    # without it, set precision fp16). Dropout stays off the attention
    # weights, so attention runs fused (flash where the backend has it).
    "gpu": dict(
        n_layer=6, n_head=6, n_embd=384, block_size=256, dropout=0.2,
        batch_size=64, max_iters=5000, lr=1e-3, min_lr=1e-4, warmup_iters=100,
        beta2=0.99, weight_decay=0.1, eval_interval=250, eval_iters=20, checkpoint_interval=250,
        precision="bf16",
    ),
    # The seq2seq model's: an encoder and a decoder of 2 blocks each. Its
    # block size, unless given, is the longest pair's.
    "seq2seq": dict(
        n_layer=2, n_head=4, n_embd=128, dropout=0.0,
        batch_size=128, max_iters=6000, lr=3e-3, min_lr=3e-4, warmup_iters=200,
        beta2=0.99, weight_decay=0.1, eval_interval=500, eval_iters=10, checkpoint_interval=500,
    ),
    # Seconds long: for tests and first tries.
    "tiny": dict(
        n_layer=2, n_head=2, n_embd=32, block_size=32, dropout=0.0,
        batch_size=8, max_iters=60, lr=3e-3, min_lr=3e-4, warmup_iters=5,
        beta2=0.99, weight_decay=0.1, eval_interval=20, eval_iters=4, checkpoint_interval=20,
    ),
}
DEFAULT_PRESET = "cpu"
# The steps of the seq2seq preset for a synthetic task: about what each task
# takes to decode 99% of its held-out pairs exactly (BENCHMARKS.md).
SYNTHETIC_MAX_ITERS = {"addition": 8000, "reverse": 1500, "sort": 6000}
SYNTHETIC_TASKS = tuple(SYNTHETIC_MAX_ITERS)
# The built-in conversation tasks (gptlite.chat_tasks).
CHAT_SYNTHETIC_TASKS = ("arithmetic", "direct", "recall", "copy", "backwards")
# A chat run from scratch that names no preset is sized from its conversations (`chat_settings`): the modern
# preset's model (trained as the cpu preset, the arithmetic task answered 3% of held-out questions exactly
# after 1,500 steps, against 91%; BENCHMARKS.md) with small batches; the shortest of CHAT_CONTEXTS that holds
# CHAT_COVERED of the conversations whole; CHAT_EPOCHS passes over the packed rows, at least CHAT_MIN_STEPS
# steps and at most CHAT_MAX_TOKENS tokens at a context of 128 (fewer above it and the same steps below it: see
# chat_token_cost): 13.1 to 14.0 minutes launch to exit for the family's tasks at 128 on 2 cores of machine B
# (AMD Zen 4; BENCHMARKS.md, "The whole family within 15 minutes"), 21.0 on 2 of an AMD Zen 2 (machine H, AVX2
# alone, before tf.data's waits were mended: "Chat on an older CPU"), where 9,000 steps would fit 15 minutes by its
# steps' speed, but left two seeds of four of the direct task at 79% and 81%; evaluated and saved about
# CHAT_EVALUATIONS times, the validation loss over CHAT_VALIDATION_ROWS rows (as many as 20 batches of 32 gave).
# Small batches, since the same tokens in more steps learn the tasks sooner: with batches of 32, three seeds
# answered 98%, 80% and 65% of the direct task's held-out questions exactly; with batches of 8 and the same
# tokens, 100%, 90% and 93% (BENCHMARKS.md, "Chat tasks with batches of 8"). Contexts between 128 and 256,
# since a file whose longest conversations were a little over 128 tokens went to 256, where its cap in tokens
# took 20 minutes, not 12 (BENCHMARKS.md, "A file of another shape").
CHAT_BATCH_SIZE = 8
CHAT_CONTEXTS = (64, 128, 160, 192, 256)
CHAT_COVERED = 0.99
CHAT_EPOCHS = 20
CHAT_MIN_STEPS = 1000
CHAT_MAX_TOKENS = 3000 * 32 * 128
# A token's training time at a context of 256 over one at 128 (the attention grows with the context, the rest
# does not): 1.58 on machine B (BENCHMARKS.md, "A file of another shape"); taken as linear in between.
CHAT_COST_AT_256 = 1.58
CHAT_EVALUATIONS = 10
CHAT_VALIDATION_ROWS = 640
# How a chat run from scratch that names no tokenizer reads its conversations: as byte-level BPE tokens, each digit
# a token of its own, where at least CHAT_BPE_SHARE of the words its answers write are words that CHAT_REPEATED
# conversations or more hold, so that a word is a token it learns from many examples; as characters where they spell
# out strings the file rarely repeats (made-up words to copy or reverse, which BPE would cut into pieces learned
# from other strings), or hold no words (numbers alone read as short in characters). A file of arithmetic questions
# answered in a sentence: 77% of its held-out questions right in characters, 100% in BPE tokens in fewer steps
# (BENCHMARKS.md, "Chat in words and digits").
CHAT_REPEATED = 10
CHAT_BPE_SHARE = 0.8
# What a run trains (a GPT on text, an encoder-decoder, a GPT on conversations), and the tokenizers a new
# run can fit.
TASKS = ("lm", "seq2seq", "chat")
TOKENIZERS = ("char", "bpe")
# What becomes of characters a vocabulary lacks: an error, left out, or spaces (tokenizers.known_text).
UNKNOWN_CHOICES = ("error", "skip", "replace")
DEFAULT_BPE_VOCABULARY = 4096
# How a GGUF file stores the weight matrices (gptlite.gguf_export): float32, float16, or llama.cpp's 8-bit
# blocks of 32 weights with a 16-bit scale each.
GGUF_OUTTYPES = ("f32", "f16", "q8_0")
# The attention a Seq2Seq has: its encoder's, its decoder's own, and the decoder's over the source.
ATTENTION_PARTS = ("encoder", "decoder", "cross")
# Settings a resumed run cannot change: they decide the weights' shapes and meaning.
MODEL_SHAPE_SETTINGS = ("n_layer", "n_head", "n_embd", "block_size", "bias", "tie_weights", "position",
                        "rope_theta", "norm", "norm_epsilon", "mlp", "mlp_hidden_size", "n_kv_head", "qk_norm",
                        "qkv_bias", "head_dim")
# What a run that starts from a pretrained model may set of its shape: a shorter context, and dropout.
FINE_TUNING_SHAPE_SETTINGS = ("block_size", "dropout", "attention_dropout")
# Training a run that starts from a pretrained model, unless the preset or overrides say otherwise:
# fewer steps at a lower learning rate, so that it adapts what it knows rather than forgetting it.
# Adapters start at zero and move only a few weights: they take a higher rate.
FINE_TUNING = dict(max_iters=500, lr=1e-4, min_lr=1e-5, warmup_iters=10, batch_size=8, eval_interval=100,
                   eval_iters=20, checkpoint_interval=100, dropout=0.0)
LORA_LEARNING_RATES = dict(lr=1e-3, min_lr=1e-4)
# The longest context a fine-tuning run trains at unless `block_size` says (GPT-2's).
FINE_TUNING_CONTEXT = 1024
# Every setting a preset or an override may set (vocab_size comes from the tokenizer).
SETTING_NAMES = tuple(
    f.name for f in dataclasses.fields(GPTConfig) + dataclasses.fields(TrainingConfig) if f.name != "vocab_size"
)


@dataclasses.dataclass(frozen=True)
class ServeSettings:
    """How the server batches and what it allows."""

    batch_window_ms: float = 10.0  # how long the first request of a batch waits for others
    max_batch: int = 8  # rows decoded together at most
    max_queue: int = 64  # requests waiting at most; beyond it, 503
    max_tokens_limit: int = 1024  # the most `max_tokens` a request may ask for
    max_n: int = 8  # the most choices per prompt
    api_key: str = None  # given: every API call needs `Authorization: Bearer <api_key>`
    truncate: str = "left"  # a prompt longer than the context: "left" cuts it as generate does, "none" refuses it

    def __post_init__(self):
        for name in ("max_batch", "max_queue", "max_tokens_limit", "max_n"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be a positive whole number, got {value!r}")
        if not (isinstance(self.batch_window_ms, (int, float)) and 0 <= self.batch_window_ms <= 10_000):
            raise ConfigError(f"batch_window_ms must be from 0 to 10000, got {self.batch_window_ms!r}")
        if self.truncate not in ("left", "none"):
            raise ConfigError(f"truncate must be 'left' or 'none', got {self.truncate!r}")


def dtype_policy(precision):
    """The Keras dtype policy for a `TrainingConfig.precision`."""
    return PRECISIONS[precision]


def chat_tokenizer(repeated):
    """The tokenizer of a chat run from scratch ("bpe" or "char") whose answers' words are `repeated` (the share
    that CHAT_REPEATED conversations or more hold; None where the answers hold no words), and why, in a few words."""
    if repeated is None:
        return "char", "characters, since the answers hold no words"
    if repeated >= CHAT_BPE_SHARE:
        return "bpe", (f"byte-level BPE tokens with each digit apart, since {repeated:.0%} of the answers' words are "
                       f"in {CHAT_REPEATED} conversations or more")
    return "char", f"characters, since {1 - repeated:.0%} of the answers' words are in fewer than {CHAT_REPEATED} " \
                   f"conversations"


def chat_settings(lengths, reading=None):
    """The settings a chat run from scratch starts from, sized from its conversations' `lengths` in tokens, and a
    line that says what was chosen and why (see CHAT_BATCH_SIZE and the constants beside it), with `reading`
    (how the conversations are read, `chat_tokenizer`'s words) where given."""
    lengths = sorted(int(length) for length in lengths)
    if not lengths:
        raise ConfigError("there are no conversations to size a chat run from")
    covered = lengths[max(0, math.ceil(CHAT_COVERED * len(lengths)) - 1)]  # CHAT_COVERED of them are this long
    block_size = next((context for context in CHAT_CONTEXTS if context + 1 >= covered), CHAT_CONTEXTS[-1])
    rows = packed_rows(lengths, block_size)
    batch_size = CHAT_BATCH_SIZE
    most = max(CHAT_MIN_STEPS, int(CHAT_MAX_TOKENS / chat_token_cost(block_size)) // (batch_size * block_size)
               // 100 * 100)
    steps = min(most, max(CHAT_MIN_STEPS, -(-CHAT_EPOCHS * rows // batch_size // 100) * 100))
    interval = max(100, steps // CHAT_EVALUATIONS // 100 * 100)
    chosen = {**PRESETS["modern"], "batch_size": batch_size, "block_size": block_size, "max_iters": steps,
              "eval_interval": interval, "checkpoint_interval": interval,
              "eval_iters": CHAT_VALIDATION_ROWS // batch_size}
    whole = sum(length <= block_size + 1 for length in lengths) / len(lengths)
    line = (f"chat settings sized from {len(lengths):,} conversations: " + (f"{reading}; " if reading else "")
            + f"context {block_size} ({whole:.0%} fit whole; "
            f"{CHAT_COVERED:.0%} are at most {covered} tokens), {steps:,} steps of {batch_size} rows "
            f"({steps * batch_size / rows:.1f} passes over {rows:,} packed rows"
            + ("; the most that trains in about 14 minutes on 2 cores of a recent CPU, more on an older one"
               if steps == most else "")
            + "), the modern preset's model; a setting given overrides these")
    return chosen, line


def chat_token_cost(block_size):
    """How long a token of a chat run at `block_size` trains, as a multiple of one at a context of 128: 1 at 128
    (measured there), growing linearly to CHAT_COST_AT_256 at 256; below 128, as a step of 128 does (8 rows of 64
    took from 41 to 59 ms a step on machine B, of 128 from 63 to 80 ms: so small a step keeps two cores less
    busy), so that a shorter context gets the steps of 128, which fit the time at the slower figure too."""
    return 1 + (CHAT_COST_AT_256 - 1) * max(0, block_size - 128) / 128 if block_size >= 128 else 128 / block_size


def packed_rows(lengths, block_size):
    """How many rows of block_size + 1 tokens conversations of `lengths` pack into (see `packing`), as
    `conversations.pack` packs them."""
    return len(pack_lengths(lengths, block_size + 1))


def default_settings(seq2seq=False, synthetic=None):
    """A run's settings before any preset or override: the cpu preset's for a GPT,
    the seq2seq preset's for a Seq2Seq, with a synthetic task's own number of steps."""
    if not seq2seq:
        return PRESETS[DEFAULT_PRESET]
    return {**PRESETS["seq2seq"], **({"max_iters": SYNTHETIC_MAX_ITERS[synthetic]} if synthetic else {})}


def split_settings(settings):
    """Split one flat dict of settings into (GPTConfig fields, TrainingConfig fields)."""
    model_fields = {f.name for f in dataclasses.fields(GPTConfig)}
    training_fields = {f.name for f in dataclasses.fields(TrainingConfig)}
    unknown = set(settings) - model_fields - training_fields
    if unknown:
        raise ConfigError(f"unknown settings: {', '.join(sorted(unknown))}")
    model = {k: v for k, v in settings.items() if k in model_fields}
    training = {k: v for k, v in settings.items() if k in training_fields}
    return model, training


def resolve_settings(preset=None, overrides=None, checkpoint=None, seq2seq=False, synthetic=None, pretrained=None,
                     chat=None):
    """A run's settings as one flat dict: the defaults, then the preset's values, then `overrides`.

    A chat run from scratch without a preset gives `chat`, its defaults sized
    from its conversations (`chat_settings`), in place of the defaults.

    Resuming from `checkpoint` (a checkpoint document), the checkpoint's
    settings come first, and an override may change how the run trains
    (say, more max_iters), never the model's shape, its precision, its
    adapters or its gradient accumulation. Starting from a `pretrained` model's `GPTConfig`, its shape
    comes first and the defaults are FINE_TUNING's; an override may shorten
    block_size or change dropout, nothing else of the shape (a preset's
    shape is left out).
    """
    if preset is not None and preset not in PRESETS:
        raise ConfigError(f"preset must be one of {', '.join(sorted(PRESETS))}, got {preset!r}")
    overrides = {name: value for name, value in (overrides or {}).items() if value is not None}
    unknown = sorted(set(overrides) - set(SETTING_NAMES))
    if unknown:
        raise ConfigError(f"unknown settings: {', '.join(unknown)} (the settings are {', '.join(SETTING_NAMES)})")
    requested = {**(PRESETS[preset] if preset else {}), **overrides}
    if checkpoint is None and pretrained is not None:
        return _fitted_warmup(_fine_tuning_settings(pretrained, preset, overrides), overrides)
    if checkpoint is None:
        defaults = chat if chat is not None and preset is None else default_settings(seq2seq, synthetic)
        return _fitted_warmup({**defaults, **requested}, overrides)
    # A checkpoint written before a setting existed has that setting's default.
    saved = {name: checkpoint["model_config"].get(name, getattr(GPTConfig, name)) for name in MODEL_SHAPE_SETTINGS}
    # The optimizer state saved with float16 has a loss scale that the others lack.
    saved["precision"] = checkpoint["training_config"].get("precision", "fp32")
    # Adapters are weights of their own, in the checkpoint, and so are the gradient accumulators.
    for name in ("lora_rank", "lora_targets", "grad_accum"):
        saved[name] = checkpoint["training_config"].get(name, getattr(TrainingConfig, name))
    conflicts = {name: f"`{name}` is {saved[name]} in the checkpoint, {value} here"
                 for name, value in requested.items() if name in saved and value != saved[name]}
    if conflicts:
        shape = [conflict for name, conflict in conflicts.items() if name in MODEL_SHAPE_SETTINGS]
        state = [conflict for name, conflict in conflicts.items() if name not in MODEL_SHAPE_SETTINGS]
        reasons = ([f"the checkpoint's model has another shape ({'; '.join(shape)})"] if shape else []) + (
            [f"the checkpoint's optimizer state was saved for other settings ({'; '.join(state)})"] if state else [])
        raise ConfigError(
            f"cannot resume: {' and '.join(reasons)}; leave those settings out, or start a new run in another folder"
        )
    return {**saved, **checkpoint["training_config"],
            **{name: value for name, value in requested.items() if name not in saved}}


def _fitted_warmup(settings, overrides):
    """A preset's warm-up takes at most a fifth of a run's steps, so that a short run still warms up and decays.

    A warm-up given as an override is kept as given (and refused if it does not fit).
    """
    if "warmup_iters" in overrides:
        return settings
    return {**settings, "warmup_iters": min(settings["warmup_iters"], settings["max_iters"] // 5)}


def _fine_tuning_settings(pretrained, preset, overrides):
    shape = {name: getattr(pretrained, name) for name in MODEL_SHAPE_SETTINGS}
    refused = [f"`{name}` is {shape[name]} in the pretrained model, {value} here"
               for name, value in overrides.items()
               if name in shape and name not in FINE_TUNING_SHAPE_SETTINGS and value != shape[name]]
    if refused:
        raise ConfigError(f"a pretrained model keeps its shape: {'; '.join(refused)}; leave those settings out")
    if overrides.get("block_size", 0) > pretrained.block_size:
        raise ConfigError(f"`block_size={overrides['block_size']}` is longer than the pretrained model's context, "
                          f"{pretrained.block_size}; it may only shrink")
    # Llama-family models read thousands of positions; training windows that long would not fit a laptop.
    shape["block_size"] = min(shape["block_size"], FINE_TUNING_CONTEXT)
    model_fields = {field.name for field in dataclasses.fields(GPTConfig)}
    preset_training = {name: value for name, value in (PRESETS[preset] if preset else {}).items()
                       if name not in model_fields}
    adapters = LORA_LEARNING_RATES if overrides.get("lora_rank") else {}
    return {**default_settings(), **shape, **FINE_TUNING, **adapters, **preset_training, **overrides}
