"""Settings declared once: a field made with `setting` reaches its checks, its documentation and a command's flags
with no other line written for it."""

import dataclasses

import pytest

import gptlite
from gptlite.setting import check_choices, described, setting

pytestmark = pytest.mark.once("settings are plain Python")


@dataclasses.dataclass(frozen=True)
class Kettle:
    """A throwaway group of settings, declared as gptlite's are."""

    litres: float = setting(1.5, "how much it holds")
    spout: str = setting("short", "its spout: short or long, as `litres` allows", choices=("short", "long"))
    colour: str = setting(None, "any colour; none: steel", choices=("red", "blue"))

    def __post_init__(self):
        check_choices(self)


def test_a_choice_outside_the_declared_ones_is_refused_naming_the_setting_and_its_choices():
    with pytest.raises(gptlite.ConfigError, match="^spout must be one of short, long, got 'curly'$"):
        Kettle(spout="curly")
    with pytest.raises(gptlite.ConfigError, match="^colour must be one of red, blue, got 'green'$"):
        Kettle(colour="green")
    assert Kettle(colour=None).colour is None  # a setting whose default is None may stay unset


def test_the_documentation_of_settings_is_made_from_their_declarations():
    assert described(Kettle) == [
        "litres (default 1.5): how much it holds",
        "spout (default 'short'; one of 'short', 'long'): its spout: short or long, as `litres` allows",
        "colour (default None; one of 'red', 'blue'): any colour; none: steel",
    ]
    assert described(Kettle, ["colour"]) == described(Kettle)[2:]


def test_a_declared_setting_becomes_a_flag_with_its_help_and_choices_and_names_others_as_flags():
    from gptlite.cli.flags import add_declared_flag, Parser, with_flags_in_help
    from gptlite.setting import declared

    parser = Parser(prog="kettle")
    for field in declared(Kettle).values():
        add_declared_flag(parser, field)
    with_flags_in_help(parser)
    args = parser.parse_args(["--litres", "2", "--spout", "long"])
    assert (args.litres, args.spout, args.colour) == (2.0, "long", None)
    helps = {action.dest: action.help for action in parser._actions}
    assert helps["spout"] == "its spout: short or long, as --litres allows (default: short)"
    with pytest.raises(SystemExit):
        parser.parse_args(["--colour", "green"])


def test_every_setting_of_a_run_is_a_flag_of_train_py_with_its_declared_help_and_choices():
    from gptlite.cli import train
    from gptlite.cli.flags import FLAG_ALIASES
    from gptlite.model.config import GPTConfig
    from gptlite.setting import declared
    from gptlite.training.plan import RunArguments
    from gptlite.training.settings import TrainingConfig

    actions = {action.dest: action for action in train.make_parser("gptlite-train")._actions}
    fields = {**declared(GPTConfig), **declared(TrainingConfig), **declared(RunArguments)}
    # The texts are a positional argument; settings is every flag of the settings group (tensorboard is two flags,
    # --tensorboard with its help); vocab_size is the run's (a new BPE vocabulary's size): a model's is its
    # tokenizer's.
    made_otherwise = {"sources", "settings"}
    for name, field in fields.items():
        if name in made_otherwise:
            continue
        action = actions[FLAG_ALIASES.get(name, name)]
        first_words = field.metadata["help"].split("`")[0]
        assert action.help.startswith(first_words), name
        assert (tuple(action.choices) if action.choices else None) == (
            tuple(field.metadata["choices"]) if field.metadata["choices"] else None), name
