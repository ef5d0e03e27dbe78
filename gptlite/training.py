"""Training with `model.fit`: presets, the optimizer and schedule, evaluation records."""

import contextlib
import csv
import dataclasses
import json
import math
import os
import pathlib
import signal
import sys
import threading
import time

import keras
import numpy as np

from gptlite import generation, pairs, saving
from gptlite.data import RandomWindows
from gptlite.errors import ConfigError, InputError, TrainingDiverged, TrainingInterrupted
from gptlite.model import GPTConfig, Seq2Seq

# Every value here can be overridden from the command line (`--n-layer 6`).
PRESETS = {
    # nanoGPT's CPU configuration for Tiny Shakespeare, so results compare
    # directly, but for the peak learning rate: 3e-3 rather than 1e-3 takes
    # this small model further in its 2000 steps (BENCHMARKS.md).
    "cpu": dict(
        n_layer=4, n_head=4, n_embd=128, block_size=64, dropout=0.0,
        batch_size=12, max_iters=2000, lr=3e-3, min_lr=1e-4, warmup_iters=100,
        beta2=0.99, weight_decay=0.1, eval_interval=250, eval_iters=20, checkpoint_interval=250,
    ),
    # nanoGPT's GPU configuration for Tiny Shakespeare, in bfloat16 (on a GPU
    # without it, pass --precision fp16). Dropout stays off the attention
    # weights, so attention runs fused (flash where the backend has it).
    "gpu": dict(
        n_layer=6, n_head=6, n_embd=384, block_size=256, dropout=0.2,
        batch_size=64, max_iters=5000, lr=1e-3, min_lr=1e-4, warmup_iters=100,
        beta2=0.99, weight_decay=0.1, eval_interval=250, eval_iters=20, checkpoint_interval=250,
        precision="bf16",
    ),
    # The seq2seq model's (--task seq2seq, --synthetic): an encoder and a
    # decoder of 2 blocks each. Its block size, unless given, is the longest pair's.
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
# The steps of the seq2seq preset when --synthetic chooses it: about what each
# task takes to decode 99% of its held-out pairs exactly (BENCHMARKS.md).
SYNTHETIC_MAX_ITERS = {"addition": 8000, "reverse": 1500, "sort": 6000}
# Keras dtype policies: mixed ones keep float32 weights and optimizer state,
# and compute in 16 bits; float16 also scales the loss (Keras does it in compile).
PRECISIONS = {"fp32": "float32", "bf16": "mixed_bfloat16", "fp16": "mixed_float16"}
# Settings a resumed run cannot change: they decide the weights' shapes and meaning.
MODEL_SHAPE_SETTINGS = ("n_layer", "n_head", "n_embd", "block_size", "bias", "tie_weights", "position")


@dataclasses.dataclass(frozen=True)
class TrainingConfig:
    """How to train. Defaults are the `cpu` preset."""

    batch_size: int = 12  # sequences per step
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

    def __post_init__(self):
        for name in ("batch_size", "max_iters", "eval_interval", "eval_iters", "checkpoint_interval"):
            _require(name, getattr(self, name), lambda v: isinstance(v, int) and v >= 1,
                     "a positive whole number")
        _require("warmup_iters", self.warmup_iters, lambda v: isinstance(v, int) and v >= 0,
                 "zero or a positive whole number")
        _require("lr", self.lr, lambda v: v > 0, "positive")
        _require("min_lr", self.min_lr, lambda v: v > 0, "positive")
        if self.min_lr > self.lr:
            raise ConfigError(f"min_lr ({self.min_lr}) must not be above lr ({self.lr})")
        if self.warmup_iters >= self.max_iters:
            raise ConfigError(
                f"warmup_iters ({self.warmup_iters}) must be below max_iters ({self.max_iters})"
            )
        _require("beta2", self.beta2, lambda v: 0 <= v < 1, "in [0, 1)")
        _require("weight_decay", self.weight_decay, lambda v: v >= 0, "zero or positive")
        _require("precision", self.precision, lambda v: v in PRECISIONS, f"one of {', '.join(PRECISIONS)}")


def default_settings(seq2seq=False, synthetic=None):
    """The settings of a run given no --preset: the cpu preset's for a GPT, the
    seq2seq preset's for a Seq2Seq, with a synthetic task's own number of steps."""
    if not seq2seq:
        return PRESETS[DEFAULT_PRESET]
    return {**PRESETS["seq2seq"], **({"max_iters": SYNTHETIC_MAX_ITERS[synthetic]} if synthetic else {})}


def dtype_policy(precision):
    """The Keras dtype policy for a `TrainingConfig.precision`."""
    return PRECISIONS[precision]


def _require(name, value, is_valid, description):
    if not is_valid(value):
        raise ConfigError(f"{name} must be {description}, got {value!r}")


# Every name a preset or a command-line flag may set (vocab_size comes from the tokenizer).
SETTING_NAMES = tuple(
    f.name for f in dataclasses.fields(GPTConfig) + dataclasses.fields(TrainingConfig) if f.name != "vocab_size"
)


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


def learning_rate_schedule(config):
    """Linear warm-up to `lr`, then cosine decay to `min_lr` at `max_iters`."""
    return keras.optimizers.schedules.CosineDecay(
        # Start above zero so the first step is not wasted.
        initial_learning_rate=config.lr / (config.warmup_iters + 1),
        warmup_target=config.lr,
        warmup_steps=config.warmup_iters,
        decay_steps=config.max_iters - config.warmup_iters,
        alpha=config.min_lr / config.lr,
    )


def make_optimizer(model, config):
    """AdamW with clipping at global norm 1.0, decaying only weight matrices.

    Decaying biases, norms or embeddings pulls them towards zero for no gain in
    generalisation, so they are left out. `model` must be built.
    """
    optimizer = keras.optimizers.AdamW(
        learning_rate=learning_rate_schedule(config),
        weight_decay=config.weight_decay,
        beta_1=0.9,
        beta_2=config.beta2,
        global_clipnorm=1.0,
    )
    embedding_tables = [
        v for v in model.embedding.trainable_variables
        if v.name in ("embeddings", "position_embeddings")
    ]
    vectors = [v for v in model.trainable_variables if len(v.shape) < 2]
    optimizer.exclude_from_weight_decay(var_list=embedding_tables + vectors)
    return optimizer


def compile_for_training(model, config):
    # Keras's "auto" leaves XLA off on CPU-only TensorFlow, yet XLA makes the
    # cpu preset's step about 1.5x faster there. Torch has no XLA; TensorFlow's
    # XLA refuses a step whose mirrored variables sit on several devices.
    xla = keras.backend.backend() == "jax" or (keras.backend.backend() == "tensorflow" and not _mirrored())
    # A seq2seq batch pads its targets; the padded positions do not count.
    padding = Seq2Seq.PAD_ID if isinstance(model, Seq2Seq) else None
    model.compile(
        optimizer=make_optimizer(model, config),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, ignore_class=padding),
        jit_compile=xla,
    )


def _mirrored():
    """Whether a TensorFlow strategy with more than one replica is in scope."""
    import tensorflow as tf

    return tf.distribute.has_strategy() and tf.distribute.get_strategy().num_replicas_in_sync > 1


@contextlib.contextmanager
def data_parallel(batch_size):
    """A scope in which to build, compile and train a model data-parallel; yields the replica count.

    Each step's batch of `batch_size` sequences is split evenly across the
    replicas and their gradients averaged, so the step is the same step, on
    the same batch and learning rate, as on one device. TensorFlow: a
    MirroredStrategy over the local GPUs (else the local CPU devices); Keras
    clips each replica's gradient before the average there. JAX:
    keras.distribution.DataParallel over every device, after joining the
    processes (hosts) that KERAS_DISTRIBUTION_JOB_ADDRESSES, _NUM_PROCESSES
    and _PROCESS_ID describe, where they are set.
    """
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        if "TF_CONFIG" in os.environ:
            # Keras 3's fit fails under MultiWorkerMirroredStrategy (keras-team/keras#20585).
            raise ConfigError(
                "training over several hosts needs the jax backend (KERAS_BACKEND=jax, hosts given by "
                "KERAS_DISTRIBUTION_JOB_ADDRESSES, _NUM_PROCESSES and _PROCESS_ID): Keras's fit does not run "
                "under TensorFlow's MultiWorkerMirroredStrategy; unset TF_CONFIG to train on this host's devices"
            )
        # MirroredStrategy's own default takes one CPU device even where there are more.
        devices = tf.config.list_logical_devices("GPU") or tf.config.list_logical_devices("CPU")
        strategy = tf.distribute.MirroredStrategy([device.name for device in devices])
        _check_split(batch_size, strategy.num_replicas_in_sync)
        with strategy.scope():
            yield strategy.num_replicas_in_sync
    elif backend == "jax":
        if "KERAS_DISTRIBUTION_NUM_PROCESSES" in os.environ:
            keras.distribution.initialize()
        devices = keras.distribution.list_devices()
        _check_split(batch_size, len(devices))
        previous = keras.distribution.distribution()
        distribution = keras.distribution.DataParallel(devices=devices)
        # Each process feeds its own rows of every batch (see process_part), already split.
        distribution.auto_shard_dataset = False
        keras.distribution.set_distribution(distribution)
        try:
            yield len(devices)
        finally:
            keras.distribution.set_distribution(previous)
    else:
        raise ConfigError(f"--distribute needs the tensorflow or jax backend, not {backend}")


def process_part():
    """(i, n): this is process i of the n that train together, each feeding 1/n of every batch."""
    if keras.backend.backend() == "jax" and keras.distribution.distribution() is not None:
        import jax

        return jax.process_index(), jax.process_count()
    return 0, 1


def _check_split(batch_size, replicas):
    if batch_size % replicas:
        raise ConfigError(f"--batch-size {batch_size} does not split evenly across {replicas} devices; "
                          f"choose a multiple of {replicas}")


def write_history(rows, path):
    with saving.atomic_path(path) as temporary:
        with open(temporary, "w", newline="") as file:
            writer = csv.DictWriter(file, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)


def plot_losses(rows, path):
    import matplotlib

    matplotlib.use("Agg")  # files only; no display needed
    from matplotlib import pyplot

    steps = [row["step"] for row in rows]
    figure, axes = pyplot.subplots(figsize=(6, 4), dpi=100)
    axes.plot(steps, [row["train_loss"] for row in rows], marker="o", label="train (mean since last eval)")
    axes.plot(steps, [row["val_loss"] for row in rows], marker="o", label="validation")
    axes.set_xlabel("step")
    axes.set_ylabel("cross-entropy loss (nats/token)")
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    with saving.atomic_path(path) as temporary:
        figure.savefig(temporary, format="png")
    pyplot.close(figure)


CHECKPOINT_WEIGHTS = "checkpoint.weights.h5"
CHECKPOINT_STATE = "checkpoint.json"
CHECKPOINT_FORMAT = 1


@dataclasses.dataclass
class RunState:
    """What a run has done so far; saved with each checkpoint."""

    step: int = 0
    rows: list = dataclasses.field(default_factory=list)  # one per evaluation
    best_val_loss: float = math.inf
    loss_sum: float = 0.0  # train loss summed over the steps since the last evaluation
    loss_steps: int = 0


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
        print("\nstopping after this step to save a checkpoint (press Ctrl-C again to abort)",
              file=sys.stderr, flush=True)


class _StepWatcher(keras.callbacks.Callback):
    """Stops `fit` after the step in which a stop was requested or the loss went non-finite."""

    def __init__(self, stop_request, progress, seed, first_step):
        super().__init__()
        self.stop_request = stop_request
        self.progress = progress
        self.seed, self.first_step = seed, first_step
        self.mean_loss = math.nan
        self.steps = 0
        self.torch = None
        if keras.backend.backend() == "torch":
            import torch

            self.torch = torch

    def on_train_batch_begin(self, batch, logs=None):
        if self.torch is not None:
            # On torch, Keras's unseeded dropout draws from torch's own global
            # generator, which the data loader also draws from; seeding it from
            # the step makes the masks the same in a resumed run.
            self.torch.manual_seed(self.seed * 1_000_003 + self.first_step + batch)

    def on_train_batch_end(self, batch, logs=None):
        self.steps = batch + 1
        self.mean_loss = float(logs["loss"])  # mean over this fit call's steps so far
        self.progress.step_done(self.mean_loss)
        if not math.isfinite(self.mean_loss) or self.stop_request.requested:
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

    def step_done(self, mean_loss):
        self.step += 1
        if self.live:
            self.bar.update(self.step, [("loss", mean_loss)])

    def say(self, line):
        if self.verbose:
            # On a terminal the bar's line is cleared first; the bar redraws below.
            print(("\r\033[K" if self.live else "") + line, flush=True)


def train(model, train_ids, validation_ids, config, out_dir, verbose=1, resume=False, stop_request=None,
          callbacks=()):
    """Train `model` with `model.fit`; return the evaluation records.

    A GPT trains on token ids (1-D arrays), a Seq2Seq on `pairs.PairSet`s; a
    Seq2Seq's evaluations also decode (greedily) up to HELD_OUT_PAIRS of the
    validation pairs and record the fraction decoded exactly (exact_match).
    Every `eval_interval` steps the validation loss is measured; the best model
    by validation loss is saved to `out_dir/model.keras`, with `history.csv`
    and `loss.png` beside it. Every `checkpoint_interval` steps, and when a
    stop is requested (Ctrl-C, SIGTERM), a checkpoint is written from which
    `resume=True` continues exactly. The model in memory ends with the last
    step's weights. `callbacks`: more Keras callbacks, given to every `fit` call.
    """
    out_dir = pathlib.Path(out_dir)
    if model.dtype_policy.name != dtype_policy(config.precision):
        raise ConfigError(
            f"the model computes in {model.dtype_policy.name} but the training precision is {config.precision}; "
            f"build it with dtype=gptlite.training.dtype_policy({config.precision!r})"
        )
    if (config.precision == "fp16" and keras.backend.backend() == "jax"
            and all(device.startswith("cpu") for device in keras.distribution.list_devices())):
        raise ConfigError("fp16 under jax needs a GPU: XLA's CPU matmuls have no float16; use --precision bf16")
    block_size = model.config.block_size
    if not model.built:
        model.build((None, block_size))
    compile_for_training(model, config)
    model.optimizer.build(model.trainable_variables)
    state = _restore_checkpoint(model, out_dir) if resume else RunState()

    part = process_part()
    validation_batches = _batches(
        validation_ids, block_size, config.batch_size, config.eval_iters, seed=config.seed + 1, part=part
    )
    boundaries = sorted(
        {s for s in range(config.eval_interval, config.max_iters, config.eval_interval)}
        | {s for s in range(config.checkpoint_interval, config.max_iters, config.checkpoint_interval)}
        | {config.max_iters}
    )
    progress = _Progress(state.step, config.max_iters, verbose)
    started = time.perf_counter()
    elapsed_before = state.rows[-1]["elapsed_s"] if state.rows else 0.0
    with contextlib.ExitStack() as stack:
        stop_request = stop_request or stack.enter_context(StopRequest())
        for boundary in (b for b in boundaries if b > state.step):
            watcher = _StepWatcher(stop_request, progress, config.seed, state.step)
            batches = _batches(train_ids, block_size, config.batch_size, boundary - state.step,
                               seed=config.seed, first_index=state.step, part=part)
            model.fit(batches, epochs=1, shuffle=False, callbacks=[watcher, *callbacks], verbose=0)
            state.step += watcher.steps
            if not math.isfinite(watcher.mean_loss):
                raise TrainingDiverged(
                    f"the training loss became {watcher.mean_loss} by step {state.step}; "
                    f"{out_dir / 'model.keras'} keeps the last good model; try a lower --lr"
                )
            state.loss_sum += watcher.mean_loss * watcher.steps
            state.loss_steps += watcher.steps
            if state.step % config.eval_interval == 0 or state.step == config.max_iters:
                elapsed = elapsed_before + time.perf_counter() - started
                progress.say(_evaluate(model, validation_batches, validation_ids, state, out_dir, elapsed))
            checkpoint_due = state.step % config.checkpoint_interval == 0 or state.step == config.max_iters
            if checkpoint_due or stop_request.requested:
                _save_checkpoint(model, state, config, out_dir)
            if stop_request.requested and state.step < config.max_iters:
                raise TrainingInterrupted(
                    f"training stopped at step {state.step} of {config.max_iters}; checkpoint saved in "
                    f"{out_dir}; continue with the same command plus --resume",
                    stop_request.signal_number,
                )
    return state.rows


def _batches(token_ids_or_pairs, block_size, batch_size, count, **kwargs):
    if isinstance(token_ids_or_pairs, pairs.PairSet):
        return pairs.PairBatches(token_ids_or_pairs, batch_size, count, **kwargs)
    return RandomWindows(token_ids_or_pairs, block_size, batch_size, count, **kwargs)


def exact_match(model, pair_set, limit=pairs.HELD_OUT_PAIRS):
    """The fraction of the first `limit` pairs whose target the model decodes exactly (greedily)."""
    held_out = pair_set.pairs.subset(range(min(limit, len(pair_set))))
    decoded = generation.generate_target(model, held_out.sources, temperature=0.0)
    return float(np.mean([got == want for got, want in zip(decoded, held_out.targets)]))


def _evaluate(model, validation_batches, validation_data, state, out_dir, elapsed):
    """Measure validation loss (and exact match), record it and keep the best model; return a line to show."""
    val_loss = float(model.evaluate(validation_batches, verbose=0))
    learning_rate = float(keras.ops.convert_to_numpy(model.optimizer.learning_rate))
    row = dict(
        step=state.step,
        train_loss=state.loss_sum / state.loss_steps,
        val_loss=val_loss,
        learning_rate=learning_rate,
        elapsed_s=round(elapsed, 2),
    )
    if isinstance(validation_data, pairs.PairSet):
        row["exact_match"] = exact_match(model, validation_data)
    state.rows.append(row)
    state.loss_sum, state.loss_steps = 0.0, 0
    improved = val_loss < state.best_val_loss
    if improved:
        state.best_val_loss = val_loss
        saving.save(model, out_dir / "model.keras")
    write_history(state.rows, out_dir / "history.csv")
    plot_losses(state.rows, out_dir / "loss.png")
    return (
        f"step {row['step']}: train loss {row['train_loss']:.4f}, val loss {val_loss:.4f}"
        + (f", exact match {row['exact_match']:.1%}" if "exact_match" in row else "")
        + f"{' (best so far, saved)' if improved else ''}  [{row['elapsed_s']:.0f} s]"
    )


def _seed_states(model):
    # Dropout's random state: Keras does not save it with the weights.
    return [v for v in model.variables if v.path.endswith("seed_generator_state")]


def _save_checkpoint(model, state, config, out_dir):
    """Weights with optimizer state, then the run's state; each file replaced atomically."""
    with saving.atomic_path(out_dir / CHECKPOINT_WEIGHTS) as temporary:
        model.save_weights(temporary)
    document = dict(
        format=CHECKPOINT_FORMAT,
        step=state.step,
        model_class=type(model).__name__,
        model_config=model.get_config(),
        training_config=dataclasses.asdict(config),
        run_state=dataclasses.asdict(state),
        seed_states=[keras.ops.convert_to_numpy(v).tolist() for v in _seed_states(model)],
    )
    with saving.atomic_path(out_dir / CHECKPOINT_STATE) as temporary:
        temporary.write_text(json.dumps(document, indent=1))


def read_checkpoint(out_dir):
    """The checkpoint document in `out_dir`, or a `GPTLiteError` saying why there is none."""
    path = pathlib.Path(out_dir) / CHECKPOINT_STATE
    if not path.exists() or not (path.parent / CHECKPOINT_WEIGHTS).exists():
        raise InputError(f"no checkpoint to resume in {out_dir}; start without --resume")
    try:
        document = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise InputError(f"cannot read the checkpoint {path}: {error}") from None
    if document.get("format") != CHECKPOINT_FORMAT:
        raise InputError(f"{path} was written by another version of gptlite (format "
                         f"{document.get('format')}, this one reads {CHECKPOINT_FORMAT})")
    return document


def _restore_checkpoint(model, out_dir):
    document = read_checkpoint(out_dir)
    model.load_weights(pathlib.Path(out_dir) / CHECKPOINT_WEIGHTS)
    for variable, value in zip(_seed_states(model), document["seed_states"]):
        variable.assign(np.asarray(value, dtype=variable.dtype))
    state = RunState(**document["run_state"])
    # The weights may be one checkpoint newer than the state if a kill fell
    # between the two writes: trust the optimizer's own step count.
    state.step = int(keras.ops.convert_to_numpy(model.optimizer.iterations))
    state.rows = [row for row in state.rows if row["step"] <= state.step]
    return state
