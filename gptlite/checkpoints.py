"""Checkpoints: a run's weights, optimizer state and progress, saved so that it can resume exactly."""

import dataclasses
import json
import math
import pathlib
import warnings

import keras
import numpy as np

from gptlite.errors import InputError
from gptlite.files import atomic_path

CHECKPOINT_WEIGHTS = "checkpoint.weights.h5"
# The raw kernels and LoRA matrices of layers with adapters, which the weights file holds only merged.
CHECKPOINT_ADAPTERS = "checkpoint.adapters.npz"
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


def _seed_states(model):
    # Dropout's random state: Keras does not save it with the weights.
    return [v for v in model.variables if v.path.endswith("seed_generator_state")]


def _adapter_variables(model):
    """Each LoRA layer's frozen kernel and its adapters: a weights file holds only their merged sum, from
    which the frozen kernel and what the adapters learned cannot be told apart again."""
    return [variable for layer in model._flatten_layers() if getattr(layer, "lora_enabled", False)
            for variable in (layer.kernel, layer.lora_a, layer.lora_b)]


def save_checkpoint(model, state, config, out_dir):
    """Weights with optimizer state, then the run's state; each file replaced atomically."""
    with atomic_path(out_dir / CHECKPOINT_WEIGHTS) as temporary:
        model.save_weights(temporary)
    adapters = _adapter_variables(model)
    if adapters:
        with atomic_path(out_dir / CHECKPOINT_ADAPTERS) as temporary, open(temporary, "wb") as file:
            np.savez(file, *(keras.ops.convert_to_numpy(variable) for variable in adapters))
    document = dict(
        format=CHECKPOINT_FORMAT,
        step=state.step,
        model_class=type(model).__name__,
        model_config=model.get_config(),
        training_config=dataclasses.asdict(config),
        run_state=dataclasses.asdict(state),
        seed_states=[keras.ops.convert_to_numpy(v).tolist() for v in _seed_states(model)],
    )
    with atomic_path(out_dir / CHECKPOINT_STATE) as temporary:
        temporary.write_text(json.dumps(document, indent=1))


def read_checkpoint(out_dir):
    """The checkpoint document in `out_dir`, or a `GPTLiteError` saying why there is none."""
    path = pathlib.Path(out_dir) / CHECKPOINT_STATE
    if not path.exists() or not (path.parent / CHECKPOINT_WEIGHTS).exists():
        raise InputError(f"no checkpoint to resume in {out_dir}; start without `resume=True`")
    try:
        document = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise InputError(f"cannot read the checkpoint {path}: {error}") from None
    if document.get("format") != CHECKPOINT_FORMAT:
        raise InputError(f"{path} was written by another version of gptlite (format "
                         f"{document.get('format')}, this one reads {CHECKPOINT_FORMAT})")
    return document


def restore_checkpoint(model, out_dir):
    document = read_checkpoint(out_dir)
    with warnings.catch_warnings():
        # Keras only warns when the saved optimizer state does not fit, and
        # leaves the optimizer as it was: checked below.
        warnings.filterwarnings("ignore", message="Skipping variable loading for optimizer")
        model.load_weights(pathlib.Path(out_dir) / CHECKPOINT_WEIGHTS)
    if int(keras.ops.convert_to_numpy(model.optimizer.iterations)) < document["step"]:
        raise InputError(f"the optimizer state in the checkpoint in {out_dir} does not fit this run's optimizer "
                         f"(written by another version of gptlite?); start a new run without `resume=True`")
    adapters = _adapter_variables(model)
    if adapters:
        with np.load(pathlib.Path(out_dir) / CHECKPOINT_ADAPTERS) as saved:
            for index, variable in enumerate(adapters):
                variable.assign(saved[f"arr_{index}"])
    for variable, value in zip(_seed_states(model), document["seed_states"]):
        variable.assign(np.asarray(value, dtype=variable.dtype))
    state = RunState(**document["run_state"])
    # The weights may be one checkpoint newer than the state if a kill fell
    # between the two writes: trust the optimizer's own step count.
    state.step = int(keras.ops.convert_to_numpy(model.optimizer.iterations))
    state.rows = [row for row in state.rows if row["step"] <= state.step]
    return state
