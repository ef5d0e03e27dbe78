"""Which Keras backend writes fastest on this machine, for a command that writes (generate, chat, serve, eval) and
names none: JAX on a CPU, for a model that computes in float32.

From side-by-side runs (BENCHMARKS.md, "Which backend writes"): on each CPU measured, JAX's decoding step of a
float32 model is faster than TensorFlow's (1.2-2x), and a process starts writing sooner under it, as importing
Keras with JAX takes half the time it takes with TensorFlow. A model that computes in bfloat16 (trained with
precision bf16, which its file keeps) decodes slower under JAX than under TensorFlow, and stays on TensorFlow; so
does anything on a GPU, which was not measured. Plain Python that reads files: it runs before Keras is imported,
as Keras fixes its backend then.
"""

import json
import os
import zipfile

from gptlite.backend import machine

WHY = "the fastest for writing on a CPU"


def writing_backend(model_path=None, environment=None, gpu=None, installed=None):
    """(backend, reason) for a command that writes with the model file at `model_path` and names no backend: the
    backend to set, or None to leave Keras's default; and why, for the user, or None when there is nothing to say.

    The machine's facts default to this machine's; `environment` to os.environ, whose KERAS_BACKEND is a choice
    made already, as is a keras.json that names a backend other than tensorflow. `installed`: the modules that
    can be imported (default: looked up).
    """
    environment = os.environ if environment is None else environment
    if machine.backend_chosen(environment):
        return None, None
    if (machine.has_gpu(environment) if gpu is None else gpu):
        return None, None
    if not (machine.installed("jax") if installed is None else "jax" in installed):
        return None, None
    if model_path is not None and "bfloat16" in (saved_policy(model_path) or ""):
        return None, None
    return "jax", WHY


def saved_policy(model_path):
    """The name of the dtype policy a .keras file's model computes in ("float32", "mixed_bfloat16", ...), read
    from its config.json without Keras; None where the file cannot be read so (the command then says why)."""
    try:
        with zipfile.ZipFile(model_path) as archive:
            config = json.loads(archive.read("config.json"))
        return config["config"]["dtype"]["config"]["name"]
    except (OSError, KeyError, TypeError, ValueError, zipfile.BadZipFile):
        return None
