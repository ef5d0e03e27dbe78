"""What a command knows of its machine before Keras starts: the CPU's instruction sets, a GPU, what is installed,
and whether the user has chosen a backend already. Plain Python that reads files: Keras fixes its backend when it
is first imported, so the choice (training's, writing's) is made from these first."""

import importlib.util
import json
import os
import pathlib

# The peak that nanoGPT measures MFU against, on any GPU: an A100's bfloat16 matmuls, in FLOPs per second.
A100_PEAK_FLOPS = 312e12


def cpu_flags():
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


def installed(module):
    """Whether `module` can be imported (found, not imported)."""
    return importlib.util.find_spec(module) is not None


def backend_chosen(environment=None):
    """Whether the user has chosen a backend already: KERAS_BACKEND, or a keras.json (~/.keras's, or KERAS_HOME's)
    naming one other than tensorflow (the one Keras writes there itself)."""
    environment = os.environ if environment is None else environment
    return bool(environment.get("KERAS_BACKEND")) or _keras_json_backend(environment) not in (None, "tensorflow")


def _keras_json_backend(environment):
    home = environment.get("KERAS_HOME") or pathlib.Path.home() / ".keras"
    try:
        return json.loads((pathlib.Path(home) / "keras.json").read_text(encoding="utf-8")).get("backend")
    except (OSError, ValueError, AttributeError):
        return None
