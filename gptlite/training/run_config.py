"""A run's settings as a file: every run writes `config.toml` to its folder, and
a run read back from one trains again as it did.

    config = gptlite.read_run_config("runs/a/config.toml")
    run = gptlite.train_on_text(out_dir="runs/b", **config.arguments)

The file is TOML: the run's arguments at the top (its texts, preset,
tokenizer, ...), then a [settings] table with every setting the run resolved
(a preset's values and overrides alike), so that it does not depend on
defaults that may change. A value left out takes its default.
"""

import dataclasses
import difflib
import pathlib

from gptlite.errors import ConfigError, InputError, MissingFileError
from gptlite.files import atomic_path
from gptlite.model.config import GPTConfig
from gptlite.training.settings import TrainingConfig
from gptlite.version import __version__

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

FILE_NAME = "config.toml"
# `train_on_text`'s arguments a run file holds, with the type of each.
ARGUMENTS = {"sources": list, "task": str, "synthetic": str, "preset": str, "tokenizer": str, "vocab_size": int,
             "encoding": str, "errors": str, "init_from": str, "unknown": str, "distribute": bool, "film": bool,
             "film_probe": str}
# What the file says of where the run trained: read, shown, not passed on.
RECORDED = {"gptlite_version": str, "backend": str}
# Every setting, with its type; a setting that is None (lora_alpha's default) is left out.
SETTINGS = {field.name: field.type for field in dataclasses.fields(GPTConfig) + dataclasses.fields(TrainingConfig)
            if field.name != "vocab_size"}
HEADER = ("# The settings of a gptlite run, written by the run itself.\n"
          "# Train it again with: python train.py --config THIS_FILE --out ANOTHER_FOLDER\n"
          "# (flags given on that command line win over the values here).\n")


@dataclasses.dataclass
class RunConfig:
    """What a run file holds."""

    arguments: dict  # keyword arguments for `train_on_text`, `settings` among them
    backend: str = None  # the Keras backend the run trained on
    gptlite_version: str = None


def write_run_config(path, arguments, settings, backend):
    """Write a run's `train_on_text` arguments and resolved settings to `path` as TOML, atomically."""
    lines = [HEADER, _line("gptlite_version", __version__), _line("backend", backend), ""]
    lines += [_line(name, arguments[name]) for name in ARGUMENTS if arguments.get(name) is not None]
    lines += ["", "[settings]"]
    lines += [_line(name, settings[name]) for name in SETTINGS if settings.get(name) is not None]
    with atomic_path(path) as temporary:
        temporary.write_text("\n".join(lines) + "\n", encoding="utf-8")


def read_run_config(path):
    """The `RunConfig` in a run file; a `GPTLiteError` naming the key for an unknown key or a wrong type."""
    path = pathlib.Path(path)
    if not path.is_file():
        raise MissingFileError(f"no such run file: {path}")
    try:
        document = tomllib.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as error:
        raise InputError(f"{path} is not a TOML file: {error}") from None
    settings = document.pop("settings", {})
    if not isinstance(settings, dict):
        raise InputError(f"{path}: 'settings' must be a table ([settings]), got {settings!r}")
    _check_keys(path, document, {**ARGUMENTS, **RECORDED}, "", settings_table=False)
    _check_keys(path, settings, SETTINGS, "[settings] ", settings_table=True)
    arguments = {name: value for name, value in document.items() if name in ARGUMENTS}
    if "init_from" in arguments and arguments.get("tokenizer") == "char":
        # Files written before a fine-tuning run's tokenizer was left unset say "char" there, which such
        # a run now refuses: the pretrained model keeps its own tokenizer.
        del arguments["tokenizer"]
    if "sources" in arguments:
        arguments["sources"] = [pathlib.Path(source) for source in arguments["sources"]]
    arguments["settings"] = settings
    return RunConfig(arguments, document.get("backend"), document.get("gptlite_version"))


def _check_keys(path, table, types, where, settings_table):
    for key, value in table.items():
        if key not in types:
            raise InputError(f"{path}: unknown key {where}'{key}'{_nearest(key, settings_table)}")
        expected = types[key]
        if not _is_a(value, expected):
            raise InputError(f"{path}: {where}'{key}' must be {_DESCRIPTIONS[expected]}, got {value!r}")


def _is_a(value, expected):
    if expected is list:
        return isinstance(value, list) and all(isinstance(item, str) for item in value)
    if expected is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if expected is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, expected)


_DESCRIPTIONS = {list: "a list of strings", str: "a string", int: "a whole number", float: "a number",
                 bool: "true or false"}


def _nearest(key, settings_table):
    """Where the key most like `key` is: '; did you mean ...?', or nothing."""
    here, there = (SETTINGS, {**ARGUMENTS, **RECORDED}) if settings_table else ({**ARGUMENTS, **RECORDED}, SETTINGS)
    if key in there:
        return " here: it belongs " + ("at the top, before [settings]" if settings_table else "in [settings]")
    close = difflib.get_close_matches(key, [*here, *there], n=1)
    if not close:
        return ""
    return f"; did you mean '{close[0]}'" + ("" if close[0] in here else
                                            " (at the top)" if settings_table else " (in [settings])") + "?"


def _line(name, value):
    return f"{name} = {_toml(value)}"


def _toml(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(item) for item in value) + "]"
    if isinstance(value, pathlib.PurePath):
        value = str(value)
    if isinstance(value, str):
        # A basic string: backslash, quote and control characters escaped, everything else as it is.
        escaped = "".join(_ESCAPES.get(c, f"\\u{ord(c):04x}" if ord(c) < 0x20 or ord(c) == 0x7F else c)
                          for c in value)
        return f'"{escaped}"'
    raise ConfigError(f"cannot write {value!r} to a run file")


_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\t": "\\t", "\r": "\\r"}
