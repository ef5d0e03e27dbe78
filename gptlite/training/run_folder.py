"""A run's folder: the names of what a run writes there, and whether a new run may start in it. Plain Python (no
Keras), so that a command refuses a folder at once, before the backend starts."""

import os

from gptlite.errors import InputError, RunExistsError
from gptlite.inside import FILM_FOLDER, FILM_INDEX  # noqa: F401 (the names of its files, with the rest)

MODEL_FILE = "model.keras"
# One file: every variable of the model and of its optimizer as it is (adapters and frozen kernels apart,
# dropout's random state included), in their order, and the run's document (step, settings, history), all
# copied at one step; a NumPy archive.
CHECKPOINT = "checkpoint.npz"
# What checkpoints of format 1 held: the document, Keras's weights file (LoRA layers merged) and the adapters.
FORMAT_1_STATE = "checkpoint.json"
FORMAT_1_WEIGHTS = "checkpoint.weights.h5"
FORMAT_1_ADAPTERS = "checkpoint.adapters.npz"
CHECKPOINT_FILES = (CHECKPOINT, FORMAT_1_STATE, FORMAT_1_WEIGHTS, FORMAT_1_ADAPTERS)
# What shows that a folder holds a run: its model, a checkpoint of either format, or a film.
A_RUN = (MODEL_FILE, CHECKPOINT, FORMAT_1_STATE, FILM_INDEX)


def holds_a_run(out_dir):
    """Whether the folder `out_dir` holds a run (a model or a checkpoint)."""
    return any((out_dir / name).exists() for name in A_RUN)


def check_folder(out_dir, overwrite):
    """Refuse an `out_dir` that holds a run (unless told to replace it), or that cannot be written to.

    Nothing is made: a run makes its folder once its text and settings have passed.
    """
    if out_dir.exists() and not out_dir.is_dir():
        raise InputError(f"`out_dir` {out_dir} is a file, not a folder")
    existing = [out_dir / name for name in A_RUN if (out_dir / name).exists()]
    if existing and not overwrite:
        raise RunExistsError(f"{existing[0]} already exists; set `resume=True` to continue that run, "
                             f"`overwrite=True` to replace it, or choose another `out_dir`")
    nearest = next(folder for folder in (out_dir, *out_dir.absolute().parents) if folder.exists())
    if not nearest.is_dir():
        raise InputError(f"cannot write to `out_dir` {out_dir}: {nearest} is a file")
    if not os.access(nearest, os.W_OK | os.X_OK):
        raise InputError(f"cannot write to `out_dir` {out_dir}: permission denied")
