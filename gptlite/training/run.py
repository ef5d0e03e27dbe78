"""A whole training run, as `train.py` does it: text files in, a trained model and its files out.

    import gptlite
    run = gptlite.train_on_text(["my_text.txt"], "runs/mine", {"max_iters": 500})
    print(gptlite.generate(run.model, "ROMEO:", max_new_tokens=100))

`train_on_text` is the door: it plans the run (`training.plan`: every setting resolved once, from the preset,
overrides, a checkpoint, a starting model and the settings its task sizes from its data), then runs the plan:
the task (`gptlite.tasks`: a language model, chat or seq2seq) reads and encodes its data and makes the model
(new, from the checkpoint it resumes, or pretrained), and `fit.train` trains it, writing `model.keras`,
`history.csv`, `loss.png` and checkpoints to its folder.
"""

import contextlib
import dataclasses
import functools
import inspect
import pathlib
import shutil
import tempfile
import textwrap

import keras

from gptlite.backend import compile_cache
from gptlite.backend.runtime import running
from gptlite.errors import ConfigError, InputError, MissingFileError, RunExistsError
from gptlite.setting import described
from gptlite.tasks.task import named
from gptlite.training import film, fit, run_config
from gptlite.training.checkpoints import read_checkpoint
from gptlite.training.history import check_tensorboard
from gptlite.training.plan import plan_run, RUN_ARGUMENTS, RunArguments
from gptlite.training.run_folder import check_folder, CHECKPOINT_FILES, FILM_FOLDER, FILM_INDEX, holds_a_run
from gptlite.training.settings import OPTIMIZER_NAMES, PRESETS, TrainingConfig
from gptlite.weights import pretrained


@dataclasses.dataclass
class TrainedRun:
    """What `train_on_text` returns."""

    model: keras.Model  # the GPT or Seq2Seq with the last step's weights (model.keras holds the best)
    history: list  # one dict per evaluation: step, train_loss, val_loss, learning_rate, elapsed_s, ...
    out_dir: pathlib.Path
    training_config: TrainingConfig  # the settings it trained with
    # What its task held out to check the model on (`tasks.task.Training.held_out`): a Seq2Seq's pairs; a chat
    # run's questions, a synthetic task's own or the last answers of the conversations held out of (or given
    # beside) the training file, [(messages, answer)]; None where it held out nothing.
    held_out: object = None
    task: object = None  # the run's `tasks.task.Task`

    @property
    def best(self):
        """The evaluation with the lowest validation loss: the model that model.keras holds."""
        return min(self.history, key=lambda row: row["val_loss"])

    def closing_words(self):
        """What `train.py` says of the final model, in pieces as they come: a language model's sample, a chat
        model's answers to held-out questions, a Seq2Seq's targets for held-out sources."""
        return self.task.closing_words(self)


def train_on_text(sources=(), out_dir="out", settings=None, *, verbose=1, **arguments):
    """Train a model on the text of `sources` and write it to `out_dir`; a `TrainedRun`.

    A chat run (task="chat") trains on one JSON Lines file of conversations (see `gptlite.data.conversations`) or
    a built-in task; the loss counts the answers' tokens alone. A model without a chat template gets the default
    one, its turn markers added to the tokenizer. A new chat model without a `preset` is sized from its
    conversations (`tasks.chat_sizing`), and says so. A tenth of a file's conversations is held out (or
    `val_file`'s are used): the validation loss is theirs, and each evaluation reports how many of their last
    answers the model writes exactly, greedy (`exact_answers`).

    A fine-tuned model (`init_from`) keeps its shape and tokenizer (settings may shorten `block_size` and change
    `dropout`) and starts with a fresh optimizer and FINE_TUNING's defaults; with `lora_rank` in `settings`, only
    low-rank adapters train (`GPT.enable_lora`).

    A run refused before it trains (a missing file, empty text, a setting that cannot work) writes nothing: not
    even `out_dir` is made.

    Its arguments, each declared once in `plan.RunArguments`, are listed below; verbose: 0 prints nothing, 1
    says what it trains and each evaluation.
    """
    unknown = sorted(set(arguments) - set(RUN_ARGUMENTS))
    if unknown:
        raise ConfigError(f"train_on_text has no argument {unknown[0]!r}; its arguments are "
                          f"{', '.join(RUN_ARGUMENTS)} and verbose")
    sources = [pathlib.Path(source) for source in ([sources] if isinstance(sources, (str, pathlib.Path))
                                                   else sources)]
    return run(RunArguments(sources=tuple(sources), out_dir=pathlib.Path(out_dir), settings=settings, **arguments),
               verbose)


def _door_signature():
    """train_on_text's signature as a reader sees it (`help`, `inspect.signature`): sources, out_dir and settings,
    then every other field of RunArguments by keyword with its default, then verbose."""
    leading = {"sources": (), "out_dir": "out", "settings": None}
    parameters = [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default)
                  for name, default in leading.items()]
    parameters += [inspect.Parameter(field.name, inspect.Parameter.KEYWORD_ONLY, default=field.default)
                   for field in dataclasses.fields(RunArguments) if field.name not in leading]
    parameters.append(inspect.Parameter("verbose", inspect.Parameter.KEYWORD_ONLY, default=1))
    return inspect.Signature(parameters)


train_on_text.__signature__ = _door_signature()
train_on_text.__doc__ += "\n" + "\n".join(
    textwrap.fill(line, 116, initial_indent="    ", subsequent_indent="        ") for line in described(RunArguments))


def run(asked, verbose=1):
    """Plan the run `asked` (a `plan.RunArguments`), then train it; a `TrainedRun`.

    Everything that can refuse the run is checked before its folder is made, so that a refused run writes
    nothing and leaves an earlier run in that folder as it was.
    """
    say = print if verbose else (lambda *args, **kwargs: None)
    compile_cache.start()  # before the run's first operation: TensorFlow reads it then
    asked.check()
    task = named(asked.task, asked.synthetic)
    task.check(asked)
    if asked.film and not task.films:
        raise ConfigError(f"a film follows a language model as it learns; {task.called} keeps none (leave out "
                          f"`film`)")
    checkpoint = read_checkpoint(asked.out_dir) if asked.resume else None
    if not asked.resume:  # refused before a model is read, and before a chat run reads its conversations (seconds)
        check_folder(asked.out_dir, asked.overwrite)
    start = pretrained.from_pretrained(asked.init_from) if asked.init_from and not checkpoint else None
    data, sizing = task.read(asked, asked.seed(checkpoint), not (checkpoint or start), say)
    plan = plan_run(asked, task, checkpoint, start and start.config, sizing,
                    device_peak_flops=running().peak_flops() if asked.preset == "gpu" else None)
    if asked.distribute:
        running().check_accumulation(plan.training_config.grad_accum)
    if plan.tensorboard:
        check_tensorboard(plan.tensorboard)
    keras.utils.set_random_seed(plan.seed)
    with _removed_if_refused(asked.out_dir):
        return _train(plan, data, start, say, verbose)


def _train(plan, data, start, say, verbose):
    """Make the model, encode the data and fit, as `plan` says."""
    task, config, out_dir = plan.task, plan.training_config, plan.out_dir
    if plan.sizing is not None and plan.sizing.line:
        sized = {**(PRESETS[plan.sizing.preset] if plan.sizing.preset else {}), **plan.sizing.settings}
        given = [f"{name} {value}" for name, value in (plan.asked.settings or {}).items()
                 if value is not None and value != sized.get(name, value)]
        say(plan.sizing.line + (f" (given: {', '.join(given)})" if given else ""))
    with running().data_parallel(config.batch_size) if plan.asked.distribute else contextlib.nullcontext() as replicas:
        model = _starting_model(plan, start, say) if start is not None else task.model(plan, data, say)
        if not model.built:
            model.build((None, model.config.block_size))
        model = task.adapted(model, plan, say)
        if config.lora_rank:
            model.enable_lora(config.lora_rank, config.lora_alpha, config.lora_targets)
        make_folder = (lambda: None) if plan.checkpoint else functools.partial(_make_folder, out_dir,
                                                                                 plan.asked.overwrite)
        training = task.training(plan, model, data, say, make_folder)
        _write_run_config(out_dir, plan.asked.as_dict(), model.config, config)
        say(f"{training.line}\nmodel: {task.describe(model)}; {_backend_and_precision(config)}\n"
            + _schedule(config, plan.checkpoint, replicas), flush=True)
        history = fit.train(model, training.train, training.validation, config, out_dir, verbose=verbose,
                            resume=bool(plan.checkpoint), peak_flops=plan.peak_flops, tensorboard=plan.tensorboard,
                            metrics=training.metrics, sample=training.sample, task=task,
                            film=_film_plan(plan, model, training, say))
    return TrainedRun(model, history, out_dir, config, training.held_out, task)


def _film_plan(plan, model, training, say):
    """The run's film (`training.film.FilmPlan`), or None: asked for, or a resumed run's that kept one."""
    out_dir, asked = plan.out_dir, plan.asked
    continued = plan.checkpoint is not None and (out_dir / FILM_INDEX).exists()
    if not (asked.film or continued):
        if asked.film_probe is not None:
            raise ConfigError(f"the run in {out_dir} kept no film: give `film=True` with `film_probe` to start one")
        return None
    if plan.checkpoint is not None and not continued:
        say(f"the film starts at step {plan.checkpoint['step']}, where this run resumes: it kept none before")
    config = plan.training_config
    probe = plan.task.film_probe(model, training, asked.film_probe)
    steps = film.frame_steps(config.max_iters, config.eval_interval, every=config.steps_per_call)
    say(f"keeping a film of {len(steps)} frames in {out_dir / FILM_FOLDER} (steps {', '.join(map(str, steps[:6]))}, "
        f"..., {steps[-1]}); gptlite.film({str(out_dir)!r}) replays it")
    return film.FilmPlan(tuple(steps), model.tokenizer.decode(probe), tuple(probe))


def _starting_model(plan, start, say):
    """The pretrained model a run starts from, copied where the plan gives it another context, dropout or
    precision (GPT-2's 124M weights, twice)."""
    wanted = (plan.model_config.block_size, plan.model_config.dropout, plan.dtype)
    model = start
    if wanted != (start.config.block_size, start.config.dropout, start.dtype_policy.name):
        model = pretrained.from_pretrained(start, *wanted)
    say(f"starting from {plan.asked.init_from}")
    return model


def _make_folder(out_dir, overwrite):
    """Make `out_dir`, checked by `run_folder.check_folder`; replacing a run, remove its checkpoint."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=out_dir).close()
    except OSError as error:
        raise InputError(f"cannot write to `out_dir` {out_dir}: {error.strerror}") from None
    if overwrite:
        # The replaced run's checkpoint must not be resumed into the new one.
        for name in CHECKPOINT_FILES:
            (out_dir / name).unlink(missing_ok=True)
        shutil.rmtree(out_dir / FILM_FOLDER, ignore_errors=True)  # nor its film's frames


@contextlib.contextmanager
def _removed_if_refused(out_dir):
    """A run refused before it trained leaves no `out_dir` behind where there was none."""
    existed = out_dir.exists()
    try:
        yield
    except (ConfigError, InputError, MissingFileError, RunExistsError):
        if not existed and out_dir.is_dir() and not holds_a_run(out_dir):
            shutil.rmtree(out_dir, ignore_errors=True)
        raise


def _write_run_config(out_dir, arguments, model_config, training_config):
    """`out_dir`/config.toml: the run's arguments, and every setting as the run resolved it."""
    shape = {name: value for name, value in dataclasses.asdict(model_config).items() if name != "vocab_size"}
    run_config.write_run_config(out_dir / run_config.FILE_NAME, arguments,
                                {**shape, **dataclasses.asdict(training_config)}, running().name)


def _backend_and_precision(training_config):
    return f"{running().name} backend, {training_config.precision}"


def _schedule(training_config, checkpoint, replicas):
    accumulated = training_config.grad_accum
    return (
        (f"resuming at step {checkpoint['step']} of " if checkpoint else "")
        + f"{training_config.max_iters} steps of batch {training_config.batch_size}"
        + (f" split across {replicas} devices" if replicas else "")
        + (f", {accumulated} batches a step ({training_config.batch_size * accumulated} sequences)"
           if accumulated > 1 else "")
        + f" by {OPTIMIZER_NAMES[training_config.optimizer]}; "
        f"validation loss every {training_config.eval_interval} steps, "
        f"checkpoint every {training_config.checkpoint_interval}"
    )
