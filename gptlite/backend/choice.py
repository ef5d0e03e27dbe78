"""Which Keras backend a command gets when it names none: the fastest on this machine for what it does, from
side-by-side runs. Plain Python over `machine` (the CPU's instructions, a GPU, what is installed, a choice made
already) and the model file: it runs before Keras is imported, as Keras fixes its backend then.

Writing (generate, chat, serve, eval; BENCHMARKS.md, "Which backend writes"): JAX on a CPU, for a model that
computes in float32. JAX's decoding step of a float32 model is faster than TensorFlow's on each CPU measured
(1.2-2x), and a process starts writing sooner under it, as importing Keras with JAX takes half the time it takes
with TensorFlow. A model that computes in bfloat16 (trained with precision bf16, which its file keeps) decodes
slower under JAX than under TensorFlow, and stays on TensorFlow; so does anything on a GPU, which was not measured.

Training (benchmarks/journal.md, "Training on each CPU"): fp32 training is fastest under TensorFlow (XLA) on
every CPU measured, so it stays the default. bf16 training on a CPU with bfloat16 instructions (AVX-512 BF16 or
AMX) takes about half the time under torch that it takes under TensorFlow, whose XLA gains nothing from bf16 on a
CPU. So a bf16 run on such a CPU, with no GPU, goes to torch where torch is installed.
"""

import os

from gptlite.backend import machine
from gptlite.errors import InputError
from gptlite.files import saved_dtype_policy

# The backends gptlite runs on, by Keras's name, each with the extra of gptlite's that installs it (TensorFlow is
# installed with gptlite itself).
BACKEND_EXTRAS = {"tensorflow": "", "jax": "[jax]", "torch": "[torch]"}
BACKENDS = tuple(BACKEND_EXTRAS)
WRITING_WHY = "the fastest for writing on a CPU"
BF16_FLAGS = ("avx512_bf16", "amx_bf16")


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
    if model_path is not None and "bfloat16" in (saved_dtype_policy(model_path) or ""):
        return None, None
    return "jax", WRITING_WHY


def training_backend(precision, environment=None, cpu_flags=None, gpu=None, installed=None):
    """(backend, reason) for a training run in `precision` ("fp32", "bf16" or "fp16") that names no backend: the
    backend to set, or None to leave Keras's default; and why, for the user, or None when there is nothing to say.

    The machine's facts default to this machine's; `environment` to os.environ, whose KERAS_BACKEND is a choice
    made already, as is a keras.json that names a backend other than tensorflow (the one Keras writes itself).
    """
    environment = os.environ if environment is None else environment
    if machine.backend_chosen(environment):
        return None, None
    if precision != "bf16":
        return None, None
    flags = machine.cpu_flags() if cpu_flags is None else set(cpu_flags)
    has_bf16 = [flag for flag in BF16_FLAGS if flag in flags]
    if not has_bf16 or (machine.has_gpu(environment) if gpu is None else gpu):
        return None, None
    if not (machine.installed("torch") if installed is None else "torch" in installed):
        return None, ("bf16 training on this CPU runs about twice as fast under torch, which is not installed "
                      f"({install_line('torch')})")
    return "torch", f"the fastest for bf16 training on a CPU with {' and '.join(has_bf16)}"


def install_line(backend):
    """How to install `backend` with gptlite, for a user who asked for it without it."""
    extra = BACKEND_EXTRAS[backend]
    return f"pip install \"gptlite{extra}\", or pip install -e \".{extra}\" in a checkout"


def check_running(requested):
    """Refuse a `requested` backend other than the one Keras runs: Keras fixes its backend when it is first
    imported, so asking later is too late."""
    import keras

    if requested and keras.backend.backend() != requested:
        raise InputError(
            f"`backend={requested}` came too late: Keras is already running on {keras.backend.backend()} "
            f"in this process; set KERAS_BACKEND={requested} before importing Keras"
        )
