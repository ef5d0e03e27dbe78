"""A run's film: its model's weights at step 0 and at a schedule of steps, dense early and sparse later, every
evaluation's among them, each frame with the run's losses at its step. The run writes them to `film/` in its folder
as it goes; `gptlite.film` (`inside.film`) reads them back.

    film/frames.json        the index: the model's config, the probe, the schedule and a row a frame taken
    film/step-000250.npz    a frame's weights, layer by layer as a saved model holds them (LoRA merged)

A frame is copied off the model on the training thread at its step; its validation loss is measured on the
evaluations' thread, on the evaluations' own batches (at an evaluation's step, it is that evaluation's), and its
files are written on the writer's thread, as checkpoints are: the steps go on meanwhile. A frame's train loss is
the mean training loss of the steps since the frame before (None at the film's first frame).
"""

import dataclasses
import json
import pathlib

import numpy as np

from gptlite.inside import FILM_FOLDER, FILM_INDEX
from gptlite.inside.film import FORMAT, frame_file, read_index

# About how many frames a film keeps.
DEFAULT_FRAMES = 24


def frame_steps(max_iters, eval_interval, count=DEFAULT_FRAMES, every=1):
    """The steps a film keeps: 0, each evaluation's, and the rest spread evenly on a log scale (dense early, where
    a model changes most) until there are `count` or more, each a multiple of `every` (the steps one compiled call
    runs, after which alone the weights can be copied)."""
    evaluations = {0, max_iters} | set(range(eval_interval, max_iters, eval_interval))
    kept = evaluations
    for spread in range(2, max_iters + 2):
        if len(kept) >= count:
            break
        points = {min(max_iters, max(1, round(point / every)) * every)
                  for point in np.geomspace(every, max_iters, spread)}
        # A point next to an evaluation's step (within a tenth of its own) would show nearly the same model.
        kept = evaluations | {point for point in points
                              if all(abs(point - step) > point / 10 for step in evaluations)}
    return sorted(kept)


@dataclasses.dataclass(frozen=True)
class FilmPlan:
    """What a run's film keeps: the `steps` of its frames (`frame_steps`), and the probe text whose inside the
    film shows (`probe_ids`, and `probe` as text)."""

    steps: tuple
    probe: str
    probe_ids: tuple


class Recorder:
    """A film as a run writes it: the frames taken so far (its index's rows), and what each new one needs.

    On a resumed run, the frames after the step it resumes from are dropped from the index (they are taken again,
    so that no frame is missing or repeated); its schedule is the new plan's, its earlier frames and its probe kept.
    """

    def __init__(self, out_dir, plan, model_config, writer, resumed_at=None):
        self.folder, self.index = pathlib.Path(out_dir) / FILM_FOLDER, pathlib.Path(out_dir) / FILM_INDEX
        self.writer = writer
        self.rows = []
        probe, probe_ids = plan.probe, [int(i) for i in plan.probe_ids]
        if resumed_at is not None and self.index.exists():
            earlier = read_index(out_dir)
            self.rows = [row for row in earlier["frames"] if row["step"] <= resumed_at]
            probe, probe_ids = earlier["probe"], earlier["probe_ids"]  # one probe for the whole film
        self.steps = sorted(set(plan.steps) | ({resumed_at} if resumed_at is not None and not self.rows else set()))
        self.taken = {row["step"] for row in self.rows}
        self.document = dict(format=FORMAT, model_config=model_config, probe=probe, probe_ids=probe_ids,
                             steps=self.steps)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.train_losses = {}  # step -> the train loss of a frame whose validation loss is not measured yet

    def due(self, step):
        """Whether a frame is to be taken at `step`."""
        return step in self.steps and step not in self.taken

    def take(self, step, train_loss):
        """Mark the frame of `step` as taken, with the mean training loss since the frame before (training
        thread)."""
        self.taken.add(step)
        self.train_losses[step] = train_loss

    def add(self, step, val_loss, arrays):
        """Hand frame `step`'s weights (`saving.weights_by_layer`) and its row to the writer, then the index."""
        self.rows.append(dict(step=step, train_loss=self.train_losses.pop(step), val_loss=val_loss,
                              file=frame_file(step)))
        self.rows.sort(key=lambda row: row["step"])
        self.writer.write(self.folder / frame_file(step), lambda path: _write_arrays(path, arrays), sync=False)
        document = json.dumps({**self.document, "frames": self.rows}, indent=1)
        self.writer.write(self.index, lambda path: path.write_text(document), sync=False)


def _write_arrays(path, arrays):
    with open(path, "wb") as file:
        np.savez(file, **arrays)
