"""`train.py` / `gptlite train`: train a GPT or a seq2seq model on files and save it as model.keras."""

import pathlib

from gptlite.cli.command import chosen, command, print_piece
from gptlite.cli.flags import add_backend_flags, add_declared_flag, FLAG_ALIASES, Parser, with_flags_in_help
from gptlite.model import config
from gptlite.setting import declared
from gptlite.training import plan, settings

SUMMARY = "train a GPT on text files (or a seq2seq model on pairs) and save it as model.keras"


def make_parser(prog):
    parser = Parser(
        prog=prog,
        description="Train a GPT on text files, or a seq2seq model on source<TAB>target pairs, "
                    "and save it as model.keras.",
    )
    fields = declared(plan.RunArguments)
    parser.add_argument("texts", nargs="*", type=pathlib.Path, metavar="TEXT", help=fields["sources"].metadata["help"])
    for name, field in fields.items():
        if name not in ("sources", "settings", "tensorboard"):  # the texts above; the settings', tensorboard's below
            add_declared_flag(parser, field, dest=FLAG_ALIASES.get(name, name))
    parser.add_argument("--config", type=pathlib.Path, default=None, metavar="FILE",
                        help="read the texts, options and settings from a run file (every run writes its own to "
                             "--out/config.toml); flags given here win over the file's values")
    # One setting, two flags: --tensorboard sets it True, --tensorboard-dir to a folder.
    parser.add_argument("--tensorboard", action="store_true", help=fields["tensorboard"].metadata["help"])
    parser.add_argument("--tensorboard-dir", type=pathlib.Path, default=None, metavar="DIR",
                        help="that other folder (implies --tensorboard)")
    add_backend_flags(parser)
    _add_setting_flags(parser)
    return with_flags_in_help(parser)


def _add_setting_flags(parser):
    """A flag for each setting of `GPTConfig` and `TrainingConfig`, named as the setting is; its help says the
    presets' values."""
    group = parser.add_argument_group("settings (each overrides the preset's value)")
    fields = {**declared(config.GPTConfig), **declared(settings.TrainingConfig)}
    for field in (fields[name] for name in settings.SETTING_NAMES):
        add_declared_flag(group, field, switch=True, presets=_presets_values(field.name))


def _presets_values(name):
    """The presets' values of a setting, those that share one together: "cpu, gpu: 0.1; tiny: 0.3"."""
    presets_of = {}
    for preset, values in settings.PRESETS.items():
        if name in values:
            presets_of.setdefault(values[name], []).append(preset)
    if len(presets_of) == 1 and sum(map(len, presets_of.values())) == len(settings.PRESETS):
        return f"every preset {next(iter(presets_of))}"
    return "; ".join(f"{', '.join(presets)}: {value}" for value, presets in presets_of.items())


def run(args):
    from gptlite.training import run

    # Each argument of the run from its flag, named as the argument is but for FLAG_ALIASES'; the settings from
    # theirs, and tensorboard from two.
    made = {"settings": {name: getattr(args, name) for name in settings.SETTING_NAMES},
            "tensorboard": args.tensorboard_dir or args.tensorboard or None}
    asked = {name: made[name] if name in made else getattr(args, FLAG_ALIASES.get(name, name))
             for name in plan.RUN_ARGUMENTS}
    trained = run.train_on_text(**asked)
    best = trained.best
    print(
        f"\nbest validation loss {best['val_loss']:.4f} at step {best['step']}; "
        f"saved {args.out / 'model.keras'}, {args.out / 'history.csv'}, {args.out / 'loss.png'}"
    )
    for piece in trained.closing_words():
        print_piece(piece)


def automatic_backend(args):
    """The backend for a run that names none, and a line saying so: a resumed run's own, from its run file; else
    from the precision the flags, run file or preset ask for (see gptlite.backend.choice). (None, None) where the
    resumed run's file cannot be read: the run reports that."""
    from gptlite.backend import choice
    from gptlite.errors import GPTLiteError
    from gptlite.training import run_config

    if args.resume:
        try:
            return run_config.read_run_config(pathlib.Path(args.out) / run_config.FILE_NAME).backend, None
        except GPTLiteError:
            return None, None
    preset = settings.PRESETS.get(args.preset, {})
    backend, reason = choice.training_backend(args.precision or preset.get("precision") or
                                              settings.TrainingConfig.precision)
    if reason is None:
        return None, None
    if backend is None:
        return None, f"backend: tensorflow; {reason}"
    return chosen(backend, reason)


def check(args):
    """Refuse a text that is not there, and a folder that holds a run, before the backend starts (seconds): `run`
    refuses them all the same."""
    from gptlite.files import check_exists
    from gptlite.training.run_folder import check_folder

    check_exists([] if args.synthetic else args.texts)
    if not args.resume:
        check_folder(pathlib.Path(args.out), args.overwrite)


main = command("gptlite-train", make_parser, run, automatic_backend, check)
