"""Flags: the parser every command uses, the flags they share, and library settings written as flags.

The library names its settings (`max_iters`, `out_dir`); a command's
messages name its flags (`--max-iters`, `--out`). `as_flags` is the one
place that turns the first into the second.
"""

import argparse
import pathlib
import re

from gptlite.backend.choice import BACKENDS
from gptlite.decode.settings import SAMPLING_FIELDS, SamplingConfig
from gptlite.text import UNKNOWN_CHOICES

# Library arguments that a command spells otherwise.
FLAG_ALIASES = {"out_dir": "out", "sources": "texts"}
QUOTES = "'\""


class Parser(argparse.ArgumentParser):
    """An argument parser whose mistakes are one line, like every other user mistake, not usage plus error."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def add_backend_flags(parser):
    """`--backend` and `--debug`, which every command has."""
    parser.add_argument("--backend", choices=BACKENDS, default=None,
                        help="the Keras backend to run on (default: KERAS_BACKEND, else the one this command "
                             "runs fastest on here, which it names, else tensorflow); see docs/backends.md")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")


def add_compile_cache_flags(parser):
    """`--compile-cache DIR` and `--no-compile-cache`, for the commands that decode (see gptlite.compile_cache);
    `startup.choose_compile_cache` applies them, before Keras starts."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--compile-cache", type=pathlib.Path, default=None, metavar="DIR",
                       help="keep compiled programs in DIR, so that the next start loads them (default: "
                            "GPTLITE_COMPILE_CACHE, else gptlite/compiled in the user's cache folder)")
    group.add_argument("--no-compile-cache", dest="compile_cache", action="store_false",
                       help="compile afresh each start and keep nothing on disk")


def add_declared_flag(parser, field, dest=None, switch=False, presets=""):
    """A flag for a setting declared with `gptlite.setting` (a dataclass field), named as the setting is (or
    `dest`), with its help, choices and metavar, and its default or, where given, the `presets`' values. A true or
    false setting is a `--name` flag, or with `switch` a `--name`/`--no-name` pair that leaves it unset when
    neither is given. Its help names other settings in backticks: `with_flags_in_help` writes them as flags."""
    name = dest or field.name
    flag, help_text = "--" + name.replace("_", "-"), field.metadata["help"]
    if presets:
        help_text += f" (presets: {presets})" if ":" in presets else f" ({presets})"
    elif field.default not in (None, False, ()):
        help_text += f" (default: {field.default})"
    if field.type is bool:
        action = argparse.BooleanOptionalAction if switch else "store_true"
        parser.add_argument(flag, dest=name, action=action, default=None if switch else field.default, help=help_text)
    elif field.metadata["choices"] is not None:
        parser.add_argument(flag, dest=name, choices=list(field.metadata["choices"]), default=None if switch else
                            field.default, help=help_text)
    else:
        kind = field.type if field.type in (int, float, str, pathlib.Path) else str
        metavar = field.metadata["metavar"] or {int: "N", float: "X"}.get(kind)
        parser.add_argument(flag, dest=name, type=kind, default=None if switch else field.default, metavar=metavar,
                            help=help_text)


def with_flags_in_help(parser):
    """`parser`, each flag's help with the settings it names in backticks written as the parser's flags
    (`as_flags`); a word of the help that happens to be a setting's name stays a word."""
    for action in parser._actions:
        if action.help not in (None, argparse.SUPPRESS):
            action.help = as_flags(action.help, parser, bare=False)
    return parser


def add_sampling_flags(parser, notes=None):
    """A flag for each sampling setting (`decode.settings.SamplingConfig`'s fields), named as the setting, with
    its help; `notes` adds a command's own words to a setting's help (by the setting's name). A flag left out
    leaves the setting at SamplingConfig's default (`sampling_settings`)."""
    notes = notes or {}
    for name, field in SAMPLING_FIELDS.items():
        help_text = field.metadata["help"] + (f"; {notes[name]}" if name in notes else "")
        flag, metavar = "--" + name.replace("_", "-"), field.metadata["metavar"]
        if field.type is tuple:  # a list of strings: the flag once for each
            parser.add_argument(flag, action="append", default=[], metavar=metavar, help=help_text)
        else:
            parser.add_argument(flag, type=field.type, default=None, metavar=metavar, help=help_text)


def sampling_settings(args):
    """The sampling settings that `add_sampling_flags`'s flags give, as SamplingConfig's keyword arguments: those
    left out keep its defaults."""
    return {name: getattr(args, name) for name in SAMPLING_FIELDS if getattr(args, name) not in (None, [])}


def sampling_config(args):
    """The SamplingConfig that `add_sampling_flags`'s flags ask for, checked."""
    return SamplingConfig(**sampling_settings(args))


def add_unknown_flag(parser, which):
    parser.add_argument("--unknown", choices=UNKNOWN_CHOICES, default="error",
                        help=f"{which}: stop with an error (the default), leave them out, or replace each with a space")


def add_model_argument(parser):
    parser.add_argument("model", type=pathlib.Path, metavar="MODEL", help="the model file (a model.keras)")


def parse(parser, argv):
    """argv, parsed once: the namespace, where each option the command line leaves out takes the run file's value
    (`--config FILE`, read once) or else its default. A flag given wins over the file. `--help` and a mistake in
    argv exit here, before anything starts; a run file that cannot be read raises a GPTLiteError."""
    actions = [action for action in parser._actions if action.dest not in (argparse.SUPPRESS, "help")]
    saved = [(action, action.default) for action in actions]
    # What argparse leaves where argv gives nothing: a mark, or None for a flag that adds to what it finds.
    unset = {action: None if isinstance(action, _ADDING) else _UNSET for action in actions}
    for action in actions:
        action.default = unset[action]
    try:
        args = parser.parse_args(argv)
    finally:
        for action, default in saved:
            action.default = default
    written = _run_file_values(args.config) if getattr(args, "config", None) not in (None, _UNSET) else {}
    for action, default in saved:
        if getattr(args, action.dest) is unset[action]:
            if default is None and not action.option_strings and action.nargs == argparse.ZERO_OR_MORE:
                default = []  # as argparse gives a positional of any number that is left out
            value = written.get(action.dest, default)
            # As argparse does with a default: text is read by the flag's own type.
            setattr(args, action.dest, action.type(value) if isinstance(value, str) and callable(action.type)
                    else value)
    return args


_UNSET = object()
_ADDING = (argparse._AppendAction, argparse._AppendConstAction, argparse._CountAction, argparse._ExtendAction)


def _run_file_values(path):
    """A run file's values, by the flags' names."""
    from gptlite.training import run_config

    config = run_config.read_run_config(path)
    values = {FLAG_ALIASES.get(name, name): value for name, value in config.arguments.items() if name != "settings"}
    values.update(config.arguments["settings"])
    if config.backend is not None:
        values["backend"] = config.backend
    return values


def as_flags(message, parser, bare=True):
    """A library message with the settings it names written as `parser`'s flags.

    `name=value` in backticks becomes `--name value` (`--name` for True,
    `--no-name` for False); with `bare`, a setting named bare becomes its flag
    where it has an underscore (`max_iters`) or begins a statement of its value
    (`lr must be`, `lr (0.01)`). Names without a flag stay as they are.
    """
    flags = {}
    for action in parser._actions:
        for option in action.option_strings:
            if option.startswith("--no-"):
                flags[(action.dest, False)] = option
            elif option.startswith("--"):
                flags.setdefault((action.dest, None), option)
    for setting, dest in FLAG_ALIASES.items():
        if (dest, None) in flags:
            flags[(setting, None)] = flags[(dest, None)]

    def quoted(match):
        name, value = match.group(1), match.group(2)
        flag = flags.get((name, None))
        if flag is None:
            return match.group(0)
        if value is None or value == "True":
            return flag
        if value == "False":
            return flags.get((name, False), f"{flag} False")
        return f"{flag} {value.strip(QUOTES)}"

    message = re.sub(r"`(\w+)(?:=([^`]*))?`", quoted, message)
    if not bare:
        return message

    def bare_name(match):
        name, after = match.group(1), match.group(2) or ""
        return (flags[(name, None)] if "_" in name or after else name) + after

    names = "|".join(sorted((re.escape(name) for name, value in flags if value is None), key=len, reverse=True))
    return re.sub(rf"(?<![\w'\"/.-])({names})\b( must| \()?", bare_name, message)
