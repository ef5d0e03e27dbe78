"""Which Keras backend trains fastest on this machine, for a run that names none.

From side-by-side runs on each CPU in benchmarks/journal.md ("Training on each CPU"):
fp32 training is fastest under TensorFlow (XLA) on every CPU measured, so it
stays the default. bf16 training on a CPU with bfloat16 instructions (AVX-512
BF16 or AMX) takes about half the time under torch that it takes under
TensorFlow, whose XLA gains nothing from bf16 on a CPU. So a bf16 run on
such a CPU, with no GPU, goes to torch where torch is installed. Everything
here is plain Python that reads files: it runs before Keras is imported, as
Keras fixes its backend then.
"""

import os
import pathlib

from gptlite.training import settings

BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def training_backend(precision, environment=None, cpu_flags=None, gpu=None, installed=None):
    """(backend, reason) for a training run in `precision` that names no backend: the backend to set, or None to
    leave Keras's default; and why, for the user, or None when there is nothing to say.

    The machine's facts default to this machine's; `environment` to os.environ, whose KERAS_BACKEND is a choice
    made already, as is a keras.json that names a backend other than tensorflow (the one Keras writes itself).
    """
    environment = os.environ if environment is None else environment
    if environment.get("KERAS_BACKEND") or _keras_json_backend(environment) not in (None, "tensorflow"):
        return None, None
    if (precision or settings.TrainingConfig.precision) != "bf16":
        return None, None
    flags = this_cpu_flags() if cpu_flags is None else set(cpu_flags)
    has_bf16 = [flag for flag in BF16_FLAGS if flag in flags]
    if not has_bf16 or (has_gpu(environment) if gpu is None else gpu):
        return None, None
    if not (_installed("torch") if installed is None else "torch" in installed):
        return None, ("bf16 training on this CPU runs about twice as fast under torch, which is not installed "
                      "(pip install \"gptlite[torch]\")")
    return "torch", f"the fastest for bf16 training on a CPU with {' and '.join(has_bf16)}"


def this_cpu_flags():
    """The instruction-set flags of this machine's first CPU in /proc/cpuinfo (Linux); empty elsewhere."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as info:
            for line in info:
                name, _, value = line.partition(":")
                if name.strip() == "flags":
                    return set(value.split())
    except OSError:
        pass
    return set()


def has_gpu(environment=None):
    """Whether a GPU's driver shows a device that the environment does not hide (NVIDIA's, or AMD's ROCm)."""
    environment = os.environ if environment is None else environment
    if environment.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return False
    return pathlib.Path("/dev/nvidia0").exists() or pathlib.Path("/dev/kfd").exists()


def _installed(module):
    import importlib.util

    return importlib.util.find_spec(module) is not None


def _keras_json_backend(environment):
    """The backend ~/.keras/keras.json (or KERAS_HOME's) names, if any."""
    import json

    home = environment.get("KERAS_HOME") or pathlib.Path.home() / ".keras"
    try:
        return json.loads((pathlib.Path(home) / "keras.json").read_text(encoding="utf-8")).get("backend")
    except (OSError, ValueError, AttributeError):
        return None
