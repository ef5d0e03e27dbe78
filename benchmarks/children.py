"""Running one measurement in a child process, for the benchmarks that compare Keras backends.

A Keras backend is fixed for the life of a process, so each backend's
measurement runs in a process of its own and prints its results as one JSON
line, last.
"""

import json
import os
import pathlib
import resource
import statistics
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
# What would name a compile cache for a process: a new user has none of them.
NAMES_A_CACHE = ("GPTLITE_COMPILE_CACHE", "TF_XLA_FLAGS", "JAX_COMPILATION_CACHE_DIR")


def new_machine(home):
    """This process's environment as on a machine that never ran gptlite: `home` (made if missing) for the home
    and cache folders, and no compile cache named."""
    pathlib.Path(home).mkdir(parents=True, exist_ok=True)
    environment = {name: value for name, value in os.environ.items() if name not in NAMES_A_CACHE}
    environment.update(HOME=str(home), XDG_CACHE_HOME=str(pathlib.Path(home) / ".cache"))
    return environment


def run_child(label, command, env, python=sys.executable):
    """Run `command` (after the Python interpreter `python`) in this folder; its last line of output as a dict.

    A child that fails stops the benchmark with `label` and the end of its error output.
    """
    child = subprocess.run([python, *command], env=env, capture_output=True, text=True, cwd=HERE)
    if child.returncode:
        sys.exit(f"{label} failed:\n{child.stderr[-3000:]}")
    return json.loads(child.stdout.splitlines()[-1])


def in_turns(names, rounds, run, file=sys.stdout):
    """Each name's results over `rounds` rounds, {name: [result, ...]}.

    Every round calls `run(name, round_index)` (a dict of figures) for each
    name in turn, so that the machine's noise hits them all alike; each
    result is printed to `file` as it comes.
    """
    results = {name: [] for name in names}
    for round_index in range(rounds):
        for name in names:
            result = run(name, round_index)
            results[name].append(result)
            label = " ".join(name) if isinstance(name, tuple) else name
            figures = ", ".join(f"{key} {value:.4g}" for key, value in result.items()
                                if isinstance(value, (int, float)))
            print(f"round {round_index + 1}, {label}: {figures}", file=file, flush=True)
    return results


def medians(results, keys):
    """{name: {key: its median over the rounds}} of `in_turns`' results."""
    return {name: {key: statistics.median(run[key] for run in runs) for key in keys} for name, runs in results.items()}


def time_calls(call, repeats):
    """(seconds of a first, cold call, the median seconds of `repeats` calls after it, the first call's result)."""
    start = time.perf_counter()
    result = call()
    cold = time.perf_counter() - start
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return cold, statistics.median(times), result


def time_steps(step, steps, warmup_steps=2):
    """ms per call of `step` over `steps` calls after `warmup_steps`, and the process's peak RSS by then."""
    for _ in range(warmup_steps):
        step()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return {"ms_per_step": 1000 * (time.perf_counter() - start) / steps, "peak_rss_mb": peak_rss_mb()}


def time_training(model, config, vocabulary_size, warmup_steps):
    """Optimizer steps of a built gptlite model under `gptlite.training.fit.train`, as a fine-tuning run takes them,
    on random token ids: ms per step after `warmup_steps` (which include compiling), its trained parameters, and
    the process's peak RSS by the last step (the evaluation and the saving of model.keras that end the run come
    after). `config` is a `TrainingConfig` of `warmup_steps` + the steps to time."""
    import tempfile

    import keras
    import numpy as np

    from gptlite.training import fit

    ids = np.random.default_rng(0).integers(0, vocabulary_size, 200_000).astype(np.uint16)
    times, peaks = [], []

    class Timer(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            times.append(time.perf_counter())
            peaks.append(peak_rss_mb())

    with tempfile.TemporaryDirectory() as out:
        fit.train(model, ids, ids[:5000], config, out, verbose=0, callbacks=[Timer()])
    steady = times[warmup_steps - 1:]
    trainable = sum(int(np.prod(w.shape)) for w in model.trainable_weights)
    return {"ms_per_step": 1000 * (steady[-1] - steady[0]) / (len(steady) - 1), "trainable": trainable,
            "peak_rss_mb": peaks[-1]}


def cpu_ticks():
    """The machine's CPU time so far from /proc/stat, in ticks: (all of it, the part of it "stolen", that the
    hypervisor of a virtual machine gave to other machines while this one had work); (0, 0) without /proc/stat."""
    try:
        with open("/proc/stat") as file:
            fields = [int(value) for value in file.readline().split()[1:9]]
    except (OSError, ValueError):
        return 0, 0
    return sum(fields), fields[7]  # user nice system idle iowait irq softirq steal


def stolen_share(before):
    """The share of the machine's CPU time stolen since `before` (a `cpu_ticks()`): on a shared host, figures
    measured while it is high are slower by about that much, and noisier."""
    total, stolen = cpu_ticks()
    return round((stolen - before[1]) / max(1, total - before[0]), 3)


def peak_rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kilobytes on Linux
