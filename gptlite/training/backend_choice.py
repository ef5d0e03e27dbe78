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

from gptlite.backend import machine
from gptlite.training import settings

BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def training_backend(precision, environment=None, cpu_flags=None, gpu=None, installed=None):
    """(backend, reason) for a training run in `precision` that names no backend: the backend to set, or None to
    leave Keras's default; and why, for the user, or None when there is nothing to say.

    The machine's facts default to this machine's; `environment` to os.environ, whose KERAS_BACKEND is a choice
    made already, as is a keras.json that names a backend other than tensorflow (the one Keras writes itself).
    """
    environment = os.environ if environment is None else environment
    if machine.backend_chosen(environment):
        return None, None
    if (precision or settings.TrainingConfig.precision) != "bf16":
        return None, None
    flags = machine.cpu_flags() if cpu_flags is None else set(cpu_flags)
    has_bf16 = [flag for flag in BF16_FLAGS if flag in flags]
    if not has_bf16 or (machine.has_gpu(environment) if gpu is None else gpu):
        return None, None
    if not (machine.installed("torch") if installed is None else "torch" in installed):
        return None, ("bf16 training on this CPU runs about twice as fast under torch, which is not installed "
                      "(pip install \"gptlite[torch]\")")
    return "torch", f"the fastest for bf16 training on a CPU with {' and '.join(has_bf16)}"

