"""Training settings: how to train (`TrainingConfig`), the presets, and how a run's settings are chosen from a
preset, overrides, a checkpoint or a pretrained model. The model's shape is `gptlite.model.config.GPTConfig`;
what a chat run sizes from its conversations, `gptlite.tasks.chat_sizing`.

Nothing here imports Keras: the command line reads these to build its flags
before it chooses the Keras backend.
"""

import dataclasses

from gptlite.data import CHAT_SYNTHETIC_TASKS, SYNTHETIC_TASKS  # noqa: F401 (the choices a run offers)
from gptlite.errors import ConfigError, is_count, is_fraction, require
from gptlite.model.config import GPTConfig, LORA_TARGETS, lora_targets, MODEL_SHAPE_SETTINGS
from gptlite.setting import check_choices, setting
from gptlite.tasks import TASKS


# Keras dtype policies: mixed ones keep float32 weights and optimizer state,
# and compute in 16 bits; float16 also scales the loss (Keras does it in compile).
PRECISIONS = {"fp32": "float32", "bf16": "mixed_bfloat16", "fp16": "mixed_float16"}
# adamw: AdamW for every weight. muon: Keras's Muon (momentum, then each update orthogonalised by Newton-Schulz
# iterations) for the blocks' weight matrices, and AdamW for the embeddings, the output head, norms and biases.
OPTIMIZERS = ("adamw", "muon")
OPTIMIZER_NAMES = {"adamw": "AdamW", "muon": "Muon (AdamW for embeddings, norms and biases)"}  # as a run says it
assert tuple(OPTIMIZER_NAMES) == OPTIMIZERS


@dataclasses.dataclass(frozen=True)
class TrainingConfig:
    """How to train. Its defaults are the `cpu` preset's (a run that names no preset takes `laptop`'s). Each field is
    declared once (`gptlite.setting`)."""

    batch_size: int = setting(12, "sequences per micro-batch; a step takes `grad_accum` of them")
    grad_accum: int = setting(1, "each optimizer step adds up the gradients of this many batches of `batch_size`: a "
                                 "batch that many times larger in the memory of one; steps and intervals count "
                                 "optimizer steps")
    max_iters: int = setting(2000, "optimizer steps in the whole run")
    lr: float = setting(1e-3, "the peak learning rate, reached after warm-up")
    min_lr: float = setting(1e-4, "the learning rate at the end of the cosine decay")
    warmup_iters: int = setting(100, "steps of linear learning-rate warm-up (a preset's: at most a fifth of "
                                     "`max_iters`)")
    optimizer: str = setting("adamw", "adamw, or muon (the laptop preset's): Muon for the blocks' weight matrices "
                                      "(each update orthogonalised), AdamW for the embeddings, the output head, "
                                      "norms and biases; the same learning rate for both", choices=OPTIMIZERS)
    newton_schulz_steps: int = setting(5, "with muon: the Newton-Schulz iterations that orthogonalise each update "
                                          "(Keras's default is 5)")
    muon_momentum: float = setting(0.95, "with muon: the share of its momentum each step keeps before adding the "
                                         "gradient (Keras's default)")
    beta2: float = setting(0.99, "AdamW's second-moment decay; 0.99 suits small batches")
    weight_decay: float = setting(0.1, "AdamW's decay, on weight matrices only")
    eval_interval: int = setting(250, "steps between validation-loss evaluations")
    eval_iters: int = setting(20, "validation batches per evaluation")
    checkpoint_interval: int = setting(250, "steps between resumable checkpoints")
    steps_per_call: int = setting(1, "optimizer steps each compiled call runs, so that the loop around the steps "
                                     "runs once for that many (torch runs one a call); the same losses whatever it "
                                     "is; a stop (Ctrl-C) waits for the call's last step")
    seed: int = setting(1337, "seeds the weights, the batches and dropout")
    precision: str = setting("fp32", "fp32; bf16 or fp16: mixed, float32 weights and 16-bit compute",
                             choices=tuple(PRECISIONS))
    lora_rank: int = setting(0, "above 0: train rank-r low-rank adapters on the projections `lora_targets` names, "
                                "every other weight frozen; the saved model holds the merged weights")
    lora_alpha: float = setting(None, "the adapters' scale is this over `lora_rank` (None: the rank, a scale of 1)")
    lora_targets: str = setting("qkv,attention_output,expand,contract",
                                f"which projections of each block get adapters, comma-separated from "
                                f"{','.join(LORA_TARGETS)}; 'embedding' also trains the token embedding whole, "
                                f"'norms' every norm's scale (and shift)", metavar="NAMES")

    def __post_init__(self):
        for name in ("batch_size", "grad_accum", "max_iters", "eval_interval", "eval_iters", "checkpoint_interval",
                     "steps_per_call"):
            require(name, getattr(self, name), is_count, "a positive whole number")
        require("warmup_iters", self.warmup_iters, lambda v: v == 0 or is_count(v), "zero or a positive whole number")
        require("lr", self.lr, lambda v: v > 0, "positive")
        require("min_lr", self.min_lr, lambda v: v > 0, "positive")
        if self.min_lr > self.lr:
            raise ConfigError(f"min_lr ({self.min_lr}) must not be above lr ({self.lr})")
        if self.warmup_iters >= self.max_iters:
            raise ConfigError(f"warmup_iters ({self.warmup_iters}) must be below max_iters ({self.max_iters})")
        for name in ("beta2", "muon_momentum"):
            require(name, getattr(self, name), is_fraction, "in [0, 1)")
        require("weight_decay", self.weight_decay, lambda v: v >= 0, "zero or positive")
        check_choices(self)
        require("newton_schulz_steps", self.newton_schulz_steps, is_count, "a positive whole number")
        require("lora_rank", self.lora_rank, lambda v: v == 0 or is_count(v),
                 "zero (off) or a positive whole number")
        require("lora_alpha", self.lora_alpha, lambda v: v is None or v > 0, "positive")
        lora_targets(self.lora_targets)
        if self.lora_rank and self.optimizer != "adamw":
            raise ConfigError(f"LoRA's adapters train with the adamw optimizer, not {self.optimizer}")


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
    # The modern preset's model trained by Muon, for the steps its slower step fits in the cpu and modern
    # presets' wall time. On Tiny Shakespeare it reached 1.56-1.61 where modern reached 1.61-1.66 and cpu
    # 1.74-1.78, in the same time, with every seed (docs/training.md). Each Newton-Schulz iteration costs about
    # a tenth of its step on 2 cores: 3 for Keras's 5 leave time for 1,700 steps where 5 take 1,500, lower with
    # every seed measured.
    "laptop": dict(
        n_layer=4, n_head=4, n_embd=128, block_size=64, dropout=0.0,
        batch_size=12, max_iters=1700, lr=3e-3, min_lr=1e-4, warmup_iters=100,
        beta2=0.99, weight_decay=0.1, eval_interval=250, eval_iters=20, checkpoint_interval=250,
        position="rotary", norm="rms", mlp="swiglu", n_kv_head=2, qk_norm=True, optimizer="muon",
        newton_schulz_steps=3,
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
    # Seconds long: for tests and first tries.
    "tiny": dict(
        n_layer=2, n_head=2, n_embd=32, block_size=32, dropout=0.0,
        batch_size=8, max_iters=60, lr=3e-3, min_lr=3e-4, warmup_iters=5,
        beta2=0.99, weight_decay=0.1, eval_interval=20, eval_iters=4, checkpoint_interval=20,
    ),
}
# What a new language model trains with where a run names no preset: the one that reached the lowest
# validation loss in the same wall time, with every seed, on Tiny Shakespeare (characters and a BPE of 2,048
# tokens) and on Python sources (docs/training.md, "What each technique buys").
DEFAULT_PRESET = "laptop"
# The presets of the tasks that have their own (tasks.TASKS declares them), each named as its task.
PRESETS.update({name: declared.preset for name, declared in TASKS.items() if declared.preset})
# The settings a synthetic task trains with over its task's preset, where it takes other than the preset's (TASKS
# declares them), and the steps among them.
SYNTHETIC_SETTINGS = {name: settings for declared in TASKS.values()
                      for name, settings in (declared.synthetic_settings or {}).items()}
SYNTHETIC_MAX_ITERS = {name: settings["max_iters"] for name, settings in SYNTHETIC_SETTINGS.items()
                       if "max_iters" in settings}

# What a run that starts from a pretrained model may set of its shape: a shorter context, and dropout.
FINE_TUNING_SHAPE_SETTINGS = ("block_size", "dropout", "attention_dropout")
# Training a run that starts from a pretrained model, unless the preset or overrides say otherwise:
# fewer steps at a lower learning rate, so that it adapts what it knows rather than forgetting it.
# Adapters start at zero and move only a few weights: they take a higher rate.
# AdamW, as the fine-tuning figures were measured with (Muon on pretrained weights was not).
FINE_TUNING = dict(max_iters=500, lr=1e-4, min_lr=1e-5, warmup_iters=10, batch_size=8, eval_interval=100,
                   eval_iters=20, checkpoint_interval=100, dropout=0.0, optimizer="adamw")
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


def default_settings(preset=DEFAULT_PRESET, synthetic=None):
    """A run's settings before any preset or override: its task's default preset's (the laptop preset for a GPT, the
    seq2seq preset for a Seq2Seq), with a synthetic task's own settings (`SYNTHETIC_SETTINGS`) over them."""
    return {**PRESETS[preset], **SYNTHETIC_SETTINGS.get(synthetic, {})}


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


def resolve_settings(preset=None, overrides=None, checkpoint=None, default_preset=DEFAULT_PRESET, synthetic=None,
                     pretrained=None, sizing=None):
    """A run's settings as one flat dict: the preset's values (None: `default_preset`'s, the run's task's), then
    `overrides`.

    A new run whose task sized settings from its data gives them as `sizing` (a `tasks.task.Sizing`: a chat run's
    context and steps, laid over the modern preset's where no preset is named; a seq2seq run's longest pair):
    they lie under a preset's values and the overrides.

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
        # A preset named stands on its own: nothing of the default preset's (its optimizer, its switches) lies under it.
        defaults = default_settings(preset or default_preset, synthetic)
        if sizing is not None:
            defaults = {**(PRESETS[sizing.preset] if sizing.preset and preset is None else defaults),
                        **sizing.settings}
        return _fitted_warmup({**defaults, **requested}, overrides)
    # A checkpoint written before a setting existed has that setting's default.
    saved = {name: checkpoint["model_config"].get(name, getattr(GPTConfig, name)) for name in MODEL_SHAPE_SETTINGS}
    # The optimizer state saved with float16 has a loss scale that the others lack.
    saved["precision"] = checkpoint["training_config"].get("precision", "fp32")
    # Adapters are weights of their own, in the checkpoint, and so are the gradient accumulators and each
    # optimizer's moments.
    for name in ("lora_rank", "lora_targets", "grad_accum", "optimizer"):
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
