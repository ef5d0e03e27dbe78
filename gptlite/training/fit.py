"""Training with `model.fit`: the optimizer and schedule, the step loop between
evaluations and checkpoints, stopping on request, and the evaluation records."""

import contextlib
import copy
import dataclasses
import math
import pathlib
import signal
import sys
import threading
import time

import keras

from gptlite.backend import compile_cache
from gptlite.backend.runtime import running
from gptlite.data.lm import fed_to_keras
from gptlite.errors import ConfigError, TrainingDiverged, TrainingInterrupted
from gptlite.tasks.task import named
from gptlite.training import history
from gptlite.training.background import FileWriter, Jobs
from gptlite.training.checkpoints import restore_checkpoint, RunState, save_checkpoint, snapshot
from gptlite.training.film import Recorder
from gptlite.training.optimizer import make_optimizer
from gptlite.training.settings import dtype_policy
from gptlite.weights import saving


def compile_for_training(model, config, ignored=None):
    # A seq2seq batch pads its targets, and conversations leave all but the answers out (`ignored`, the task's
    # `ignored_class`): those positions do not count.
    model.compile(
        optimizer=make_optimizer(model, config),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, ignore_class=ignored),
        jit_compile=running().trains_with_xla(model, lora=bool(config.lora_rank)),
        steps_per_execution=steps_per_execution(config),
    )


def steps_per_execution(config):
    """The batches one compiled call of `fit` runs: `steps_per_call` optimizer steps of `grad_accum` batches each, so
    that a call ends on a step's boundary; one where the backend runs a call's steps one by one anyway."""
    if running().runs_steps_one_by_one:
        return 1
    return config.steps_per_call * config.grad_accum


class StopRequest:
    """Turns the first SIGINT or SIGTERM into a request to stop after the current step.

    A second signal aborts at once. Use as a context manager; outside the main
    thread, where Python cannot install handlers, it only ever says no.
    """

    def __init__(self):
        self.signal_number = None
        self._previous = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for number in (signal.SIGINT, signal.SIGTERM):
                self._previous[number] = signal.signal(number, self._handle)
        return self

    def __exit__(self, *exc_info):
        for number, handler in self._previous.items():
            signal.signal(number, handler)

    def request(self, signal_number=signal.SIGINT):
        self.signal_number = signal_number

    @property
    def requested(self):
        return self.signal_number is not None

    def _handle(self, signal_number, frame):
        if self.requested:
            raise KeyboardInterrupt
        self.request(signal_number)
        print("\nstopping after the steps under way to save a checkpoint (press Ctrl-C again to abort)",
              file=sys.stderr, flush=True)


class _StepWatcher(keras.callbacks.Callback):
    """Counts optimizer steps (each `micro_batches` of `fit`'s batches), and stops `fit`
    after the step in which a stop was requested, or at once when the loss goes non-finite.

    Keras calls it once per compiled call, which may run several batches
    (`steps_per_call`): `batch` is then the call's last, counted as though the
    fit call's last compiled call were whole (it may run fewer, up to
    `fit_batches`, the fit call's batches in all).
    """

    def __init__(self, stop_request, progress, seed, first_step, micro_batches, fit_batches, on_steps=None):
        super().__init__()
        # on_steps(step, loss_sum, steps, model): called as steps end, with the step reached, the sum of the losses
        # of the steps since the last call and their number, and a function that gives the model (which, under
        # JAX, first copies the weights back to it).
        self.on_steps = on_steps
        self.loss_sum_counted = 0.0
        self.stop_request = stop_request
        self.fit_batches = fit_batches
        self.progress = progress
        self.seed, self.first_step, self.micro_batches = seed, first_step, micro_batches
        self.mean_loss = math.nan
        self.steps = 0
        self.batches = 0
        self.first_call_ended = self.last_batch_ended = None
        self.first_call_batches = 0
        self.runtime = running()

    def on_train_batch_begin(self, batch, logs=None):
        self.runtime.seed_step(self.seed * 1_000_003 + self.first_step * self.micro_batches + batch)

    def on_train_batch_end(self, batch, logs=None):
        self.batches = min(batch + 1, self.fit_batches)
        self.last_batch_ended = time.perf_counter()
        if self.first_call_ended is None:
            self.first_call_ended, self.first_call_batches = self.last_batch_ended, self.batches
        self.mean_loss = float(logs["loss"])  # mean over this fit call's batches so far
        if not math.isfinite(self.mean_loss):
            self.model.stop_training = True
        if self.batches % self.micro_batches:
            return  # within an optimizer step
        steps = self.batches // self.micro_batches
        self.progress.steps_done(steps - self.steps, self.mean_loss)
        if self.on_steps is not None:
            loss_sum = self.mean_loss * steps  # a step's loss is the mean of its batches'
            self.on_steps(self.first_step + steps, loss_sum - self.loss_sum_counted, steps - self.steps,
                          lambda: self.model)
            self.loss_sum_counted = loss_sum
        self.steps = steps
        if self.stop_request.requested:
            self.model.stop_training = True


class _Progress:
    """Keras's progress bar over the whole run, with a line for each evaluation.

    The bar is drawn on a terminal only; in logs and pipes its redraws would
    be noise, and the evaluation lines alone show progress.
    """

    def __init__(self, first_step, last_step, verbose):
        self.step = first_step
        self.verbose = verbose
        self.live = bool(verbose) and sys.stdout.isatty()
        self.bar = keras.utils.Progbar(last_step, stateful_metrics=["loss"], unit_name="step",
                                       verbose=1 if self.live else 0)
        if first_step and self.live:
            self.bar.update(first_step)

    def steps_done(self, count, mean_loss):
        self.step += count
        if self.live:
            self.bar.update(self.step, [("loss", mean_loss)])

    def say(self, line):
        if self.verbose:
            # On a terminal the bar's line is cleared first; the bar redraws below.
            print(("\r\033[K" if self.live else "") + line, flush=True)


# Said once, where a checkpoint must wait for the one before it.
SLOW_DISK = ("the disk is slower than the checkpoints: each waits for the one before it to be written "
             "(a larger `checkpoint_interval` avoids the wait)")


def train(model, train_ids, validation_ids, config, out_dir, task, verbose=1, resume=False, stop_request=None,
          callbacks=(), metrics=None, peak_flops=None, tensorboard=None, sample=None, film=None):
    """Train `model` with `model.fit`; return the evaluation records.

    A GPT trains on token ids (1-D arrays) or packed conversations
    (`conversations.ChatRows`, the loss on the answers alone), a Seq2Seq on
    `pairs.PairSet`s.
    Steps are optimizer steps: with `grad_accum` above 1, each takes that
    many batches of `batch_size`. Every `eval_interval` steps the validation
    loss is measured; the best model by validation loss is saved to
    `out_dir/model.keras`, with `history.csv` and `loss.png` beside it. Each
    evaluation also records the validation loss in bits per character and
    the tokens trained per second since the last (the steps' own speed), the
    tokens per second of the whole run so far (its wall-clock time) and where
    that time went (`history.RunTime`). Every `checkpoint_interval` steps, and when a
    stop is requested (Ctrl-C, SIGTERM), a checkpoint is written from which
    `resume=True` continues exactly. The model in memory ends with the last
    step's weights.

    `task` is what the run trains, a `tasks.task.Task` or its name in `tasks.TASKS` ("lm", "chat",
    "seq2seq"): it batches `train_ids` and `validation_ids`, and says what the loss leaves out.

    Files are written on a thread of their own (`background.FileWriter`)
    from copies taken at their step, so that the steps go on while the disk
    writes them; the run waits for every write before it returns or stops.

    metrics: a name for each function of the model that returns a fraction
        (a Seq2Seq's exact match, say): each evaluation records and shows it.
    peak_flops: the hardware's peak FLOPs per second; given, a GPT's
        evaluations also record its model FLOPs utilisation (`mfu`).
    tensorboard: a folder to write TensorBoard event files to at each
        evaluation, with `sample` (a function of the model returning text)
        as a text sample if given.
    callbacks: more Keras callbacks, given to every `fit` call.
    film: a `training.film.FilmPlan`: keep a film of the run in `out_dir`/film (`training.film`); a resumed run
        continues it (or starts it at the step it resumes from).
    """
    called = time.perf_counter()
    compile_cache.start()  # see gptlite.compile_cache
    out_dir = pathlib.Path(out_dir)
    task = named(task) if isinstance(task, str) else task
    _check(model, config, task, peak_flops)
    if not model.built:
        model.build((None, model.config.block_size))
    compile_for_training(model, config, task.ignored_class(model))
    model.optimizer.build(model.trainable_variables)
    state = restore_checkpoint(model, out_dir) if resume else RunState()
    loop = _Loop(model, task, config, pathlib.Path(out_dir), state, called, verbose)
    with contextlib.ExitStack() as stack:
        stop_request = stop_request or stack.enter_context(StopRequest())
        # Closed before the run returns or stops, whatever stops it: first the evaluations (which hand their
        # files to the writer), then the writer (every file on disk).
        writer = stack.enter_context(FileWriter())
        validation_batches = fed_to_keras(task.batches(  # read again at each evaluation
            validation_ids, loop.block_size, config.batch_size, config.eval_iters, seed=config.seed + 1,
            part=loop.part))
        evaluations = stack.enter_context(_Evaluations(
            model, validation_batches, metrics or {}, out_dir,
            task.characters_per_token(model.tokenizer, validation_ids),
            peak_flops and model.training_flops_per_token() / peak_flops,
            tensorboard and history.TensorBoardLog(tensorboard), sample, writer, loop.progress.say))
        loop.disk_waits = lambda: writer.waited_s + evaluations.disk_waited_s
        if film is not None:
            evaluations.film = Recorder(out_dir, film, model.get_config(), writer,
                                        resumed_at=state.step if resume else None)
            loop.film, loop.evaluations = evaluations.film, evaluations
            if evaluations.film.due(state.step):  # the weights it starts from
                evaluations.film.take(state.step, None)
                evaluations.frame(state.step, saving.weights_by_layer(model))
        for boundary in _boundaries(config, state.step):
            loop.fit_to(boundary, train_ids, stop_request, callbacks)
            loop.evaluate_or_checkpoint(evaluations, stop_request)
        with loop.run_time.counting("evaluation", loop.disk_waits):
            evaluations.close()
        with loop.run_time.counting("disk", loop.disk_waits):
            writer.close()  # the run's end waits for every file
    loop.say_summary()
    return state.rows


class _Loop:
    """The steps of a `train` call between its boundaries (evaluations and checkpoints), and what they count: the
    run's state, where its time went, its throughput and progress bar."""

    def __init__(self, model, task, config, out_dir, state, started, verbose):
        self.model, self.task, self.config, self.out_dir, self.state = model, task, config, out_dir, state
        self.started = started
        self.block_size = model.config.block_size
        self.part = running().process_part()
        self.first_step = state.step
        self.elapsed_before = state.rows[-1]["elapsed_s"] if state.rows else 0.0
        self.run_time = history.RunTime(state.rows[-1] if state.rows else None)
        self.throughput = history.Throughput(config.batch_size * self.block_size)
        self.progress = _Progress(state.step, config.max_iters, verbose)
        self.disk_waits = lambda: 0.0
        self.film = None  # the run's film's `training.film.Recorder`, where it keeps one
        self.evaluations = None

    def tokens(self):
        """Tokens trained by this process so far."""
        config = self.config
        return (self.state.step - self.first_step) * config.grad_accum * config.batch_size * self.block_size

    def fit_to(self, boundary, train_ids, stop_request, callbacks):
        """Train with one `fit` call up to step `boundary` (or until a stop is requested), and count it."""
        config, state = self.config, self.state
        batches = self.task.batches(train_ids, self.block_size, config.batch_size, boundary - state.step,
                                    seed=config.seed, first_index=state.step, micro_batches=config.grad_accum,
                                    part=self.part)
        watcher = _StepWatcher(stop_request, self.progress, config.seed, state.step, config.grad_accum, len(batches),
                               on_steps=self.steps_done if self.film else None)
        fit_started = time.perf_counter()
        self.model.fit(fed_to_keras(batches), epochs=1, shuffle=False, callbacks=[watcher, *callbacks], verbose=0)
        fit_ended = time.perf_counter()
        # The first call's time to its first compiled call's end is the start-up (building, compiling); the rest,
        # steps.
        if self.run_time.seconds["startup"] == 0 and watcher.first_call_ended is not None:
            self.run_time.add("startup", watcher.first_call_ended - self.started)
            self.run_time.add("steps", fit_ended - watcher.first_call_ended)
        else:
            self.run_time.add("steps", fit_ended - fit_started)
        self.throughput.add(watcher.batches, fit_started, watcher.first_call_ended, watcher.last_batch_ended,
                            watcher.first_call_batches)
        state.step += watcher.steps
        if not math.isfinite(watcher.mean_loss):
            raise TrainingDiverged(
                f"the training loss became {watcher.mean_loss} by step {state.step}; "
                f"{self.out_dir / 'model.keras'} keeps the last good model; try a lower `lr`"
            )
        state.loss_sum += watcher.mean_loss * watcher.steps
        state.loss_steps += watcher.steps

    def steps_done(self, step, loss_sum, steps, model):
        """Count the steps' losses since the film's last frame; at a frame's step, take it (the training thread):
        at an evaluation's step the evaluation measures it, at others it is measured on its own."""
        state = self.state
        state.frame_loss_sum += loss_sum
        state.frame_loss_steps += steps
        if self.film.due(step):
            self.film.take(step, state.frame_loss_sum / state.frame_loss_steps)
            state.frame_loss_sum, state.frame_loss_steps = 0.0, 0
            if not evaluates_at(self.config, step):
                self.evaluations.frame(step, saving.weights_by_layer(model()))

    def evaluate_or_checkpoint(self, evaluations, stop_request):
        """At an evaluation's step, evaluate; at a checkpoint's (or on a stop request), write one; on a stop
        request, stop the run."""
        config, state = self.config, self.state
        if evaluates_at(config, state.step):
            elapsed = time.perf_counter() - self.started
            with self.run_time.counting("evaluation", self.disk_waits):
                evaluations.evaluate(state, self.elapsed_before + elapsed, self.throughput.take(),
                                     self.tokens() / elapsed, self.run_time)
        checkpoint_due = state.step % config.checkpoint_interval == 0 or state.step == config.max_iters
        if checkpoint_due or stop_request.requested:
            with self.run_time.counting("checkpoints", self.disk_waits):
                evaluations.checkpoint(state, config, self.out_dir, self.task.name)
        if stop_request.requested and state.step < config.max_iters:
            raise TrainingInterrupted(
                f"training stopped at step {state.step} of {config.max_iters}; checkpoint saved in "
                f"{self.out_dir}; continue it with `resume=True`",
                stop_request.signal_number,
            )

    def say_summary(self):
        elapsed = time.perf_counter() - self.started
        if self.tokens():
            self.progress.say(f"trained {self.state.step - self.first_step:,} steps in {elapsed:.0f} s: "
                              f"{self.tokens() / elapsed:,.0f} tokens/s over the whole run "
                              f"({self.run_time.summary()})")

def _check(model, config, task, peak_flops):
    """Refuse a model, settings and data that cannot train together."""
    if model.dtype_policy.name != dtype_policy(config.precision):
        raise ConfigError(
            f"the model computes in {model.dtype_policy.name} but the training precision is {config.precision}; "
            f"build it with dtype=gptlite.training.settings.dtype_policy({config.precision!r})"
        )
    running().check_precision(config.precision)
    if peak_flops is not None and not (task.measures_mfu and peak_flops > 0):
        raise ConfigError("`peak_flops` must be positive, and MFU is estimated for a GPT only")


def evaluates_at(config, step):
    """Whether a run evaluates at `step`."""
    return step % config.eval_interval == 0 or step == config.max_iters


def _boundaries(config, step):
    """The steps after `step` where `fit` stops: each evaluation's, each checkpoint's, and the last."""
    every = (set(range(config.eval_interval, config.max_iters, config.eval_interval))
             | set(range(config.checkpoint_interval, config.max_iters, config.checkpoint_interval))
             | {config.max_iters})
    return sorted(boundary for boundary in every if boundary > step)


class _Evaluations:
    """A run's evaluations and its checkpoints' documents, done in order on a thread of their own
    (`background.Jobs`), so that the steps go on meanwhile.

    An evaluation measures a copy of the model taken at its step (`shadow`,
    built once; the weights are copied in at each evaluation, once the one
    before is done): the validation loss and the metrics. It then records
    the row, keeps the best model (a copy handed to the writer), hands the
    history and the plot to the writer, writes TensorBoard's record, and
    says its line. A checkpoint's variables are copied at its own step, on
    the training thread; its document names the evaluations before it, so
    it is written after them, from the same queue, and it waits for the
    checkpoint before it to be on disk (said once, where the disk is slower
    than the checkpoints). Where evaluations cannot run beside the steps
    (`Runtime.evaluates_beside_steps`), all of it is done at once, on the
    training thread; the files are still written on the writer's.
    """

    def __init__(self, model, validation_batches, metrics, out_dir, characters_per_token, utilisation_per_token,
                 tensorboard, sample, writer, say):
        self.model, self.validation_batches, self.metrics, self.out_dir = model, validation_batches, metrics, out_dir
        self.characters_per_token = characters_per_token  # None without a tokenizer
        self.utilisation_per_token = utilisation_per_token  # MFU per token per second; None when not measured
        self.tensorboard, self.sample = tensorboard, sample  # sample: a function of a model returning text
        self.writer, self.say = writer, say
        self.disk_waited_s = 0.0
        self.shadow = saving.inference_copy(model)
        self.shadow.compile(loss=model.loss, jit_compile=model.jit_compile)
        self._checkpoint_on_disk = None
        self._told = False
        self.film = None  # the run's film's `training.film.Recorder`, where it keeps one
        self._jobs = Jobs("gptlite-evaluation", background=running().evaluates_beside_steps())

    def __enter__(self):
        return self

    def __exit__(self, kind, error, trace):
        try:
            self.close()
        except Exception:
            if kind is None:
                raise  # otherwise the run's own error goes on
        finally:
            if self.tensorboard:
                self.tensorboard.close()

    def close(self):
        """Wait for every evaluation and checkpoint document; raise a failed one's error."""
        self._jobs.close()

    def evaluate(self, state, elapsed, tokens_per_s, run_tokens_per_s, run_time):
        """At an evaluation step, on the training thread: the step's own figures now, the rest on the thread."""
        self._jobs.wait()  # the copy is free once the evaluation before is done
        saving.copy_weights(self.model, self.shadow)
        row = dict(step=state.step, train_loss=state.loss_sum / state.loss_steps,
                   learning_rate=float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate)),
                   tokens_per_s=tokens_per_s, elapsed_s=round(elapsed, 2), run_tokens_per_s=run_tokens_per_s,
                   **run_time.columns())
        state.loss_sum, state.loss_steps = 0.0, 0
        self._jobs.submit(lambda: self._evaluate(state, row))

    def _evaluate(self, state, figures):
        """Measure the copy, record the row, keep the best model, hand the files over, say the line."""
        shadow = self.shadow
        val_loss = float(shadow.evaluate(self.validation_batches, verbose=0))
        row = dict(step=figures["step"], train_loss=figures["train_loss"], val_loss=val_loss)
        if self.characters_per_token:
            row["val_bits_per_char"] = val_loss / math.log(2) / self.characters_per_token
        row.update(learning_rate=figures["learning_rate"], tokens_per_s=figures["tokens_per_s"])
        if self.utilisation_per_token:
            row["mfu"] = figures["tokens_per_s"] * self.utilisation_per_token
        row.update({name: value for name, value in figures.items() if name not in row})
        row.update({name: measure(shadow) for name, measure in self.metrics.items()})
        state.rows.append(row)
        if self.film is not None and row["step"] in self.film.train_losses:
            self.film.add(row["step"], val_loss, saving.weights_by_layer(shadow))
        improved = val_loss < state.best_val_loss
        if improved:
            state.best_val_loss = val_loss
            # Renamed into place whole at once, synced when the run ends: the run's synced record is its
            # checkpoint, and a disk that syncs slowly then syncs once an interval, not twice.
            saving.save(shadow, self.out_dir / "model.keras", self.writer, sync="at close")
        rows = copy.deepcopy(state.rows)  # as they are now: the writer's thread reads them later
        # Both follow from the checkpoint's own record: renamed into place whole, not synced.
        self.writer.write(self.out_dir / "history.csv", lambda path: history.write_history(rows, path), sync=False)
        self.writer.write(self.out_dir / "loss.png", lambda path: history.plot_losses(rows, path), sync=False)
        if self.tensorboard:
            self.tensorboard.write(row, self.sample and self.sample(shadow), self.metrics)
        tokens_per_s, run_tokens_per_s = row["tokens_per_s"], row["run_tokens_per_s"]
        self.say(
            f"step {row['step']}: train loss {row['train_loss']:.4f}, val loss {val_loss:.4f}"
            + (f", {row['val_bits_per_char']:.3f} bits/char" if "val_bits_per_char" in row else "")
            + "".join(f", {name.replace('_', ' ')} {row[name]:.1%}" for name in self.metrics)
            + (f"{' (best so far, saved)' if improved else ''}  [{row['elapsed_s']:.0f} s"
               + (f", {tokens_per_s:,.0f} tokens/s" if math.isfinite(tokens_per_s) else "")
               + f", whole run {run_tokens_per_s:,.0f} tokens/s"
               + (f", MFU {row['mfu']:.1%}" if "mfu" in row and math.isfinite(row["mfu"]) else "") + "]")
        )

    def frame(self, step, arrays):
        """A frame of the film at `step` that no evaluation measures, its weights copied off the model
        (`saving.weights_by_layer`): its validation loss measured on the evaluations' thread, on their batches."""
        def measure():
            saving.load_weights_by_layer(self.shadow, arrays)
            self.film.add(step, float(self.shadow.evaluate(self.validation_batches, verbose=0)), arrays)

        self._jobs.submit(measure)

    def checkpoint(self, state, config, out_dir, task):
        """At a checkpoint step of a run of `task` (its name), on the training thread: wait for the checkpoint
        before to be on disk, copy the variables now, and leave the document and the writing to the thread."""
        before = self._checkpoint_on_disk
        if before is not None and not before.is_set():
            if not self._told:
                self._told = True
                self.say(SLOW_DISK)
            started = time.perf_counter()
            while not before.wait(0.5):
                # A failure before it (an evaluation's, or a write's) means it will never be written.
                self._jobs.raise_failure()
                self.writer.raise_failure()
            self.disk_waited_s += time.perf_counter() - started
        arrays = snapshot(self.model)
        on_disk = self._checkpoint_on_disk = threading.Event()
        as_of = dict(step=state.step, loss_sum=state.loss_sum, loss_steps=state.loss_steps,
                     frame_loss_sum=state.frame_loss_sum, frame_loss_steps=state.frame_loss_steps)

        def write():
            # The rows and the best loss of every evaluation before it, the rest as of its step.
            document = dataclasses.replace(state, rows=list(state.rows), **as_of)
            save_checkpoint(self.model, arrays, document, config, out_dir, self.writer, task,
                            on_written=on_disk.set)

        self._jobs.submit(write)
