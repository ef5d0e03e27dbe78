"""One command's entry point: apply `--backend`, parse, run, and turn errors into one line and an exit status.

A `GPTLiteError` is a user mistake: its message, with settings written as
the command's flags, on one line, and status 2 (1 for a run that diverged,
which is no mistake of the user's). Anything else is a bug and keeps its
traceback. `--debug` shows the traceback of a mistake too.
"""

import sys

from gptlite.backend.choice import check_running
from gptlite.cli.flags import as_flags, parse
from gptlite.cli.startup import (choose_backend, choose_compile_cache, hold_back_false_alarms,
                                 NoteBeforeFirstWords, start_keras_without_plots)
from gptlite.errors import GPTLiteError, TrainingDiverged, TrainingInterrupted


def command(prog, make_parser, run, automatic_backend=None, check=None):
    """The `main(argv=None)` of a command whose parser `make_parser(prog)` makes and whose work `run(args)` does;
    `automatic_backend(args)`, where given, picks the backend when none is named (see `choose_backend`), and
    `check(args)`, where given, refuses what it can before the backend starts (a GPTLiteError).

    argv is parsed once, and the run file it names read once, before Keras starts: `--help`, a mistake in the
    flags and what `check` refuses answer at once, and the backend and the compile cache are known before the
    backend starts."""

    def main(argv=None, whole_process=None):
        # Called with no argv, the command is the process's own (a console script, `python -m`, train.py), as it
        # is under `gptlite COMMAND`, which says so: it may rearrange the process's standard error.
        whole_process = argv is None if whole_process is None else whole_process
        argv = sys.argv[1:] if argv is None else list(argv)
        parser = make_parser(prog)
        args = None
        try:
            args = parse(parser, argv)
            if check is not None:
                check(args)
        except GPTLiteError as error:  # the run file, or what `check` refuses
            if getattr(args, "debug", False):
                raise
            print(f"{prog}: error: {as_flags(str(error), parser)}", file=sys.stderr)
            return 2
        why = choose_backend(prog, args.backend, automatic_backend and (lambda: automatic_backend(args)))
        choose_compile_cache(args)
        start_keras_without_plots()
        if whole_process:
            hold_back_false_alarms()
        # Why the backend was chosen is said with the run's first words: a mistake found as the run reads its
        # inputs (a damaged model file, characters the model never saw) is then the one line a user sees.
        with NoteBeforeFirstWords(why) as note:
            try:
                check_running(args.backend)
                run(args)
            except TrainingInterrupted as stop:
                print(f"{prog}: {as_flags(str(stop), parser)}", file=sys.stderr)
                return 128 + stop.signal_number
            except GPTLiteError as error:
                if args.debug:
                    raise
                if not isinstance(error, TrainingDiverged):
                    note.drop()
                print(f"{prog}: error: {as_flags(str(error), parser)}", file=sys.stderr)
                return 1 if isinstance(error, TrainingDiverged) else 2
            except KeyboardInterrupt:
                print(f"\n{prog}: interrupted", file=sys.stderr)
                return 130
            note.say()
        return 0

    return main


def writing_backend(args):
    """A writing command's `automatic_backend` (see `command`): the backend that writes fastest on this machine
    with the model file `args.model`, and a line saying so (see gptlite.backend.choice)."""
    from gptlite.backend import choice

    backend, reason = choice.writing_backend(args.model)
    return (None, None) if backend is None else chosen(backend, reason)


def chosen(backend, reason):
    """An `automatic_backend`'s answer where it chose `backend` for `reason`: the backend, and the line saying so."""
    return backend, f"backend: {backend}, {reason} (--backend chooses another)"


def check_model(args):
    """A command's `check` (see `command`) where it loads the model file `args.model`: a path that is no model
    file is refused before the backend starts."""
    from gptlite.files import check_model_file

    check_model_file(args.model)


def print_piece(text):
    """Write text as it comes, without a newline."""
    sys.stdout.write(text)
    sys.stdout.flush()
