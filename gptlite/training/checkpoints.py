"""Checkpoints: a run's weights, optimizer state and progress, saved so that it can resume exactly.

A checkpoint is a snapshot of one step, copied off the device at that step
and written on a `training.background.FileWriter`'s thread while training goes on.
"""

import dataclasses
import json
import math
import pathlib
import warnings

import keras
import numpy as np

from gptlite.errors import InputError
from gptlite.model.layers import layers_within
from gptlite.training.run_folder import (  # noqa: F401 (the names of its files, where they were)
    CHECKPOINT, CHECKPOINT_FILES, FORMAT_1_ADAPTERS, FORMAT_1_STATE, FORMAT_1_WEIGHTS)

CHECKPOINT_FORMAT = 2


@dataclasses.dataclass
class RunState:
    """What a run has done so far; saved with each checkpoint."""

    step: int = 0
    rows: list = dataclasses.field(default_factory=list)  # one per evaluation
    best_val_loss: float = math.inf
    loss_sum: float = 0.0  # train loss summed over the steps since the last evaluation
    loss_steps: int = 0
    # The same since the last frame of the run's film (`training.film`).
    frame_loss_sum: float = 0.0
    frame_loss_steps: int = 0


def _seed_states(model):
    # Dropout's random state: Keras does not save it with the weights.
    return [v for v in model.variables if v.path.endswith("seed_generator_state")]


def _adapter_variables(model):
    """Each LoRA layer's frozen kernel and its adapters: a weights file holds only their merged sum, from
    which the frozen kernel and what the adapters learned cannot be told apart again."""
    return [variable for layer in layers_within(model) if getattr(layer, "lora_enabled", False)
            for variable in (layer.kernel, layer.lora_a, layer.lora_b)]


def snapshot(model):
    """Every variable of the model and its optimizer, copied off the device now: what a checkpoint holds of
    this step while training goes on."""
    arrays = {}
    for prefix, variables in (("model", model.variables), ("optimizer", model.optimizer.variables)):
        for index, variable in enumerate(variables):
            # A copy: torch's NumPy view, or a buffer JAX may reuse, would change as training goes on.
            arrays[f"{prefix}_{index}"] = _portable(np.array(keras.ops.convert_to_numpy(variable), copy=True))
    arrays["dtypes"] = np.array([str(variable.dtype) for variable in (*model.variables,
                                                                      *model.optimizer.variables)])
    return arrays


def save_checkpoint(model, arrays, state, config, out_dir, writer, task, on_written=None):
    """Hand a checkpoint of a run of `task` (its name in `tasks.TASKS`) to `writer` (a
    `training.background.FileWriter`): `arrays` (the `snapshot` of its step) and the run's document, serialized now
    from `state` (a RunState as of that step), as one file."""
    document = json.dumps(dict(
        format=CHECKPOINT_FORMAT,
        step=state.step,
        task=task,
        model_config=model.get_config(),
        training_config=dataclasses.asdict(config),
        run_state=dataclasses.asdict(state),
    ), indent=1)

    def write(temporary):
        with open(temporary, "wb") as file:
            np.savez(file, document=np.array(document), **arrays)

    writer.write(pathlib.Path(out_dir) / CHECKPOINT, write, on_written=on_written)


def _portable(array):
    """An array NumPy's archive keeps as it is: a dtype NumPy does not know (bfloat16) goes as its bits."""
    return array if array.dtype.isbuiltin else array.view(f"u{array.dtype.itemsize}")


def read_checkpoint(out_dir):
    """The checkpoint document in `out_dir`, or a `GPTLiteError` saying why there is none."""
    out_dir = pathlib.Path(out_dir)
    if (out_dir / CHECKPOINT).exists():
        try:
            with np.load(out_dir / CHECKPOINT) as saved:
                return json.loads(str(saved["document"]))
        except (OSError, ValueError, KeyError) as error:
            raise InputError(f"cannot read the checkpoint {out_dir / CHECKPOINT}: {error}") from None
    path = out_dir / FORMAT_1_STATE
    if not path.exists():
        raise InputError(f"no checkpoint to resume in {out_dir}; start without `resume=True`")
    try:
        document = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise InputError(f"cannot read the checkpoint {path}: {error}") from None
    if document.get("format") != 1:
        raise InputError(f"{path} was written by another version of gptlite (format "
                         f"{document.get('format')}, this one reads 1 to {CHECKPOINT_FORMAT})")
    if not (out_dir / FORMAT_1_WEIGHTS).exists():
        raise InputError(f"no checkpoint to resume in {out_dir}; start without `resume=True`")
    return document


def restore_checkpoint(model, out_dir):
    """Give the model and its (built) optimizer the checkpoint's variables; the run's state to go on from."""
    out_dir = pathlib.Path(out_dir)
    document = read_checkpoint(out_dir)
    if document.get("format") == CHECKPOINT_FORMAT:
        _restore_variables(model, out_dir)
        return RunState(**document["run_state"])
    if document.get("format") != 1:
        raise InputError(f"{out_dir / CHECKPOINT} was written by another version of gptlite (format "
                         f"{document.get('format')}, this one reads 1 to {CHECKPOINT_FORMAT})")
    _restore_format_1(model, out_dir, document)
    state = RunState(**document["run_state"])
    # Format 1's weights may be one checkpoint newer than its document if a kill fell between the two
    # writes: trust the optimizer's own step count.
    state.step = int(keras.ops.convert_to_numpy(model.optimizer.iterations))
    state.rows = [row for row in state.rows if row["step"] <= state.step]
    return state


def _restore_variables(model, out_dir):
    misfit = InputError(f"the model or optimizer state in the checkpoint in {out_dir} does not fit this run's "
                        f"(written by another version of gptlite?); start a new run without `resume=True`")
    try:
        with np.load(out_dir / CHECKPOINT) as saved:
            variables = (*model.variables, *model.optimizer.variables)
            names = [f"model_{index}" for index in range(len(model.variables))] + \
                    [f"optimizer_{index}" for index in range(len(model.optimizer.variables))]
            if set(saved.files) != {*names, "dtypes", "document"}:
                raise misfit
            dtypes = saved["dtypes"]
            values = [saved[name] for name in names]
    except (OSError, ValueError, KeyError) as error:
        raise InputError(f"cannot read the checkpoint {out_dir / CHECKPOINT}: {error}") from None
    for variable, value, dtype in zip(variables, values, dtypes):
        if tuple(value.shape) != tuple(variable.shape):
            raise misfit
        variable.assign(value.view(str(dtype)) if value.dtype != np.dtype(str(dtype)) else value)


def _restore_format_1(model, out_dir, document):
    """A checkpoint of format 1: Keras's weights file with the optimizer's state, the adapters beside it, and
    dropout's random state in the document."""
    with warnings.catch_warnings():
        # Keras only warns when the saved optimizer state does not fit, and
        # leaves the optimizer as it was: checked below.
        warnings.filterwarnings("ignore", message="Skipping variable loading for optimizer")
        model.load_weights(out_dir / FORMAT_1_WEIGHTS)
    if int(keras.ops.convert_to_numpy(model.optimizer.iterations)) < document["step"]:
        raise InputError(f"the optimizer state in the checkpoint in {out_dir} does not fit this run's optimizer "
                         f"(written by another version of gptlite?); start a new run without `resume=True`")
    adapters = _adapter_variables(model)
    if adapters:
        with np.load(out_dir / FORMAT_1_ADAPTERS) as saved:
            for index, variable in enumerate(adapters):
                variable.assign(saved[f"arr_{index}"])
    for variable, value in zip(_seed_states(model), document["seed_states"]):
        variable.assign(np.asarray(value, dtype=variable.dtype))
