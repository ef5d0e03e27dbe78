"""Starting a command's backend: `--backend` before Keras is imported, and Keras without its native notices.

Keras fixes its backend when it is first imported, so nothing here imports
it at module level, and neither does any command's parser: `--help` answers
at once, with no notice of the backend's.
"""

import argparse
import importlib.util
import os
import sys
import threading

from gptlite.errors import GPTLiteError, InputError
from gptlite.notices import NATIVE_LOG_LINE, is_start_up_notice, quiet  # noqa: F401 (quiet: the commands; is_start_up_notice: the tests)

BACKENDS = ("tensorflow", "jax", "torch")


def choose_backend(prog, argv, automatic=None):
    """Put `--backend NAME` from argv into KERAS_BACKEND; exit with a one-line error if NAME is not installed.

    With no backend named, `automatic(argv)` (where the command has one) gives (backend or None, a line to print
    or None): the backend that runs the command fastest here. Must run before Keras is imported; the command's
    own parser checks the flag again.
    """
    reader = argparse.ArgumentParser(add_help=False, exit_on_error=False)
    reader.add_argument("--backend")
    try:
        known, _ = reader.parse_known_args(argv)
    except argparse.ArgumentError:
        return  # `--backend` with no name: the command's own parser says so
    if known.backend is None:
        known.backend = _run_config_backend(argv)
    if known.backend is None and automatic is not None and "keras" not in sys.modules:
        known.backend, why = automatic(argv)
        if why:
            print(why, flush=True)
    if known.backend not in BACKENDS or "keras" in sys.modules:
        return  # none given, a wrong name (the command's parser reports it), or too late (check_backend says so)
    if importlib.util.find_spec(known.backend) is None:
        extra = "" if known.backend == "tensorflow" else f"[{known.backend}]"
        sys.exit(f"{prog}: error: --backend {known.backend} needs {known.backend} installed "
                 f"(pip install \"gptlite{extra}\", or pip install -e \".{extra}\" in a checkout)")
    os.environ["KERAS_BACKEND"] = known.backend


def choose_compile_cache(argv):
    """Keep the command's compiled programs where `--compile-cache DIR` says, nowhere with `--no-compile-cache`,
    or else in the default folder: before Keras starts, since TensorFlow reads where its compiled programs go
    once, at its start (see gptlite.compile_cache)."""
    from gptlite import compile_cache

    reader = argparse.ArgumentParser(add_help=False, exit_on_error=False)
    reader.add_argument("--compile-cache", default=None)
    reader.add_argument("--no-compile-cache", action="store_true")
    try:
        known, _ = reader.parse_known_args(argv)
    except argparse.ArgumentError:
        return  # `--compile-cache` with no folder: the command's own parser says so
    if known.no_compile_cache:
        compile_cache.use(None)
    elif known.compile_cache:
        compile_cache.use(known.compile_cache)
    else:
        compile_cache.use()


def _run_config_backend(argv):
    """The backend a `--config FILE` names, if any; a file that cannot be read is reported later."""
    from gptlite import run_config

    reader = argparse.ArgumentParser(add_help=False, exit_on_error=False)
    reader.add_argument("--config")
    try:
        known, _ = reader.parse_known_args(argv)
        return known.config and run_config.read_run_config(known.config).backend
    except (argparse.ArgumentError, GPTLiteError):
        return None


_holding_back = False  # whether hold_back_false_alarms has rearranged this process's standard error


# What TensorFlow logs as errors about the compile cache's entries that are none (see is_false_alarm).
FALSE_ALARMS = ("Loading XLA:CPU AOT result. Target machine feature",
                "Error parsing text-format tensorflow.XlaSerializedCacheEntry")


def is_false_alarm(line):
    """Whether a line of the backend's native log is an error that TensorFlow logs about a sound entry of the
    compile cache, which it then uses:

    - XLA's refusal of its own cached program's CPU features: each time it
      loads a program on a CPU whose tuning flags (such as
      +prefer-no-gather) it counts as features the CPU lacks, although the
      program was compiled on this very CPU. The cache folder is per kind of
      CPU (gptlite.compile_cache), so the warning never applies to ours.
    - A failed text-format parse of an entry: TensorFlow reads each entry as
      text first and then as the binary it is (ReadTextOrBinaryProto), and
      the text parser logs its failure.
    """
    native = NATIVE_LOG_LINE.fullmatch(line)
    return bool(native) and native.group(2).startswith(FALSE_ALARMS) \
        and not os.environ.get("TF_CPP_MIN_LOG_LEVEL", "0").strip() in ("", "0")


def is_held_back(line):
    """Whether `hold_back_false_alarms` drops a line that native code writes once a command runs."""
    return is_false_alarm(line) or is_start_up_notice(line)


def hold_back_false_alarms():
    """From here on, drop `is_false_alarm` lines from what native code writes to standard error, and the
    start-up notices `quiet` holds back: under another backend, TensorFlow starts later, when Keras seeds
    every installed library's generator (`keras.utils.set_random_seed`).

    Native code writes to file descriptor 2, which becomes a pipe read by a
    thread that passes every other line on. Python's own sys.stderr keeps
    writing to the terminal directly, so that a command's last error line is
    never held in the pipe when the process ends. Once a process.
    """
    global _holding_back
    if _holding_back:
        return
    _holding_back = True
    sys.stderr.flush()
    terminal = os.dup(2)
    read, write = os.pipe()
    os.dup2(write, 2)
    os.close(write)
    sys.stderr = open(terminal, "w", buffering=1, encoding=sys.stderr.encoding, errors="backslashreplace",
                      closefd=False)

    def pass_on():
        with open(read, "rb") as native:
            for line in native:
                if not is_held_back(line.decode(errors="replace").rstrip("\n")):
                    os.write(terminal, line)

    threading.Thread(target=pass_on, name="gptlite-native-log", daemon=True).start()


def check_backend(requested):
    """`--backend` takes effect before Keras is imported; here it can only be checked."""
    import keras

    if requested and keras.backend.backend() != requested:
        raise InputError(
            f"`backend={requested}` came too late: Keras is already running on {keras.backend.backend()} "
            f"in this process; set KERAS_BACKEND={requested} before importing Keras"
        )
