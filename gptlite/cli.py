"""The `gptlite-train` and `gptlite-generate` commands (also `train.py` and `generate.py`)."""

import argparse
import dataclasses
import pathlib
import sys
import tempfile

from gptlite import data, generation, saving, training
from gptlite.errors import GPTLiteError, InputError, RunExistsError
from gptlite.model import GPT, GPTConfig
from gptlite.tokenizers import CharTokenizer

SAMPLE_DIVIDER = "\n" + "-" * 40 + "\n"


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        # One line, like every other user mistake, instead of usage plus error.
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _run(command, parser, argv):
    args = parser.parse_args(argv)
    try:
        command(args)
    except GPTLiteError as error:
        if args.debug:
            raise
        print(f"{parser.prog}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"\n{parser.prog}: interrupted", file=sys.stderr)
        return 130
    return 0


# --- training ------------------------------------------------------------------


def train_main(argv=None):
    return _run(_train, _train_parser(), argv)


def _train_parser():
    parser = _Parser(
        prog="gptlite-train",
        description="Train a character-level GPT on a text file and save it as model.keras.",
    )
    parser.add_argument(
        "text", nargs="?", type=pathlib.Path,
        help="UTF-8 text file to train on (default: about 2 MB of the Python standard library's sources)",
    )
    parser.add_argument("--preset", choices=sorted(training.PRESETS), default=training.DEFAULT_PRESET,
                        help=f"model size and schedule (default: {training.DEFAULT_PRESET})")
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("out"),
                        help="folder for model.keras, history.csv and loss.png (default: out)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace a model already in --out")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    settings = parser.add_argument_group("settings (each overrides the preset's value)")
    for field in dataclasses.fields(GPTConfig) + dataclasses.fields(training.TrainingConfig):
        if field.name == "vocab_size":
            continue  # comes from the tokenizer
        flag = "--" + field.name.replace("_", "-")
        preset_values = ", ".join(
            f"{name}: {values[field.name]}" for name, values in training.PRESETS.items()
            if field.name in values
        )
        help_text = f"presets: {preset_values}" if preset_values else f"default: {field.default}"
        if field.type is bool:
            settings.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=help_text)
        elif field.name == "position":
            settings.add_argument(flag, choices=["learned", "sinusoidal"], default=None, help=help_text)
        else:
            metavar = "N" if field.type is int else "X"
            settings.add_argument(flag, type=field.type, default=None, metavar=metavar, help=help_text)
    return parser


def _train(args):
    settings = dict(training.PRESETS[args.preset])
    for name, value in vars(args).items():
        if value is not None and name not in ("text", "preset", "out", "overwrite", "debug"):
            settings[name] = value
    model_settings, training_settings = training.split_settings(settings)
    training_config = training.TrainingConfig(**training_settings)
    GPTConfig(**model_settings)  # fail on a bad shape before reading any text
    _check_output_folder(args.out, args.overwrite)

    text = data.read_text(args.text) if args.text else data.default_corpus()
    source = args.text or "the Python standard library's sources"
    tokenizer = CharTokenizer.from_text(text)
    train_ids, validation_ids = data.split(tokenizer.encode(text))
    data.check_enough_tokens(train_ids, validation_ids, model_settings["block_size"])

    import keras

    keras.utils.set_random_seed(training_config.seed)
    config = GPTConfig(vocab_size=tokenizer.vocabulary_size, **model_settings)
    model = GPT.from_gpt_config(config, tokenizer)
    model.build((None, config.block_size))
    print(
        f"training on {source}: {len(text):,} characters, {tokenizer.vocabulary_size} distinct; "
        f"{len(train_ids):,} train / {len(validation_ids):,} validation tokens\n"
        f"model: {config.n_layer} layers, {config.n_head} heads, width {config.n_embd}, "
        f"context {config.block_size}, {model.count_params():,} parameters\n"
        f"{training_config.max_iters} steps of batch {training_config.batch_size}; each "
        f"'epoch' below is {training_config.eval_interval} steps and ends with a validation loss"
    )
    rows = training.train(model, train_ids, validation_ids, training_config, args.out)
    best = min(rows, key=lambda row: row["val_loss"])
    print(
        f"\nbest validation loss {best['val_loss']:.4f} at step {best['step']}; "
        f"saved {args.out / 'model.keras'}, {args.out / 'history.csv'}, {args.out / 'loss.png'}\n"
        f"sample from the final model:\n"
    )
    for piece in generation.stream(model, "", max_new_tokens=300, temperature=0.8, top_k=200,
                                   seed=training_config.seed):
        _print_piece(piece)
    print()


def _check_output_folder(out, overwrite):
    if out.exists() and not out.is_dir():
        raise InputError(f"--out {out} is a file, not a folder")
    if (out / "model.keras").exists() and not overwrite:
        raise RunExistsError(
            f"{out / 'model.keras'} already exists; pass --overwrite to replace it, "
            f"or choose another --out"
        )
    try:
        out.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=out).close()
    except OSError as error:
        raise InputError(f"cannot write to --out {out}: {error.strerror}") from None


# --- generation ----------------------------------------------------------------


def generate_main(argv=None):
    return _run(_generate, _generate_parser(), argv)


def _generate_parser():
    parser = _Parser(prog="gptlite-generate", description="Sample text from a trained gptlite model.")
    parser.add_argument("--model", type=pathlib.Path, default=pathlib.Path("out/model.keras"),
                        help="the model file (default: out/model.keras)")
    parser.add_argument("--prompt", default="",
                        help="text to continue (default: empty, which starts from a new line)")
    parser.add_argument("--max-new-tokens", type=int, default=500, metavar="N",
                        help="tokens to add to the prompt (default: 500)")
    parser.add_argument("--temperature", type=float, default=0.8,
                        help="below 1 is safer, above 1 wilder; 0 always takes the likeliest token (default: 0.8)")
    parser.add_argument("--top-k", type=int, default=200, metavar="K",
                        help="sample only among the K likeliest tokens (default: 200)")
    parser.add_argument("--seed", type=int, default=None,
                        help="make the samples repeatable (default: different each run)")
    parser.add_argument("--num-samples", type=int, default=1, metavar="N",
                        help="how many samples to print, one after another (default: 1)")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    return parser


def _generate(args):
    if args.num_samples < 1:
        raise InputError(f"--num-samples must be at least 1, got {args.num_samples}")
    generation.check_sampling_settings(args.max_new_tokens, args.temperature, args.top_k)
    model = saving.load(args.model)
    for index in range(args.num_samples):
        seed = None if args.seed is None else args.seed + index
        pieces = generation.stream(
            model, args.prompt, max_new_tokens=args.max_new_tokens,
            temperature=args.temperature, top_k=args.top_k, seed=seed,
        )
        if index:
            _print_piece(SAMPLE_DIVIDER)
        _print_piece(args.prompt)
        for piece in pieces:
            _print_piece(piece)
    print()


def _print_piece(text):
    sys.stdout.write(text)
    sys.stdout.flush()
