"""Training settings: how to train (`TrainingConfig`), the presets, how a run's settings are chosen from a
preset, overrides and a checkpoint, and the choices a run offers (tasks, tokenizers, chat sizing). The model's
shape is `gptlite.model.config.GPTConfig`.

Nothing here imports Keras: the command line reads these to build its flags
before it chooses the Keras backend.
"""

import dataclasses
import math

from gptlite.data import CHAT_SYNTHETIC_TASKS, SYNTHETIC_TASKS  # noqa: F401 (the choices a run offers)
from gptlite.data.packing import pack_lengths
from gptlite.errors import ConfigError, is_count, require
from gptlite.model.config import GPTConfig, lora_targets


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
            require(name, getattr(self, name), is_count, "a positive whole number")
        require("warmup_iters", self.warmup_iters, lambda v: v == 0 or is_count(v), "zero or a positive whole number")
        require("lr", self.lr, lambda v: v > 0, "positive")
        require("min_lr", self.min_lr, lambda v: v > 0, "positive")
        if self.min_lr > self.lr:
            raise ConfigError(f"min_lr ({self.min_lr}) must not be above lr ({self.lr})")
        if self.warmup_iters >= self.max_iters:
            raise ConfigError(f"warmup_iters ({self.warmup_iters}) must be below max_iters ({self.max_iters})")
        require("beta2", self.beta2, lambda v: 0 <= v < 1, "in [0, 1)")
        require("weight_decay", self.weight_decay, lambda v: v >= 0, "zero or positive")
        require("precision", self.precision, lambda v: v in PRECISIONS, f"one of {', '.join(PRECISIONS)}")
        require("lora_rank", self.lora_rank, lambda v: v == 0 or is_count(v),
                 "zero (off) or a positive whole number")
        require("lora_alpha", self.lora_alpha, lambda v: v is None or v > 0, "positive")
        lora_targets(self.lora_targets)


PRESETS = {
    # nanoGPT's CPU configuration for Tiny Shakespeare, so results compare
    # directly, but for the peak learning rate: 3e-3 rather than 1e-3 takes
    # this small model further in its 2000 steps (benchmarks/journal.md).
    "cpu": dict(
        n_layer=4, n_head=4, n_embd=128, block_size=64, dropout=0.0,
        batch_size=12, max_iters=2000, lr=3e-3, min_lr=1e-4, warmup_iters=100,
        beta2=0.99, weight_decay=0.1, eval_interval=250, eval_iters=20, checkpoint_interval=250,
    ),
    # The cpu preset's budget (steps, batch, context, width) with the architecture of today's small
    # models: rotary positions, RMSNorm, SwiGLU, 2 key/value heads for 4 (half the cache) and QK-norm.
    # On Tiny Shakespeare it reached a validation loss of 1.66 against the cpu preset's 1.78, at 0.9x
    # its time per step (benchmarks/journal.md, "Architectures on Tiny Shakespeare").
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
# takes to decode 99% of its held-out pairs exactly (benchmarks/journal.md).
SYNTHETIC_MAX_ITERS = {"addition": 8000, "reverse": 1500, "sort": 6000}
assert tuple(SYNTHETIC_MAX_ITERS) == SYNTHETIC_TASKS
# A chat run from scratch that names no preset is sized from its conversations (`chat_settings`): the modern
# preset's model (trained as the cpu preset, the arithmetic task answered 3% of held-out questions exactly
# after 1,500 steps, against 91%; benchmarks/journal.md) with small batches; the shortest of CHAT_CONTEXTS that holds
# CHAT_COVERED of the conversations whole; CHAT_EPOCHS passes over the packed rows, at least CHAT_MIN_STEPS
# steps and at most CHAT_MAX_TOKENS tokens at a context of 128 (fewer above it and the same steps below it: see
# chat_token_cost): 13.1 to 14.0 minutes launch to exit for the family's tasks at 128 on 2 cores of machine B
# (AMD Zen 4; benchmarks/journal.md, "The whole family within 15 minutes"), 21.0 on 2 of an AMD Zen 2 (machine H, AVX2
# alone, before tf.data's waits were mended: "Chat on an older CPU"), where 9,000 steps would fit 15 minutes by its
# steps' speed, but left two seeds of four of the direct task at 79% and 81%; evaluated and saved about
# CHAT_EVALUATIONS times, the validation loss over CHAT_VALIDATION_ROWS rows (as many as 20 batches of 32 gave).
# Small batches, since the same tokens in more steps learn the tasks sooner: with batches of 32, three seeds
# answered 98%, 80% and 65% of the direct task's held-out questions exactly; with batches of 8 and the same
# tokens, 100%, 90% and 93% (benchmarks/journal.md, "Chat tasks with batches of 8"). Contexts between 128 and 256,
# since a file whose longest conversations were a little over 128 tokens went to 256, where its cap in tokens
# took 20 minutes, not 12 (benchmarks/journal.md, "A file of another shape").
CHAT_BATCH_SIZE = 8
CHAT_CONTEXTS = (64, 128, 160, 192, 256)
CHAT_COVERED = 0.99
CHAT_EPOCHS = 20
CHAT_MIN_STEPS = 1000
CHAT_MAX_TOKENS = 3000 * 32 * 128
# A token's training time at a context of 256 over one at 128 (the attention grows with the context, the rest
# does not): 1.58 on machine B (benchmarks/journal.md, "A file of another shape"); taken as linear in between.
CHAT_COST_AT_256 = 1.58
CHAT_EVALUATIONS = 10
CHAT_VALIDATION_ROWS = 640
# How a chat run from scratch that names no tokenizer reads its conversations: as byte-level BPE tokens, each digit
# a token of its own, where at least CHAT_BPE_SHARE of the words its answers write are words that CHAT_REPEATED
# conversations or more hold, so that a word is a token it learns from many examples; as characters where they spell
# out strings the file rarely repeats (made-up words to copy or reverse, which BPE would cut into pieces learned
# from other strings), or hold no words (numbers alone read as short in characters). A file of arithmetic questions
# answered in a sentence: 77% of its held-out questions right in characters, 100% in BPE tokens in fewer steps
# (benchmarks/journal.md, "Chat in words and digits").
CHAT_REPEATED = 10
CHAT_BPE_SHARE = 0.8
# What a run trains (a GPT on text, an encoder-decoder, a GPT on conversations), and the tokenizers a new
# run can fit.
TASKS = ("lm", "seq2seq", "chat")
TOKENIZERS = ("char", "bpe")
DEFAULT_BPE_VOCABULARY = 4096
# The attention a Seq2Seq has: its encoder's, its decoder's own, and the decoder's over the source.

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
