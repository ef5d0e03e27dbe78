"""The commands `gptlite-train`, `gptlite-generate`, `gptlite-export`, `gptlite-inspect`, `gptlite-eval`,
`gptlite-serve` and `gptlite`
(also `train.py`, `generate.py` and `python -m gptlite.cli`).

Each command parses its flags, calls the library and turns a `GPTLiteError`
into one line and an exit status, with the settings the library names
(`max_iters`) written as this command's flags (`--max-iters`). Keras fixes
its backend when it is first imported, so `--backend` is applied before
anything here imports Keras: this module imports the library inside its
functions, and `import gptlite` alone does not import Keras.
"""

import argparse
import dataclasses
import importlib.util
import json
import os
import pathlib
import re
import sys
import tempfile

from gptlite import settings
from gptlite.errors import GPTLiteError, InputError, RunExistsError, TrainingDiverged, TrainingInterrupted
from gptlite.text import UNKNOWN_CHOICES

BACKENDS = ("tensorflow", "jax", "torch")
# A line in Abseil's log format, as TensorFlow's C++ code writes it: severity, date, time, thread, file:line].
NATIVE_LOG_LINE = re.compile(r"([IWEF])\d{4} [\d:.]+ +\d+ \S+:\d+\] (.*)")
SAMPLE_DIVIDER = "\n" + "-" * 40 + "\n"
SETTING_CHOICES = {"position": list(settings.POSITIONS), "precision": list(settings.PRECISIONS)}
# Settings whose flags say more than their defaults.
SETTING_HELP = {
    "grad_accum": "each optimizer step adds up the gradients of N batches of --batch-size (default: 1): a batch "
                  "N times larger in the memory of one; steps and intervals count optimizer steps",
    "lora_rank": "train rank-N low-rank adapters on the projections --lora-targets names, every other weight "
                 "frozen (default: 0, off); the saved model holds the merged weights",
    "lora_alpha": "the adapters' scale is X / --lora-rank (default: the rank, a scale of 1)",
    "lora_targets": f"which projections of each block get adapters, comma-separated from "
                    f"{','.join(settings.LORA_TARGETS)} (default: all)",
}
# Library arguments that a command spells otherwise.
FLAG_ALIASES = {"out_dir": "out", "sources": "texts"}
QUOTES = "'\""


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        # One line, like every other user mistake, instead of usage plus error.
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def choose_backend(prog, argv):
    """Put `--backend NAME` from argv into KERAS_BACKEND; exit with a one-line error if NAME is not installed.

    Must run before Keras is imported; the command's own parser checks the flag again.
    """
    reader = argparse.ArgumentParser(add_help=False, exit_on_error=False)
    reader.add_argument("--backend")
    try:
        known, _ = reader.parse_known_args(argv)
    except argparse.ArgumentError:
        return  # `--backend` with no name: the command's own parser says so
    if known.backend is None:
        known.backend = _run_config_backend(argv)
    if known.backend not in BACKENDS:
        return  # none given, or a wrong name, which the command's own parser reports
    if importlib.util.find_spec(known.backend) is None:
        extra = "" if known.backend == "tensorflow" else f"[{known.backend}]"
        sys.exit(f"{prog}: error: --backend {known.backend} needs {known.backend} installed "
                 f"(pip install \"gptlite{extra}\", or pip install -e \".{extra}\" in a checkout)")
    os.environ["KERAS_BACKEND"] = known.backend


def start_keras():
    """Import Keras and start its backend with the backend's native start-up notices held back.

    Loading TensorFlow, its C++ code writes notices straight to the process's
    standard error ("oneDNN custom operations are on", "Could not find cuda
    drivers", and on a machine without a CUDA driver "failed call to cuInit",
    as an error), some before TF_CPP_MIN_LOG_LEVEL applies to them; they
    would bury a command's one-line error or its progress. Lines of that log
    format below TF_CPP_MIN_LOG_LEVEL's severity (gptlite sets 2: errors)
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

                tf.config.list_physical_devices()  # where TensorFlow looks for a GPU and logs not finding one
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            shown = [line for line in captured.read().decode(errors="replace").splitlines()
                     if not _is_start_up_notice(line)]
            if shown:
                print("\n".join(shown), file=sys.stderr)


def _is_start_up_notice(line):
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


def _command(prog, make_parser, command):
    """The entry point of one command: apply --backend, parse, run, map errors to exit statuses."""

    def main(argv=None):
        argv = sys.argv[1:] if argv is None else list(argv)
        choose_backend(prog, argv)
        if not {"-h", "--help"} & set(argv):  # help comes at once where the parser needs no Keras
            start_keras()  # before the parser: some commands' parsers import Keras
        parser = make_parser(prog)
        args = parser.parse_args(argv)
        try:
            if getattr(args, "config", None) is not None:
                args = _with_run_config(parser, argv, args.config)
            _check_backend(args.backend)
            command(args)
        except TrainingInterrupted as stop:
            print(f"{prog}: {as_flags(str(stop), parser)}", file=sys.stderr)
            return 128 + stop.signal_number
        except GPTLiteError as error:
            if args.debug:
                raise
            print(f"{prog}: error: {as_flags(str(error), parser)}", file=sys.stderr)
            # A diverged run is no usage mistake: it gets the general failure status.
            return 1 if isinstance(error, TrainingDiverged) else 2
        except KeyboardInterrupt:
            print(f"\n{prog}: interrupted", file=sys.stderr)
            return 130
        return 0

    return main


def _with_run_config(parser, argv, path):
    """argv parsed again with a run file's values as the defaults: a flag given wins over the file."""
    from gptlite import run_config

    config = run_config.read_run_config(path)
    defaults = {FLAG_ALIASES.get(name, name): value for name, value in config.arguments.items() if name != "settings"}
    defaults.update(config.arguments["settings"])
    if config.backend is not None:
        defaults["backend"] = config.backend
    parser.set_defaults(**defaults)
    return parser.parse_args(argv)


def as_flags(message, parser):
    """A library message with the settings it names written as `parser`'s flags.

    `name=value` in backticks becomes `--name value` (`--name` for True,
    `--no-name` for False); a setting named bare becomes its flag where it
    has an underscore (`max_iters`) or begins a statement of its value
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

    def bare(match):
        name, after = match.group(1), match.group(2) or ""
        return (flags[(name, None)] if "_" in name or after else name) + after

    names = "|".join(sorted((re.escape(name) for name, value in flags if value is None), key=len, reverse=True))
    return re.sub(rf"(?<![\w'\"/.-])({names})\b( must| \()?", bare, message)


def _add_backend_flag(parser):
    parser.add_argument("--backend", choices=BACKENDS, default=None,
                        help="the Keras backend to run on (default: KERAS_BACKEND, else tensorflow); "
                             "see docs/backends.md for which to pick")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")


def _add_unknown_flag(parser, which):
    parser.add_argument("--unknown", choices=UNKNOWN_CHOICES, default="error",
                        help=f"{which}: stop with an error (the default), leave them out, or replace each with a space")


def _check_backend(requested):
    """`--backend` takes effect before Keras is imported; here it can only be checked."""
    import keras

    if requested and keras.backend.backend() != requested:
        raise InputError(
            f"--backend {requested} came too late: Keras is already running on {keras.backend.backend()} "
            f"in this process; set KERAS_BACKEND={requested} before importing Keras"
        )


# --- training ------------------------------------------------------------------


def _train_parser(prog):
    from gptlite import pairs, pipeline

    parser = _Parser(
        prog=prog,
        description="Train a GPT on text files, or a seq2seq model on source<TAB>target pairs, "
                    "and save it as model.keras.",
    )
    parser.add_argument(
        "texts", nargs="*", type=pathlib.Path, metavar="TEXT",
        help="UTF-8 text files, or folders of them, to train on (default: about 2 MB of the Python "
             "standard library's sources); several are read in the order given, a folder's files in sorted order; "
             "with --task seq2seq, one file of source<TAB>target lines",
    )
    parser.add_argument("--task", choices=pipeline.TASKS, default=None,
                        help="lm: a GPT that continues text (the default); seq2seq: an encoder-decoder that learns "
                             "to write each line's target from its source")
    parser.add_argument("--synthetic", choices=pairs.SYNTHETIC_TASKS, default=None,
                        help="train seq2seq on a built-in task instead of a file: addition (\"123+456\" -> \"579\"), "
                             "reverse or sort (strings of 5 to 20 letters); steps, unless --max-iters says: "
                             + ", ".join(f"{t} {n}" for t, n in settings.SYNTHETIC_MAX_ITERS.items()))
    parser.add_argument("--tokenizer", choices=pipeline.TOKENIZERS, default="char",
                        help="char: one token per character (the default); bpe: byte-level byte-pair "
                             "encoding learned from the text, for large or many-language corpora")
    parser.add_argument("--vocab-size", type=int, default=None, metavar="N",
                        help=f"tokens in a BPE vocabulary (default: {pipeline.DEFAULT_BPE_VOCABULARY})")
    parser.add_argument("--preset", choices=sorted(settings.PRESETS), default=None,
                        help=f"model size and schedule (default: {settings.DEFAULT_PRESET})")
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("out"),
                        help="folder for model.keras, history.csv, loss.png and checkpoints (default: out)")
    parser.add_argument("--config", type=pathlib.Path, default=None, metavar="FILE",
                        help="read the texts, options and settings from a run file (every run writes its own to "
                             "--out/config.toml); flags given here win over the file's values")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace a run already in --out")
    parser.add_argument("--resume", action="store_true",
                        help="continue the run in --out from its last checkpoint")
    parser.add_argument("--encoding", default="utf-8",
                        help="the text file's encoding (default: utf-8)")
    parser.add_argument("--errors", choices=["strict", "replace"], default="strict",
                        help="bytes that do not decode: stop with an error (strict, the default) "
                             "or replace them with U+FFFD (replace)")
    parser.add_argument("--init-from", default=None, metavar="MODEL",
                        help="fine-tune a pretrained GPT instead of training a new one: a gptlite model.keras, a "
                             "Hugging Face GPT-2 folder, or a KerasHub GPT-2 preset (a folder, or a name such as "
                             "gpt2_base_en, downloaded where a network is reachable); it keeps its shape and "
                             "tokenizer, and its file is only read (see docs/pretrained.md)")
    _add_unknown_flag(parser, "with --init-from: text characters the pretrained char vocabulary lacks")
    parser.add_argument("--distribute", action="store_true",
                        help="train data-parallel over every local device (tensorflow: GPUs, else CPU devices; "
                             "jax: all devices), or over several hosts (see docs/training.md); the batch is split "
                             "across them and the learning rate is unchanged")
    parser.add_argument("--tensorboard", nargs="?", const=True, default=None, type=pathlib.Path, metavar="DIR",
                        help="write TensorBoard event files at each evaluation (losses, bits per character, learning "
                             "rate, tokens per second, a text sample) to DIR, or with no DIR to --out/tensorboard; "
                             "view them with: tensorboard --logdir DIR")
    parser.add_argument("--mfu", action="store_true", default=None,
                        help="show and record model FLOPs utilisation at each evaluation, against --peak-flops "
                             "(on by default for --preset gpu on a GPU)")
    parser.add_argument("--peak-flops", type=float, default=None, metavar="X",
                        help="the hardware's peak FLOPs per second for --mfu (default: 312e12, an A100's bfloat16 "
                             "peak, as nanoGPT uses); giving it turns --mfu on")
    _add_backend_flag(parser)
    group = parser.add_argument_group("settings (each overrides the preset's value)")
    fields = {f.name: f for f in dataclasses.fields(settings.GPTConfig) + dataclasses.fields(settings.TrainingConfig)}
    for field in (fields[name] for name in settings.SETTING_NAMES):
        flag = "--" + field.name.replace("_", "-")
        preset_values = ", ".join(
            f"{name}: {values[field.name]}" for name, values in settings.PRESETS.items() if field.name in values
        )
        help_text = SETTING_HELP.get(field.name) or (f"presets: {preset_values}" if preset_values
                                                     else f"default: {field.default}")
        if field.type is bool:
            group.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=help_text)
        elif field.name in SETTING_CHOICES:
            group.add_argument(flag, choices=SETTING_CHOICES[field.name], default=None, help=help_text)
        else:
            metavar = "N" if field.type is int else "X"
            group.add_argument(flag, type=field.type, default=None, metavar=metavar, help=help_text)
    return parser


def _train(args):
    from gptlite import generation, pipeline

    run = pipeline.train_on_text(
        args.texts, args.out, {name: getattr(args, name) for name in settings.SETTING_NAMES},
        preset=args.preset, task=args.task, synthetic=args.synthetic, tokenizer=args.tokenizer,
        vocab_size=args.vocab_size, encoding=args.encoding, errors=args.errors, init_from=args.init_from,
        unknown=args.unknown, distribute=args.distribute, resume=args.resume, overwrite=args.overwrite,
        tensorboard=args.tensorboard, mfu=args.mfu, peak_flops=args.peak_flops)
    best = run.best
    print(
        f"\nbest validation loss {best['val_loss']:.4f} at step {best['step']}; "
        f"saved {args.out / 'model.keras'}, {args.out / 'history.csv'}, {args.out / 'loss.png'}"
    )
    if run.held_out is not None:
        _show_targets(run.model, run.held_out)
        return
    print("sample from the final model:\n")
    for piece in generation.stream(run.model, "", seed=run.training_config.seed, **pipeline.SAMPLING):
        _print_piece(piece)
    print()


def _show_targets(model, held_out, count=8):
    """Print what the final model writes for a few held-out sources, and its exact match on them all."""
    from gptlite import generation, pairs

    # As many as the evaluations decoded, in batches of the same size: no new compile.
    measured = held_out.subset(range(min(len(held_out), pairs.HELD_OUT_PAIRS)))
    decoded = generation.generate_target(model, measured.sources)
    right = sum(got == want for got, want in zip(decoded, measured.targets))
    print(f"the final model decodes {right:,} of {len(measured):,} held-out pairs exactly; a few:")
    for source, want, got in list(zip(measured.sources, measured.targets, decoded))[:count]:
        print(f"  {source!r} -> {got!r}" + ("" if got == want else f"   (expected {want!r})"))


# --- generation ----------------------------------------------------------------


def _generate_parser(prog):
    from gptlite import inspection

    parser = _Parser(prog=prog, description="Sample text from a trained gptlite model.")
    parser.add_argument("--model", type=pathlib.Path, default=pathlib.Path("out/model.keras"),
                        help="the model file (default: out/model.keras)")
    parser.add_argument("--prompt", default=None,
                        help="text for a language model to continue (default: empty, which starts from a new line)")
    parser.add_argument("--source", default=None, metavar="TEXT",
                        help="for a seq2seq model: the source to write the target of")
    parser.add_argument("--source-file", type=pathlib.Path, default=None, metavar="FILE",
                        help="for a seq2seq model: a file of sources, one a line; prints one target a line")
    parser.add_argument("--max-new-tokens", type=int, default=500, metavar="N",
                        help="tokens to add to the prompt (default: 500); a seq2seq target has at most its "
                             "model's block size less one")
    parser.add_argument("--temperature", type=float, default=None,
                        help="below 1 is safer, above 1 wilder; 0 always takes the likeliest token "
                             "(default: 0.8; for a seq2seq model, 0)")
    parser.add_argument("--top-k", type=int, default=200, metavar="K",
                        help="sample only among the K likeliest tokens (default: 200)")
    parser.add_argument("--top-p", type=float, default=1.0, metavar="P",
                        help="sample only among the likeliest tokens whose probabilities add up to P "
                             "(nucleus sampling; default: 1.0, off)")
    parser.add_argument("--seed", type=int, default=None,
                        help="make the samples repeatable (default: different each run)")
    parser.add_argument("--num-samples", type=int, default=1, metavar="N",
                        help="how many samples to draw, together in one batch (default: 1)")
    parser.add_argument("--stop", action="append", default=[], metavar="STRING",
                        help="end the text just before STRING appears (may be given more than once)")
    parser.add_argument("--num-beams", type=int, default=None, metavar="N",
                        help="instead of sampling, search for the likeliest text with N beams "
                             "(1 is greedy; the sampling flags do not apply; printed when complete)")
    parser.add_argument("--no-stream", dest="stream", action="store_false",
                        help="print the text when it is complete, not as it is produced")
    parser.add_argument("--slide", type=int, default=1, metavar="N",
                        help="past the context window, move it N tokens at a time: 1 (the default) gives "
                             "every token the whole context; more is faster with less context")
    parser.add_argument("--no-cache", dest="use_cache", action="store_false",
                        help="recompute the whole context for every token: the same text, slower")
    _add_unknown_flag(parser, "prompt characters the model never saw")
    inside = parser.add_argument_group("seeing inside (instead of sampling)")
    inside.add_argument("--attention", type=pathlib.Path, default=None, metavar="FILE",
                        help="draw the attention weights over the prompt's tokens (a seq2seq model: its source "
                             "and the target it writes) to FILE (.png, .svg or .pdf): a heatmap per layer (rows) "
                             "and head (columns); a prompt longer than 64 tokens shows its last 64")
    inside.add_argument("--layer", type=int, default=None, metavar="L",
                        help="with --attention: draw layer L only (from 0)")
    inside.add_argument("--head", type=int, default=None, metavar="H",
                        help="with --attention: draw head H only (from 0); with --layer, that one head, large")
    inside.add_argument("--part", choices=inspection.PARTS, default=None,
                        help="with --attention, for a seq2seq model: the encoder's attention, the decoder's "
                             "self-attention, or cross-attention from target to source (the default)")
    _add_backend_flag(parser)
    return parser


def _generate(args):
    from gptlite import generation, saving
    from gptlite.model import Seq2Seq

    drawing_flags = [flag for flag, value in (("--layer", args.layer), ("--head", args.head), ("--part", args.part))
                     if value is not None]
    if drawing_flags and args.attention is None:
        raise InputError(f"{drawing_flags[0]} chooses what --attention FILE draws; give --attention too")
    if args.attention is not None:
        _draw_attention(args)
        return
    if args.num_samples < 1:
        raise InputError(f"--num-samples must be at least 1, got {args.num_samples}")
    if args.num_beams is not None and args.num_beams < 1:
        raise InputError(f"--num-beams must be at least 1, got {args.num_beams}")
    if args.num_beams is not None and args.num_samples > 1:
        raise InputError("--num-beams finds one text; it cannot be combined with --num-samples")
    # Checked before the model loads, so that a bad flag fails at once.
    generation.check_sampling_settings(args.max_new_tokens, args.temperature or 0.0, args.top_k, args.top_p)
    model = saving.load(args.model)
    if isinstance(model, Seq2Seq):
        _generate_targets(args, model)
        return
    if args.source is not None or args.source_file is not None:
        raise InputError(f"{args.model} is a language model: give it --prompt TEXT to continue, not a source")
    prompt = args.prompt or ""
    settings = dict(max_new_tokens=args.max_new_tokens,
                    temperature=0.8 if args.temperature is None else args.temperature, top_k=args.top_k,
                    top_p=args.top_p, seed=args.seed, unknown=args.unknown, stop=args.stop,
                    use_cache=args.use_cache, slide=args.slide)
    if args.num_beams is not None:
        # The best beam can change up to the last step, so nothing can be shown before it.
        _print_piece(generation.generate(model, prompt, num_beams=args.num_beams, **settings))
    elif args.stream and args.num_samples == 1:
        pieces = generation.stream(model, prompt, **settings)
        _print_piece(prompt)
        for piece in pieces:
            _print_piece(piece)
    else:
        # Several samples are drawn in one batch, so they are printed when complete.
        texts = generation.generate(model, [prompt] * args.num_samples, **settings)
        _print_piece(SAMPLE_DIVIDER.join(texts))
    print()


def _generate_targets(args, model):
    """Print a seq2seq model's target for each source, one a line (--num-samples of them for each)."""
    from gptlite import generation
    from gptlite.files import read_text

    if args.prompt is not None:
        raise InputError(f"{args.model} is a seq2seq model: give it --source TEXT or --source-file FILE, "
                         f"not --prompt")
    if (args.source is None) == (args.source_file is None):
        raise InputError(f"{args.model} is a seq2seq model: give it one of --source TEXT and --source-file FILE")
    if args.slide != 1:
        raise InputError("--slide moves a language model's context window; a seq2seq target never outgrows its own")
    if args.source is not None:
        sources = [args.source]
    else:
        sources = read_text(args.source_file).splitlines()
    targets = generation.iter_targets(
        model, [source for source in sources for _ in range(args.num_samples)],
        max_new_tokens=args.max_new_tokens, temperature=args.temperature or 0.0, top_k=args.top_k,
        top_p=args.top_p, seed=args.seed, unknown=args.unknown, stop=args.stop, use_cache=args.use_cache,
        num_beams=args.num_beams)
    for target in targets:
        print(target, flush=True)


def _draw_attention(args):
    from gptlite import generation, inspection, saving
    from gptlite.model import Seq2Seq
    from gptlite.text import known_text

    model = saving.load(args.model)
    if isinstance(model, Seq2Seq):
        if args.prompt is not None or args.source is None:
            raise InputError(f"{args.model} is a seq2seq model: --attention draws its attention for --source TEXT")
        text, target = args.source, generation.generate_target(model, args.source, unknown=args.unknown)
    else:
        if args.prompt is None or args.source is not None:
            raise InputError(f"{args.model} is a language model: --attention draws its attention over --prompt TEXT")
        if args.part not in (None, "decoder"):
            raise InputError(f"{args.model} is a language model: it has causal self-attention only, no --part")
        text, target = args.prompt, None
    maps = inspection.attention_maps(model, text, part=args.part, target=target, unknown=args.unknown)
    inspection.plot_attention(maps, args.attention, layer=args.layer, head=args.head)
    if target is not None:
        written_for = f"{text!r} -> {target!r}"
    else:
        known_prompt = known_text(model.tokenizer, text, args.unknown, "prompt")
        prompt_length = len(model.tokenizer.encode(known_prompt))
        written_for = f"{len(maps.tokens)} tokens" if prompt_length == len(maps.tokens) else \
            f"the last {len(maps.tokens)} of {prompt_length} tokens, the model's context"
    print(f"wrote {args.attention} ({maps.title} for {written_for})")


def _print_piece(text):
    sys.stdout.write(text)
    sys.stdout.flush()


# --- export --------------------------------------------------------------------


def _export_parser(prog):
    parser = _Parser(prog=prog,
                     description="Write a trained model in a form other programs can serve without gptlite.")
    parser.add_argument("--model", type=pathlib.Path, default=pathlib.Path("out/model.keras"),
                        help="the model file (default: out/model.keras)")
    parser.add_argument("--format", choices=["saved_model", "hf", "kerashub"], default="saved_model",
                        help="saved_model: a TensorFlow SavedModel, token ids in, next-token logits out (the "
                             "default); hf: a Hugging Face GPT-2 folder (transformers' GPT2LMHeadModel and "
                             "AutoTokenizer load it); kerashub: a KerasHub GPT-2 preset (GPT2CausalLM.from_preset)")
    parser.add_argument("--out", type=pathlib.Path, required=True, help="the folder to write; must not exist")
    _add_backend_flag(parser)
    return parser


def _export(args):
    from gptlite import pretrained, saving

    # Checked before the model loads, so that the mistake shows at once (export checks again).
    if args.format == "saved_model":
        saving.check_export_backend()
    if args.out.exists():
        raise RunExistsError(f"{args.out} already exists; choose another --out")
    model = saving.load(args.model)
    if args.format == "hf":
        pretrained.export_hugging_face(model, args.out)
        print(f"wrote {args.out}: load it with transformers.GPT2LMHeadModel.from_pretrained and "
              f"AutoTokenizer.from_pretrained")
    elif args.format == "kerashub":
        pretrained.export_kerashub(model, args.out)
        print(f"wrote {args.out}: load it with keras_hub.models.GPT2CausalLM.from_preset")
    else:
        saving.export_saved_model(model, args.out)
        print(f"wrote {args.out}: load it with tf.saved_model.load; its 'serve' signature maps token_ids "
              f"(batch, up to {model.config.block_size} tokens, int32) to the next token's logits")


# --- evaluation ----------------------------------------------------------------


def _eval_parser(prog):
    parser = _Parser(prog=prog, description="Measure a model on files: a GPT on text (loss per token, perplexity, bits "
                                            "per character and per byte), a seq2seq model on source<TAB>target lines "
                                            "(exact match and loss per target token); see docs/evaluation.md.")
    parser.add_argument("model", type=pathlib.Path, help="the model file (a model.keras)")
    parser.add_argument("texts", nargs="+", type=pathlib.Path, metavar="FILE",
                        help="text files, or folders of them (a seq2seq model: files of source<TAB>target lines), "
                             "each scored on its own")
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of a table")
    parser.add_argument("--encoding", default="utf-8", help="the files' encoding (default: utf-8)")
    parser.add_argument("--errors", choices=["strict", "replace"], default="strict",
                        help="bytes that do not decode: stop with an error (the default) or replace them")
    _add_unknown_flag(parser, "characters the model never saw")
    _add_backend_flag(parser)
    return parser


def _eval(args):
    from gptlite import evaluation, saving

    model = saving.load(args.model)
    result = evaluation.evaluate(model, args.texts, encoding=args.encoding, errors=args.errors,
                                 unknown=args.unknown, verbose=0 if args.json else sys.stdout.isatty())
    if args.json:
        print(json.dumps({"model": str(args.model), "sources": [score.as_dict() for score in result.sources],
                          "total": result.total.as_dict()}, indent=1))
        return
    rows = result.sources + ([result.total] if len(result.sources) > 1 else [])
    if isinstance(result.total, evaluation.PairScore):
        print(f"{'pairs file':<30} {'exact':>7} {'loss':>7} {'ppl':>9} {'bits/char':>9} {'pairs':>9} {'tokens':>11} "
              f"{'seconds':>8}")
        for score in rows:
            print(f"{score.name[-30:]:<30} {score.exact_match:>7.1%} {score.loss:>7.4f} {score.perplexity:>9.3f} "
                  f"{score.bits_per_character:>9.4f} {score.pairs:>9,} {score.tokens:>11,} {score.seconds:>8.1f}")
        return
    print(f"{'text':<30} {'loss':>7} {'ppl':>9} {'bits/char':>9} {'bits/byte':>9} {'tokens':>11} {'bytes':>11} "
          f"{'seconds':>8}")
    for score in rows:
        print(f"{score.name[-30:]:<30} {score.loss:>7.4f} {score.perplexity:>9.3f} {score.bits_per_character:>9.4f} "
              f"{score.bits_per_byte:>9.4f} {score.tokens:>11,} {score.bytes:>11,} {score.seconds:>8.1f}")


# --- serving -------------------------------------------------------------------


def _serve_parser(prog):
    from gptlite import serving

    defaults = serving.ServeSettings()
    parser = _Parser(prog=prog, description="Serve a model over HTTP: OpenAI's completions API at /v1, batching "
                                            "requests that arrive together, and a page to try it at / "
                                            "(see docs/serve.md). Needs gptlite[serve].")
    parser.add_argument("model", type=pathlib.Path, help="the model file (a model.keras)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="the address to listen on (default: 127.0.0.1, this machine only; 0.0.0.0 for every "
                             "network, best with --api-key)")
    parser.add_argument("--port", type=int, default=8000, help="the port (default: 8000)")
    parser.add_argument("--name", default=None,
                        help="the model's name in the API (default: the run folder's name, or the file's)")
    parser.add_argument("--api-key", default=os.environ.get("GPTLITE_API_KEY"), metavar="KEY",
                        help="require 'Authorization: Bearer KEY' on every API call (default: GPTLITE_API_KEY, "
                             "else none)")
    parser.add_argument("--batch-window-ms", type=float, default=defaults.batch_window_ms, metavar="MS",
                        help=f"how long a request waits for others to share its batch (default: "
                             f"{defaults.batch_window_ms:g})")
    parser.add_argument("--max-batch", type=int, default=defaults.max_batch, metavar="N",
                        help=f"rows decoded together at most (default: {defaults.max_batch})")
    parser.add_argument("--max-queue", type=int, default=defaults.max_queue, metavar="N",
                        help=f"requests waiting at most; more are answered 503 (default: {defaults.max_queue})")
    parser.add_argument("--max-tokens-limit", type=int, default=defaults.max_tokens_limit, metavar="N",
                        help=f"the most max_tokens a request may ask for (default: {defaults.max_tokens_limit})")
    parser.add_argument("--max-n", type=int, default=defaults.max_n, metavar="N",
                        help=f"the most choices a request may ask for per prompt (default: {defaults.max_n})")
    parser.add_argument("--truncate", choices=["left", "none"], default=defaults.truncate,
                        help="a prompt longer than the model's context: cut from the left as generate does (the "
                             "default), or refused (none)")
    _add_backend_flag(parser)
    return parser


def _serve(args):
    import importlib.util

    from gptlite import serving

    if importlib.util.find_spec("starlette") is None or importlib.util.find_spec("uvicorn") is None:
        raise InputError("serving needs starlette and uvicorn: pip install \"gptlite[serve]\"")
    if not 0 < args.port < 65536:
        raise InputError(f"--port must be from 1 to 65535, got {args.port}")
    settings = serving.ServeSettings(batch_window_ms=args.batch_window_ms, max_batch=args.max_batch,
                                     max_queue=args.max_queue, max_tokens_limit=args.max_tokens_limit,
                                     max_n=args.max_n, api_key=args.api_key, truncate=args.truncate)
    serving.serve(args.model, args.host, args.port, settings, name=args.name)


# --- inspection ----------------------------------------------------------------


def _inspect_parser(prog):
    parser = _Parser(prog=prog,
                     description="Look inside a trained model: what it predicts and attends to at each position "
                                 "of a text, and its position encoding.")
    parser.add_argument("model", type=pathlib.Path, metavar="MODEL", help="the model file (a model.keras)")
    parser.add_argument("--prompt", default=None, metavar="TEXT",
                        help="for a language model: print, for each position, the likeliest next tokens and the "
                             "tokens each layer attends to most")
    parser.add_argument("--source", default=None, metavar="TEXT",
                        help="for a seq2seq model: the same for each position of the target it writes for TEXT, "
                             "with the source tokens each layer attends to most")
    parser.add_argument("--target", default=None, metavar="TEXT",
                        help="with --source: inspect this target instead of the model's own")
    parser.add_argument("--top", type=int, default=5, metavar="K",
                        help="how many next tokens and attended tokens to show (default: 5)")
    parser.add_argument("--json", action="store_true", help="print the same as JSON")
    parser.add_argument("--positions", type=pathlib.Path, default=None, metavar="FILE",
                        help="draw the position encoding and the similarity of positions to FILE "
                             "(.png, .svg or .pdf)")
    _add_unknown_flag(parser, "characters the model never saw")
    _add_backend_flag(parser)
    return parser


def _inspect(args):
    from gptlite import inspection, saving
    from gptlite.model import Seq2Seq

    if args.top < 1:
        raise InputError(f"--top must be at least 1, got {args.top}")
    if args.prompt is None and args.source is None and args.positions is None:
        raise InputError("give --prompt TEXT (a language model), --source TEXT (a seq2seq model) "
                         "or --positions FILE")
    if args.target is not None and args.source is None:
        raise InputError("--target goes with --source")
    model = saving.load(args.model)
    text = args.source if isinstance(model, Seq2Seq) else args.prompt
    if isinstance(model, Seq2Seq) and args.prompt is not None:
        raise InputError(f"{args.model} is a seq2seq model: give it --source TEXT, not --prompt")
    if not isinstance(model, Seq2Seq) and args.source is not None:
        raise InputError(f"{args.model} is a language model: give it --prompt TEXT, not --source")
    messages = sys.stderr if args.json else sys.stdout
    if args.positions is not None:
        inspection.plot_positions(model, args.positions)
        print(f"wrote {args.positions} ({model.config.position} position encoding, "
              f"{model.config.block_size} positions)", file=messages)
    if text is None:
        return
    report = inspection.token_report(model, text, top=args.top, target=args.target, unknown=args.unknown)
    if args.json:
        print(json.dumps(report, ensure_ascii=False, indent=1))
    else:
        print(_report_text(report))


def _report_text(report):
    """The token report as lines: each position's token, likeliest next tokens, and per layer the most attended."""
    attended = "source tokens" if report["part"] == "cross" else "earlier tokens"
    lines = [f"{len(report['positions'])} positions; next-token probabilities, then per layer the {attended} "
             f"attended to most (weights averaged over the heads)"]
    for row in report["positions"]:
        candidates = ", ".join(f"{c['token']!r} {c['probability']:.1%}" for c in row["next"])
        lines.append(f"{row['position']:>4} {row['token']!r:<8} next: {candidates}")
        for layer, layer_attended in enumerate(row["attention"]):
            looked_at = ", ".join(f"{a['token']!r}@{a['position']} {a['weight']:.0%}" for a in layer_attended)
            lines.append(f"{'':>13}layer {layer}: {looked_at}")
    return "\n".join(lines)


train_main = _command("gptlite-train", _train_parser, _train)
generate_main = _command("gptlite-generate", _generate_parser, _generate)
export_main = _command("gptlite-export", _export_parser, _export)
inspect_main = _command("gptlite-inspect", _inspect_parser, _inspect)
eval_main = _command("gptlite-eval", _eval_parser, _eval)
serve_main = _command("gptlite-serve", _serve_parser, _serve)
COMMANDS = {"train": train_main, "generate": generate_main, "export": export_main, "inspect": inspect_main,
            "eval": eval_main, "serve": serve_main}


def main(argv=None):
    """`gptlite train|generate|export|inspect|eval|serve ...`: each command under one name."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] not in COMMANDS:
        print(f"usage: gptlite {{{','.join(COMMANDS)}}} ... (gptlite COMMAND --help for its options)",
              file=sys.stderr)
        return 2
    return COMMANDS[argv[0]](argv[1:])


if __name__ == "__main__":
    sys.exit(main())
