"""A training run as a plan: what it was asked (`RunArguments`, checked), resolved once into a frozen `RunPlan`
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

from gptlite.errors import ConfigError, InputError
from gptlite.data.conversations import LONG_CONVERSATIONS
from gptlite.model.config import GPTConfig
from gptlite.text import DEFAULT_TOKENIZER, tokenizer_class, TOKENIZERS
from gptlite.training.history import DEFAULT_PEAK_FLOPS
from gptlite.training.run_config import ARGUMENTS
from gptlite.training.settings import TrainingConfig, dtype_policy, resolve_settings, split_settings


@dataclasses.dataclass(frozen=True)
class RunArguments:
    """What a run was asked to do: `train_on_text`'s arguments (see there), `sources` a tuple of paths."""

    sources: tuple = ()
    out_dir: pathlib.Path = pathlib.Path("out")
    settings: dict = None
    preset: str = None
    task: str = None
    synthetic: str = None
    tokenizer: str = None
    vocab_size: int = None
    encoding: str = "utf-8"
    errors: str = "strict"
    init_from: object = None
    unknown: str = "error"
    distribute: bool = False
    resume: bool = False
    overwrite: bool = False
    tensorboard: object = None
    mfu: bool = None
    peak_flops: float = None
    long_conversations: str = "cut"
    val_file: object = None

    def check(self):
        """Refuse arguments that contradict each other, before anything is read."""
        if self.long_conversations not in LONG_CONVERSATIONS:
            raise ConfigError(f"long_conversations must be 'cut' or 'refuse', got {self.long_conversations!r}")
        if self.resume and self.overwrite:
            raise ConfigError("`resume=True` and `overwrite=True` contradict each other; choose one")
        if self.tokenizer not in (None, *TOKENIZERS):
            raise ConfigError(f"tokenizer must be one of {', '.join(map(repr, TOKENIZERS))}, got {self.tokenizer!r}")
        if self.init_from and not self.resume:  # a resumed run's weights are in its checkpoint
            self._check_init_from()
        if self.vocab_size is not None:
            if self.resume:
                raise ConfigError("`vocab_size` sets the size of a new vocabulary: it goes with a new run, not with "
                                  "`resume=True`")
            tokenizer_class(self.tokenizer or DEFAULT_TOKENIZER).check_vocabulary_size(self.vocab_size)
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


def plan_run(asked, task, checkpoint=None, pretrained=None, sizing=None, on_gpu=False):
    """The `RunPlan` of a run `asked` (checked) to train `task`, resuming `checkpoint` (a checkpoint document) or
    starting from a `pretrained` model's `GPTConfig`, with settings the task sized from its data (`sizing`, a
    `tasks.task.Sizing`); `on_gpu`: whether the run computes on a GPU (the gpu preset measures MFU there)."""
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
                   peak_flops=_peak_flops(asked, task, on_gpu), sizing=sizing)


def _peak_flops(asked, task, on_gpu):
    """The peak FLOPs per second to measure MFU against, or None when it is not measured: asked for (`mfu`,
    `peak_flops`), or unasked in the gpu preset on a GPU."""
    if asked.peak_flops is not None or asked.mfu:
        return asked.peak_flops or DEFAULT_PEAK_FLOPS
    if asked.mfu is not None or asked.preset != "gpu" or not task.measures_mfu:
        return None
    return DEFAULT_PEAK_FLOPS if on_gpu else None
