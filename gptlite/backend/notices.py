"""The backend's native notices: what TensorFlow's C++ code writes to standard error as it starts.

    import gptlite
    gptlite.quiet()   # before Keras is imported: Keras starts without TensorFlow's start-up notices

Importing gptlite changes nothing in the process: no environment variable,
no log level. The commands quiet their own process (they call `quiet`); a
Python program that wants the same calls it itself, after choosing its
backend (KERAS_BACKEND) and before it imports Keras.
"""

import contextlib
import os
import re
import sys
import tempfile
import threading

# A line in Abseil's log format, as TensorFlow's C++ code writes it: severity, date, time, thread, file:line].
NATIVE_LOG_LINE = re.compile(r"([IWEF])\d{4} [\d:.]+ +\d+ \S+:\d+\] (.*)")


def quiet():
    """Keep TensorFlow's informational and warning notices out of this process's standard error: its C++ log
    level (TF_CPP_MIN_LOG_LEVEL) becomes 2, errors only, unless already set, and Keras starts with the notices
    TensorFlow writes before that level applies held back (see `start_keras`). Call it before importing Keras;
    after, it only sets the level. A user's own TF_CPP_MIN_LOG_LEVEL (0 shows everything) is kept."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    start_keras()


def start_keras():
    """Import Keras and start its backend with the backend's native start-up notices held back.

    Loading TensorFlow, its C++ code writes notices straight to the process's
    standard error ("oneDNN custom operations are on", "Could not find cuda
    drivers", and on a machine without a CUDA driver "failed call to cuInit",
    as an error), some before TF_CPP_MIN_LOG_LEVEL applies to them; they
    would bury a command's one-line error or its progress. Lines of that log
    format below TF_CPP_MIN_LOG_LEVEL's severity (`quiet` and the commands set 2: errors)
    are dropped, and so is the failed cuInit unless the level is 0;
    everything else is written out as it came. Must run before anything
    imports Keras.
    """
    if "keras" in sys.modules:
        return
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            import keras

            if keras.backend.backend() == "tensorflow":
                import tensorflow as tf

                from gptlite.backend import compile_cache

                # Before TensorFlow looks for its devices, when it reads where XLA keeps its programs.
                compile_cache.start("tensorflow")

                tf.config.list_physical_devices()  # where TensorFlow looks for a GPU and logs not finding one
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            shown = [line for line in captured.read().decode(errors="replace").splitlines()
                     if not is_start_up_notice(line)]
            if shown:
                print("\n".join(shown), file=sys.stderr)


def is_start_up_notice(line):
    """Whether a line of the backend's native log is a start-up notice that `start_keras` holds back."""
    try:
        least_shown = int(os.environ.get("TF_CPP_MIN_LOG_LEVEL", "0"))
    except ValueError:
        least_shown = 0
    if least_shown <= 0:
        return False  # asked for everything
    if line.startswith("WARNING: All log messages before absl::InitializeLog() is called"):
        return True
    native = NATIVE_LOG_LINE.fullmatch(line)
    if not native:
        return False
    severity, message = native.groups()
    return "IWEF".index(severity) < least_shown or message.startswith("failed call to cuInit")


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
        and os.environ.get("TF_CPP_MIN_LOG_LEVEL", "").strip() != "0"  # 0: a user asks for everything


_holding = 0  # how many false_alarms_held_back are open, in all threads
_holding_lock = threading.Lock()
_held = None  # while one is open: (standard error's descriptor saved, the file that takes what is written)


@contextlib.contextmanager
def false_alarms_held_back():
    """While open, what the process writes to standard error waits in a file; when the last one open in any thread
    closes, it is written out, but for `is_false_alarm` lines. Around the first run of a program that may come from
    the compile cache, for a Python program that has no filter of its own (the commands have theirs)."""
    global _holding, _held
    with _holding_lock:
        if _holding == 0:
            sys.stderr.flush()
            captured = tempfile.TemporaryFile()
            _held = (os.dup(2), captured)
            os.dup2(captured.fileno(), 2)
        _holding += 1
    try:
        yield
    finally:
        with _holding_lock:
            _holding -= 1
            if _holding == 0:
                sys.stderr.flush()
                saved, captured = _held
                _held = None
                os.dup2(saved, 2)
                os.close(saved)
                captured.seek(0)
                shown = [line for line in captured.read().decode(errors="replace").splitlines()
                         if not is_false_alarm(line)]
                captured.close()
                if shown:
                    print("\n".join(shown), file=sys.stderr, flush=True)
