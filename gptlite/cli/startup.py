"""Starting a command's backend: `--backend` before Keras is imported, and Keras without its native notices.

Keras fixes its backend when it is first imported, so nothing here imports
it at module level, and neither does any command's parser: `--help` answers
at once, with no notice of the backend's.
"""

import faulthandler
import importlib.util
import os
import sys
import threading

from gptlite.backend.choice import BACKENDS, install_line
from gptlite.backend.notices import is_false_alarm, is_start_up_notice, quiet


def choose_backend(prog, backend, automatic=None):
    """Put `backend` (the command's `--backend`, or its run file's) into KERAS_BACKEND; exit with a one-line error
    if it is not installed. Returns the line that says why the backend was chosen, or None.

    With no backend named, `automatic()` (where the command has one) gives (backend or None, a line to print or
    None): the backend that runs the command fastest here. Must run before Keras is imported.
    """
    why = None
    if backend is None and automatic is not None and "keras" not in sys.modules:
        backend, why = automatic()
    if backend not in BACKENDS or "keras" in sys.modules:
        return why  # none given, or too late (backend.choice.check_running says so)
    if importlib.util.find_spec(backend) is None:
        sys.exit(f"{prog}: error: --backend {backend} needs {backend} installed ({install_line(backend)})")
    os.environ["KERAS_BACKEND"] = backend
    return why


class NoteBeforeFirstWords:
    """While open, standard output and standard error write `note` to standard error once, before the first
    words the command writes to either: a run that ends in a mistake before it says anything prints the
    mistake's one line alone, and a run that goes on says first which backend it runs on (a note on the run, on
    standard error, since a writing command's standard output is its text)."""

    def __init__(self, note):
        self.note = note

    def __enter__(self):
        self.streams = sys.stdout, sys.stderr
        if self.note:
            sys.stdout, sys.stderr = (_Noting(stream, self) for stream in self.streams)
        return self

    def __exit__(self, kind, error, trace):
        sys.stdout, sys.stderr = self.streams
        if kind is not None:  # a bug's traceback, or a mistake's under `debug`: said after the note
            self.say()

    def say(self):
        """Write the note now, if it has not been written."""
        note, self.note = self.note, None
        if note:
            print(note, file=self.streams[1], flush=True)

    def drop(self):
        """Never write the note: the command's last words are a mistake's line."""
        self.note = None


class _Noting:
    """A stream that has its `NoteBeforeFirstWords` say its note before the first words written to it."""

    def __init__(self, stream, notes):
        self._stream, self._notes = stream, notes

    def write(self, text):
        if text:
            self._notes.say()
        return self._stream.write(text)

    def __getattr__(self, name):
        return getattr(self._stream, name)


def choose_compile_cache(args):
    """Keep the command's compiled programs where `--compile-cache DIR` says, nowhere with `--no-compile-cache`
    (args.compile_cache False), or else in the default folder: before Keras starts, since TensorFlow reads where
    its compiled programs go once, at its start (see gptlite.compile_cache)."""
    from gptlite.backend import compile_cache

    chosen = getattr(args, "compile_cache", None)
    if chosen is False:
        compile_cache.use(None)
    elif chosen:
        compile_cache.use(chosen)
    else:
        compile_cache.use()


def start_keras_without_plots():
    """Start Keras quietly (`quiet`) without matplotlib: Keras imports matplotlib's pyplot where matplotlib is
    installed, for image-gallery plots no command draws, and that took 0.3 s of every command's start (`python -X
    importtime`, 2026-12-05). Python's import system answers a name held as None in sys.modules with an
    ImportError, which Keras takes as matplotlib being absent; the name is freed once Keras is running, so that
    gptlite's own plots (loss.png, attention maps) import matplotlib as they draw."""
    held = "matplotlib" not in sys.modules
    if held:
        sys.modules["matplotlib"] = None
    try:
        quiet()
    finally:
        if held and sys.modules.get("matplotlib", False) is None:
            del sys.modules["matplotlib"]


_holding_back = False  # whether hold_back_false_alarms has rearranged this process's standard error


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
    never held in the pipe when the process ends. A second call does nothing.
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
    if faulthandler.is_enabled():
        # `python -X faulthandler`: a crash's stacks go to the terminal too, not into the pipe, whose reader dies
        # with the process before it passes them on.
        faulthandler.enable(file=sys.stderr)

    def pass_on():
        with open(read, "rb") as native:
            for line in native:
                if not is_held_back(line.decode(errors="replace").rstrip("\n")):
                    os.write(terminal, line)

    threading.Thread(target=pass_on, name="gptlite-native-log", daemon=True).start()

