"""What a run records at each evaluation, and where: `history.csv`, TensorBoard's event files, the loss
curve (`loss.png`), and the figures beside the losses (tokens per second, MFU)."""

import contextlib
import csv
import importlib.util
import math
import pathlib
import time

from gptlite.backend.machine import A100_PEAK_FLOPS
from gptlite.errors import ConfigError, InputError

DEFAULT_PEAK_FLOPS = A100_PEAK_FLOPS  # nanoGPT's, for its MFU figure


def write_history(rows, path):
    """The evaluation `rows` as CSV at `path` (written as it is: a run writes it through its FileWriter, whole
    or not at all), columns in order of first appearance.

    A run resumed from an older checkpoint has early rows without the columns
    added since: their cells are left empty.
    """
    columns = list(dict.fromkeys(name for row in rows for name in row))
    with open(path, "w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=columns, restval="")
        writer.writeheader()
        writer.writerows(rows)


class RunTime:
    """Where a run's wall-clock time goes on the training thread, in seconds, added up over the run (and over
    its resumptions):

    steps       training steps, their first left out
    startup     from `train` being called to the first step's end: building, compiling, the first step
    evaluation  copying the weights for an evaluation, and waiting for the one before where it is not done
                (the evaluations themselves run beside the steps: `_Evaluations`)
    checkpoints copying the model's and optimizer's state off the device
    disk        waiting for files: a checkpoint for the one before it, the run's end for all
    """

    PARTS = ("steps", "startup", "evaluation", "checkpoints", "disk")

    def __init__(self, row=None):
        # What earlier processes of the run spent (from the last history row), and this one.
        self.before = {part: (row or {}).get(f"{part}_s", 0.0) for part in self.PARTS}
        self.seconds = dict.fromkeys(self.PARTS, 0.0)

    def add(self, part, seconds):
        self.seconds[part] += seconds

    @contextlib.contextmanager
    def counting(self, part, disk_waits=lambda: 0.0):
        """Time the block as `part`, less what it waited for the disk (`disk_waits()`, a running total)."""
        started, waited = time.perf_counter(), disk_waits()
        try:
            yield
        finally:
            waited = disk_waits() - waited
            self.add("disk", waited)
            self.add(part, time.perf_counter() - started - waited)

    def columns(self):
        """The history's columns, over the whole run: `steps_s`, `startup_s`, ..."""
        return {f"{part}_s": round(self.before[part] + seconds, 2) for part, seconds in self.seconds.items()}

    def summary(self):
        """This process's parts in one line: each one's seconds and share."""
        total = sum(self.seconds.values()) or 1.0
        return ", ".join(f"{part} {seconds:.1f} s ({seconds / total:.0%})" for part, seconds in self.seconds.items()
                         if seconds >= 0.05 or part == "steps")


class Throughput:
    """Tokens trained per second since it was last read, over the time `fit` spent up to each of its last batches.

    The first call a process makes builds (and compiles) the step: its
    batches and time are left out, so that the first figure is the steps' own
    speed. (A call runs one batch, or `steps_per_call` optimizer steps' worth.)
    """

    def __init__(self, tokens_per_batch):
        self.tokens_per_batch = tokens_per_batch
        self.first_left_out = False
        self.batches, self.seconds = 0, 0.0

    def add(self, batches, started, first_call_ended, ended, first_call_batches=1):
        """A `fit` call's `batches`, timed from `started` to `ended`, the end of its last batch
        (time.perf_counter() readings); its first compiled call ran `first_call_batches`, ending at
        `first_call_ended`."""
        if not self.first_left_out and batches:
            batches, started = batches - first_call_batches, first_call_ended
            self.first_left_out = True
        self.batches += batches
        self.seconds += ended - started

    def take(self):
        """Tokens per second since the last call (NaN if no batch was timed), and start again."""
        rate = self.batches * self.tokens_per_batch / self.seconds if self.batches and self.seconds > 0 else math.nan
        self.batches, self.seconds = 0, 0.0
        return rate


def check_tensorboard(folder=None):
    """TensorFlow writes TensorBoard's scalars and text only with the tensorboard package installed,
    and only into a folder."""
    if importlib.util.find_spec("tensorboard") is None:
        raise ConfigError("`tensorboard` needs the tensorboard package to write its events: "
                          "pip install \"gptlite[tensorboard]\"")
    if folder is not None and pathlib.Path(folder).exists() and not pathlib.Path(folder).is_dir():
        raise InputError(f"the folder for TensorBoard's events, {folder}, is a file: name a folder")


class TensorBoardLog:
    """Scalars and text at each evaluation, written with `tf.summary` to event files in `folder`.

    A resumed run writes a new event file beside the old ones, at its own
    steps, so TensorBoard shows one curve carrying on. Any backend: TensorFlow
    only writes the files.
    """

    SCALARS = {"train_loss": "loss/train", "val_loss": "loss/validation",
               "val_bits_per_char": "bits_per_character/validation", "learning_rate": "learning_rate",
               "tokens_per_s": "tokens_per_second", "mfu": "mfu"}

    def __init__(self, folder):
        check_tensorboard()
        import tensorflow as tf

        self._tf = tf
        try:
            self._writer = tf.summary.create_file_writer(str(folder))
        except (tf.errors.OpError, OSError) as error:
            raise InputError(f"cannot write TensorBoard events to `tensorboard` {folder}: {error}") from None

    def write(self, row, sample=None, metrics=()):
        """Write an evaluation `row`'s figures (and `metrics`, by name) at its step, and the `sample` text."""
        tf, step = self._tf, row["step"]
        with self._writer.as_default(step=step), tf.device("/cpu:0"):
            for name, tag in [*self.SCALARS.items(), *((name, name) for name in metrics)]:
                value = row.get(name)
                if value is not None and math.isfinite(value):
                    tf.summary.scalar(tag, value)
            if sample is not None:
                # TensorBoard shows text as Markdown: a code block keeps the sample's lines and spaces.
                tf.summary.text("sample", "```\n" + sample.replace("```", "` ` `") + "\n```")
        self._writer.flush()

    def close(self):
        self._writer.close()


def plot_losses(rows, path):
    """Train and validation loss of the evaluation `rows` against step, drawn with matplotlib's object API (no
    pyplot: drawing changes neither matplotlib's backend nor a notebook's figures) and written to `path` (PNG) as
    it is (a run writes it through its FileWriter, whole or not at all)."""
    from matplotlib.figure import Figure

    steps = [row["step"] for row in rows]
    figure = Figure(figsize=(6, 4), dpi=100)
    axes = figure.subplots()
    axes.plot(steps, [row["train_loss"] for row in rows], marker="o", label="train (mean since last eval)")
    axes.plot(steps, [row["val_loss"] for row in rows], marker="o", label="validation")
    axes.set_xlabel("step")
    axes.set_ylabel("cross-entropy loss (nats/token)")
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, format="png")
