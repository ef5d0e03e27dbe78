"""Running one measurement in a child process, for the benchmarks that compare Keras backends.

A Keras backend is fixed for the life of a process, so each backend's
measurement runs in a process of its own and prints its results as one JSON
line, last.
"""

import json
import pathlib
import resource
import statistics
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent


def run_child(label, command, env, python=sys.executable):
    """Run `command` (after the Python interpreter `python`) in this folder; its last line of output as a dict.

    A child that fails stops the benchmark with `label` and the end of its error output.
    """
    child = subprocess.run([python, *command], env=env, capture_output=True, text=True, cwd=HERE)
    if child.returncode:
        sys.exit(f"{label} failed:\n{child.stderr[-3000:]}")
    return json.loads(child.stdout.splitlines()[-1])


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


def peak_rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kilobytes on Linux
