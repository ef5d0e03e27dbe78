"""Running one measurement in a child process, for the benchmarks that compare Keras backends.

A Keras backend is fixed for the life of a process, so each backend's
measurement runs in a process of its own and prints its results as one JSON
line, last.
"""

import json
import pathlib
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent


def run_child(label, command, env):
    """Run `command` (after the Python interpreter) in this folder; its last line of output as a dict.

    A child that fails stops the benchmark with `label` and the end of its error output.
    """
    child = subprocess.run([sys.executable, *command], env=env, capture_output=True, text=True, cwd=HERE)
    if child.returncode:
        sys.exit(f"{label} failed:\n{child.stderr[-3000:]}")
    return json.loads(child.stdout.splitlines()[-1])
