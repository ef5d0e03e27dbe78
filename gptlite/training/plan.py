"""A training run as a plan: what it was asked (`RunArguments`, each argument declared once with its default, help
and choices, and checked before anything is read; `train.py` makes its flags from them), resolved once into a frozen `RunPlan`
(its task, every setting from the preset, overrides, checkpoint, starting model and data, the new model's
`GPTConfig` and the `TrainingConfig`), from which `training.run` builds, encodes and fits.

    asked = RunArguments(sources=(pathlib.Path("my_text.txt"),), out_dir=pathlib.Path("runs/mine"),
                         settings={"max_iters": 500})
    plan = plan_run(asked, tasks.task.named(asked.task, asked.synthetic))

`plan_run` reads nothing and writes nothing: what it resolves from (the checkpoint, a pretrained model's shape,
the settings a task sized from its data) is given to it.
"""

import dataclasses
import pathlib

from gptlite.data import CHAT_SYNTHETIC_TASKS, LM_SYNTHETIC_TASKS, LONG_CONVERSATIONS, SYNTHETIC_TASKS
from gptlite.errors import ConfigError, InputError
from gptlite.model.config import GPTConfig
from gptlite.setting import check_choices, setting
from gptlite.tasks import TASKS
from gptlite.text import DEFAULT_BPE_VOCABULARY, DEFAULT_TOKENIZER, tokenizer_class, TOKENIZERS, UNKNOWN_CHOICES
from gptlite.training.history import DEFAULT_PEAK_FLOPS
from gptlite.training.run_config import ARGUMENTS
from gptlite.training.settings import (DEFAULT_PRESET, dtype_policy, PRESETS, resolve_settings, split_settings,
                                       SYNTHETIC_MAX_ITERS, TrainingConfig)


@dataclasses.dataclass(frozen=True)
class RunArguments:
    """What a run was asked to do: `train_on_text`'s arguments, `sources` a tuple of paths."""

    sources: tuple = setting((), "text files, or folders of them, to train on (none: about 2 MB of the Python "
                                 "standard library's sources); several are read in the order given, a folder's files "
                                 "in sorted order; for the seq2seq task, one file of source<TAB>target lines")
    out_dir: pathlib.Path = setting(pathlib.Path("out"), "the folder for model.keras, history.csv, loss.png and "
                                                         "checkpoints")
    settings: dict = setting(None, "GPTConfig and TrainingConfig fields that override the preset's, "
                                   "{\"max_iters\": 500, \"n_layer\": 2}")
    preset: str = setting(None, f"the model's size and its schedule (none: {DEFAULT_PRESET} for a new GPT, a "
                                f"task's own for the others)", choices=tuple(sorted(PRESETS)))
    # The registries themselves are the choices (not a copy): a line added to one is offered at once.
    task: str = setting(None, "what the run trains: " + "; ".join(
        f"{name}: {declared.trains}" for name, declared in TASKS.items()), choices=TASKS)
    synthetic: str = setting(None, "train on a built-in task instead of files: a language model's (" +
                             "; ".join(f"{name}: {what}" for name, what in LM_SYNTHETIC_TASKS.items()) +
                             "), a seq2seq model's (" +
                             "; ".join(f"{name}: {what}, {SYNTHETIC_MAX_ITERS[name]} steps unless `max_iters` says"
                                       for name, what in SYNTHETIC_TASKS.items()) +
                             "), or a chat model's, with held-out questions to answer (" +
                             "; ".join(f"{name}: {what}" for name, what in CHAT_SYNTHETIC_TASKS.items()) + ")",
                             choices=(*LM_SYNTHETIC_TASKS, *SYNTHETIC_TASKS, *CHAT_SYNTHETIC_TASKS))
    tokenizer: str = setting(None, "a new model's tokenizer: " + "; ".join(
        f"{name}: {description}" for name, (_, _, description) in TOKENIZERS.items()) +
                             ". A new chat model without a preset chooses by its answers' words (docs/chat.md); a "
                             "pretrained or resumed one keeps its own", choices=TOKENIZERS)
    vocab_size: int = setting(None, f"tokens in a new BPE vocabulary (none: {DEFAULT_BPE_VOCABULARY})", metavar="N")
    encoding: str = setting("utf-8", "the text files' encoding")
    errors: str = setting("strict", "bytes that do not decode: stop with an error (strict) or replace them with "
                                    "U+FFFD (replace)", choices=("strict", "replace"))
    init_from: object = setting(None, "fine-tune a pretrained GPT instead of training a new one: a gptlite "
                                      "model.keras, a Hugging Face GPT-2, Llama, Qwen2 or Qwen3 folder, or a KerasHub "
                                      "GPT-2 preset (a folder, or a name such as gpt2_base_en, downloaded where a "
                                      "network is reachable); it keeps its shape and tokenizer, and its file is only "
                                      "read (see docs/pretrained.md)", metavar="MODEL")
    unknown: str = setting("error", "with `init_from`: text characters the pretrained char vocabulary lacks: stop "
                                    "with an error, leave them out (skip), or replace each with a space",
                           choices=UNKNOWN_CHOICES)
    distribute: bool = setting(False, "train data-parallel over every local device (tensorflow: GPUs, else CPU "
                                      "devices; jax: all devices), or over several hosts (see docs/training.md); the "
                                      "batch is split across them and the learning rate is unchanged")
    resume: bool = setting(False, "continue the run in `out_dir` from its last checkpoint")
    overwrite: bool = setting(False, "replace a run already in `out_dir` (without it, or `resume`, a folder that "
                                     "holds a run is refused and left as it is)")
    tensorboard: object = setting(None, "write TensorBoard event files at each evaluation (losses, bits per "
                                        "character, learning rate, tokens per second and a text sample) to "
                                        "`out_dir`/tensorboard, or to another folder given instead of True")
    mfu: bool = setting(None, "show and record model FLOPs utilisation at each evaluation, against `peak_flops` (on "
                              "by default for the gpu preset on a GPU)")
    peak_flops: float = setting(None, f"the hardware's peak FLOPs per second for `mfu` (none: {DEFAULT_PEAK_FLOPS / 1e12:g}e12, "
                                      f"an A100's bfloat16 peak, as nanoGPT uses); giving it asks for `mfu`",
                                metavar="X")
    film: bool = setting(False, "keep a film of the run in `out_dir`/film: the weights at step 0 and at about 24 "
                                "steps, dense early and sparse later, every evaluation's among them, each with the "
                                "losses there, for `gptlite.film` to show the model learning (docs/inspection.md); a "
                                "resumed run continues it")
    film_probe: str = setting(None, "with `film`: the text the film looks inside the model at (none: the first "
                                    "context of the validation text)", metavar="TEXT")
    long_conversations: str = setting("cut", "with the chat task: a conversation longer than the context is cut to "
                                             "fit, or refused", choices=LONG_CONVERSATIONS)
    val_file: object = setting(None, "with the chat task: a JSON Lines file of conversations to validate on and "
                                     "whose last answers are checked, instead of a held-out tenth of the training "
                                     "file's", metavar="FILE")

    def check(self):
        """Refuse arguments that contradict each other, before anything is read."""
        check_choices(self)
        if self.resume and self.overwrite:
            raise ConfigError("`resume=True` and `overwrite=True` contradict each other; choose one")
        if self.init_from and not self.resume:  # a resumed run's weights are in its checkpoint
            self._check_init_from()
        if self.vocab_size is not None:
            if self.resume:
                raise ConfigError("`vocab_size` sets the size of a new vocabulary: it goes with a new run, not with "
                                  "`resume=True`")
            tokenizer_class(self.tokenizer or DEFAULT_TOKENIZER).check_vocabulary_size(self.vocab_size)
        if self.film_probe is not None and not (self.film or self.resume):
            raise ConfigError("`film_probe` is the text a film looks at: give `film=True` with it")
        if self.film_probe is not None and not self.film_probe:
            raise ConfigError("`film_probe` is empty; give a text of at least 2 tokens, or leave it out")
        if self.peak_flops is not None and not self.peak_flops > 0:
            raise ConfigError(f"peak_flops must be positive, got {self.peak_flops!r}")

    def _check_init_from(self):
        """Refuse an `init_from` that the other arguments contradict, or that the run would write over: the model
        it names is only read."""
        if self.tokenizer is not None or self.vocab_size is not None:
            given = f"`tokenizer={self.tokenizer}`" if self.tokenizer is not None else "`vocab_size`"
            raise ConfigError(f"a pretrained model keeps its own tokenizer: leave out {given} with `init_from`")
        source, target = pathlib.Path(self.init_from), self.out_dir / "model.keras"
        if source.is_file() and target.exists() and target.samefile(source):
            raise ConfigError(f"`init_from` is the model in `out_dir` {self.out_dir}; write the new run to another "
                              f"`out_dir`")
        if source.is_dir() and self.out_dir.exists() and self.out_dir.samefile(source):
            raise ConfigError(f"`out_dir` {self.out_dir} is the folder of `init_from`, which is only read; write the "
                              f"new run to another `out_dir`")

    def seed(self, checkpoint=None):
        """The seed the run's settings resolve to (a task draws its synthetic data and held-out part by it)."""
        given = (self.settings or {}).get("seed")
        saved = checkpoint and checkpoint["training_config"].get("seed")
        return next((value for value in (given, saved) if value is not None), TrainingConfig.seed)

    def as_dict(self):
        """The arguments a run's config.toml records (`run_config.ARGUMENTS`), as TOML holds them."""
        def plain(value):
            if isinstance(value, (tuple, list)):
                return [plain(item) for item in value]
            return str(value) if isinstance(value, pathlib.PurePath) else value

        return {name: plain(getattr(self, name)) for name in ARGUMENTS}


# Every argument of a run, by its name: `train_on_text` takes these, the command line fills them from its flags.
RUN_ARGUMENTS = tuple(field.name for field in dataclasses.fields(RunArguments))


@dataclasses.dataclass(frozen=True)
class RunPlan:
    """A run resolved: everything `training.run.run` needs, each setting decided once."""

    asked: RunArguments
    task: object  # a `tasks.task.Task`
    model_config: GPTConfig  # the model's shape; a new model's vocab_size is its tokenizer's (None here)
    training_config: TrainingConfig
    checkpoint: dict = None  # the checkpoint a resumed run continues from
    tokenizer: str = None  # a new model's: one of `text.TOKENIZERS`; None: the model's own
    tensorboard: pathlib.Path = None  # where TensorBoard's event files go, or None
    peak_flops: float = None  # what MFU is measured against, or None
    sizing: object = None  # the settings the task sized from its data (a `tasks.task.Sizing`), or None

    out_dir = property(lambda self: self.asked.out_dir)
    seed = property(lambda self: self.training_config.seed)
    dtype = property(lambda self: dtype_policy(self.training_config.precision))


def plan_run(asked, task, checkpoint=None, pretrained=None, sizing=None, device_peak_flops=None):
    """The `RunPlan` of a run `asked` (checked) to train `task`, resuming `checkpoint` (a checkpoint document) or
    starting from a `pretrained` model's `GPTConfig`, with settings the task sized from its data (`sizing`, a
    `tasks.task.Sizing`); `device_peak_flops`: the peak of the device the run computes on, where it is known (the
    gpu preset measures MFU against it)."""
    if checkpoint:
        task.check_checkpoint(checkpoint, asked.out_dir)
    model_settings, training_settings = split_settings(resolve_settings(
        asked.preset, asked.settings, checkpoint, task.default_preset, asked.synthetic, pretrained, sizing))
    # Before the settings are checked together: a new model's adapters are the mistake, whatever else they meet.
    if training_settings.get("lora_rank") and not (pretrained or checkpoint):
        raise ConfigError("`lora_rank` trains adapters beside a pretrained model's frozen weights; a new model's "
                          "are random, so give `init_from` too, or leave `lora_rank` out to train every weight")
    training_config = TrainingConfig(**training_settings)
    if checkpoint:
        vocab_size = checkpoint["model_config"].get("vocab_size")
    else:
        vocab_size = pretrained.vocab_size if pretrained is not None else None
    model_config = GPTConfig(vocab_size=vocab_size, **model_settings)
    if checkpoint and checkpoint["step"] >= training_config.max_iters:
        raise InputError(f"the run in {asked.out_dir} has already done its {checkpoint['step']} steps; "
                         f"set a larger `max_iters` to train it further")
    tensorboard = asked.out_dir / "tensorboard" if asked.tensorboard is True else asked.tensorboard or None
    new_model = not (pretrained or checkpoint)
    return RunPlan(asked, task, model_config, training_config, checkpoint,
                   tokenizer=asked.tokenizer or (DEFAULT_TOKENIZER if new_model else None), tensorboard=tensorboard,
                   peak_flops=_peak_flops(asked, task, device_peak_flops), sizing=sizing)


def _peak_flops(asked, task, device_peak_flops):
    """The peak FLOPs per second to measure MFU against, or None when it is not measured: asked for (`mfu`,
    `peak_flops`), or unasked in the gpu preset on a device whose peak is known."""
    if asked.peak_flops is not None or asked.mfu:
        return asked.peak_flops or DEFAULT_PEAK_FLOPS
    if asked.mfu is not None or asked.preset != "gpu" or not task.measures_mfu:
        return None
    return device_peak_flops
