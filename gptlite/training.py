"""Training with `model.fit`: presets, the optimizer and schedule, evaluation records."""

import csv
import dataclasses
import math
import pathlib
import time

import keras

from gptlite import saving
from gptlite.data import RandomWindows
from gptlite.errors import ConfigError
from gptlite.model import GPTConfig

# Every value here can be overridden from the command line (`--n-layer 6`).
PRESETS = {
    # nanoGPT's CPU configuration for Tiny Shakespeare, so results compare directly.
    "cpu": dict(
        n_layer=4, n_head=4, n_embd=128, block_size=64, dropout=0.0,
        batch_size=12, max_iters=2000, lr=1e-3, min_lr=1e-4, warmup_iters=100,
        beta2=0.99, weight_decay=0.1, eval_interval=250, eval_iters=20,
    ),
    # nanoGPT's GPU configuration for Tiny Shakespeare.
    "gpu": dict(
        n_layer=6, n_head=6, n_embd=384, block_size=256, dropout=0.2,
        batch_size=64, max_iters=5000, lr=1e-3, min_lr=1e-4, warmup_iters=100,
        beta2=0.99, weight_decay=0.1, eval_interval=250, eval_iters=20,
    ),
    # Seconds long: for tests and first tries.
    "tiny": dict(
        n_layer=2, n_head=2, n_embd=32, block_size=32, dropout=0.0,
        batch_size=8, max_iters=60, lr=3e-3, min_lr=3e-4, warmup_iters=5,
        beta2=0.99, weight_decay=0.1, eval_interval=20, eval_iters=4,
    ),
}
DEFAULT_PRESET = "cpu"


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
    seed: int = 1337  # seeds weights, batches and dropout

    def __post_init__(self):
        for name in ("batch_size", "max_iters", "eval_interval", "eval_iters"):
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


def _require(name, value, is_valid, description):
    if not is_valid(value):
        raise ConfigError(f"{name} must be {description}, got {value!r}")


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
    model.compile(
        optimizer=make_optimizer(model, config),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        # Keras's "auto" leaves XLA off on CPU-only TensorFlow, yet XLA makes
        # the cpu preset's step about 1.5x faster there. Torch has no XLA.
        jit_compile=keras.backend.backend() in ("tensorflow", "jax"),
    )


class StopAtStep(keras.callbacks.Callback):
    """End training after exactly `last_step` optimizer steps."""

    def __init__(self, last_step):
        super().__init__()
        self.last_step = last_step
        self.steps_done = 0

    def on_train_batch_end(self, batch, logs=None):
        self.steps_done += 1
        if self.steps_done >= self.last_step:
            self.model.stop_training = True


class EvaluationRecorder(keras.callbacks.Callback):
    """At each evaluation: record the losses, keep the best model, redraw the loss plot.

    Writes `history.csv` (step, train_loss, val_loss, learning_rate, elapsed_s),
    `loss.png` and, whenever validation loss improves, `model.keras`.
    """

    def __init__(self, out_dir):
        super().__init__()
        self.out_dir = pathlib.Path(out_dir)
        self.rows = []
        self.best_val_loss = math.inf

    def on_train_begin(self, logs=None):
        self.started = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        step = int(self.model.optimizer.iterations.numpy())
        learning_rate = float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate))
        row = dict(
            step=step,
            train_loss=float(logs["loss"]),
            val_loss=float(logs["val_loss"]),
            learning_rate=learning_rate,
            elapsed_s=round(time.perf_counter() - self.started, 2),
        )
        self.rows.append(row)
        if row["val_loss"] < self.best_val_loss:
            self.best_val_loss = row["val_loss"]
            saving.save(self.model, self.out_dir / "model.keras")
        write_history(self.rows, self.out_dir / "history.csv")
        plot_losses(self.rows, self.out_dir / "loss.png")


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


def train(model, train_ids, validation_ids, config, out_dir, verbose=1):
    """Train `model` with `model.fit`; return the evaluation records.

    The best model by validation loss is saved to `out_dir/model.keras` as
    training goes; the model in memory ends with the last step's weights.
    """
    block_size = model.config.block_size
    # fit needs equal epochs; the last one is cut short at max_iters and still
    # ends with an evaluation.
    evaluations = math.ceil(config.max_iters / config.eval_interval)
    batches = RandomWindows(train_ids, block_size, config.batch_size, config.max_iters, seed=config.seed)
    validation_batches = RandomWindows(
        validation_ids, block_size, config.batch_size, config.eval_iters, seed=config.seed + 1
    )
    if not model.built:
        model.build((None, block_size))
    compile_for_training(model, config)
    recorder = EvaluationRecorder(out_dir)
    model.fit(
        batches,
        epochs=evaluations,
        steps_per_epoch=config.eval_interval,
        validation_data=validation_batches,
        validation_steps=config.eval_iters,
        shuffle=False,  # batch i is always step i: runs repeat exactly
        callbacks=[StopAtStep(config.max_iters), recorder],
        verbose=verbose,
    )
    return recorder.rows
