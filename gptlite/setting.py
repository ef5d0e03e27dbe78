"""How a setting is declared: once, as a dataclass field that carries its default, its help, its choices and
whether it is the model's shape. The command line's flags, their help and choices, the settings a resumed run
keeps, and the library's documented arguments are all made from these fields, so a new setting is one field.

Plain Python: the commands build their flags from the fields before they choose a backend.
"""

import dataclasses
import pathlib

from gptlite.errors import ConfigError


def setting(default, help, *, choices=None, metavar=None, shape=False, **more):
    """A dataclass field for a setting: its `default`; the `help` a reader is given (a sentence without the
    default, which is added where shown; other settings named in backticks, `n_head`); the `choices` it must be
    one of, if any; the `metavar` a flag names its value by; whether it is the model's `shape` (a resumed run
    cannot change it: the weights' shapes and meaning); `more` metadata a room of its own reads (the server's
    limits on a sampling setting)."""
    return dataclasses.field(default=default, metadata=dict(help=help, choices=choices, metavar=metavar,
                                                            shape=shape, **more))


def declared(cls):
    """The fields of a dataclass of settings, by name, in their order."""
    return {field.name: field for field in dataclasses.fields(cls)}


def check_choices(instance):
    """Refuse a field of `instance` whose value is not one of its declared choices (a ConfigError naming it)."""
    for name, field in declared(type(instance)).items():
        choices = field.metadata.get("choices")
        value = getattr(instance, name)
        if choices is not None and not (value is None and field.default is None) and value not in choices:
            raise ConfigError(f"{name} must be one of {', '.join(map(str, choices))}, got {value!r}")


def described(cls, names=None):
    """The settings of `cls` (or those of `names`) as documentation: a line each, `name (default): help`."""
    fields = declared(cls)
    lines = []
    for name in names or fields:
        field = fields[name]
        default = field.default if field.default is not dataclasses.MISSING else field.default_factory()
        choices = field.metadata.get("choices")
        among = f"; one of {', '.join(map(repr, choices))}" if choices else ""
        shown = repr(str(default)) if isinstance(default, pathlib.PurePath) else repr(default)
        lines.append(f"{name} (default {shown}{among}): {field.metadata['help']}")
    return lines
