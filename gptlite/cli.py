"""The commands `gptlite-train`, `gptlite-generate`, `gptlite-export`, `gptlite-inspect` and `gptlite`
(also `train.py`, `generate.py`).

They start in `gptlite_launch`, which applies `--backend` before Keras is imported.
"""

import argparse
import contextlib
import dataclasses
import json
import pathlib
import sys
import tempfile

from gptlite import data, generation, inspection, pairs, saving, training
from gptlite.errors import (
    ConfigError,
    GPTLiteError,
    InputError,
    RunExistsError,
    TrainingDiverged,
    TrainingInterrupted,
)
from gptlite.model import GPT, GPTConfig, Seq2Seq
from gptlite.tokenizers import BPETokenizer, CharTokenizer
from gptlite_launch import BACKENDS

SAMPLE_DIVIDER = "\n" + "-" * 40 + "\n"
DEFAULT_BPE_VOCABULARY = 4096
SETTING_CHOICES = {"position": ["learned", "sinusoidal"], "precision": list(training.PRECISIONS)}


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        # One line, like every other user mistake, instead of usage plus error.
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _run(command, parser, argv):
    args = parser.parse_args(argv)
    try:
        _check_backend(args.backend)
        command(args)
    except TrainingInterrupted as stop:
        print(f"{parser.prog}: {stop}", file=sys.stderr)
        return 128 + stop.signal_number
    except GPTLiteError as error:
        if args.debug:
            raise
        print(f"{parser.prog}: error: {error}", file=sys.stderr)
        # A diverged run is no usage mistake: it gets the general failure status.
        return 1 if isinstance(error, TrainingDiverged) else 2
    except KeyboardInterrupt:
        print(f"\n{parser.prog}: interrupted", file=sys.stderr)
        return 130
    return 0


def _add_backend_flag(parser):
    parser.add_argument("--backend", choices=BACKENDS, default=None,
                        help="the Keras backend to run on (default: KERAS_BACKEND, else tensorflow); "
                             "see the README for which to pick")


def _check_backend(requested):
    """`--backend` takes effect in gptlite_launch, before Keras is imported; here it can only be checked."""
    import keras

    if requested and keras.backend.backend() != requested:
        raise ConfigError(
            f"--backend {requested} came too late: Keras is already running on {keras.backend.backend()} "
            f"in this process; set KERAS_BACKEND={requested} before importing Keras or gptlite"
        )


# --- training ------------------------------------------------------------------


def train_main(argv=None):
    return _run(_train, _train_parser(), argv)


def _train_parser():
    parser = _Parser(
        prog="gptlite-train",
        description="Train a GPT on text files, or a seq2seq model on source<TAB>target pairs, "
                    "and save it as model.keras.",
    )
    parser.add_argument(
        "texts", nargs="*", type=pathlib.Path, metavar="TEXT",
        help="UTF-8 text files, or folders of them, to train on (default: about 2 MB of the Python "
             "standard library's sources); several are read in the order given, a folder's files in sorted order; "
             "with --task seq2seq, one file of source<TAB>target lines",
    )
    parser.add_argument("--task", choices=["lm", "seq2seq"], default=None,
                        help="lm: a GPT that continues text (the default); seq2seq: an encoder-decoder that learns "
                             "to write each line's target from its source")
    parser.add_argument("--synthetic", choices=pairs.SYNTHETIC_TASKS, default=None,
                        help="train seq2seq on a built-in task instead of a file: addition (\"123+456\" -> \"579\"), "
                             "reverse or sort (strings of 5 to 20 letters); steps, unless "
                             f"--max-iters says: {', '.join(f'{t} {n}' for t, n in training.SYNTHETIC_MAX_ITERS.items())}")
    parser.add_argument("--tokenizer", choices=["char", "bpe"], default="char",
                        help="char: one token per character (the default); bpe: byte-level byte-pair "
                             "encoding learned from the text, for large or many-language corpora")
    parser.add_argument("--vocab-size", type=int, default=None, metavar="N",
                        help=f"tokens in a BPE vocabulary (default: {DEFAULT_BPE_VOCABULARY})")
    parser.add_argument("--preset", choices=sorted(training.PRESETS), default=None,
                        help=f"model size and schedule (default: {training.DEFAULT_PRESET})")
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("out"),
                        help="folder for model.keras, history.csv, loss.png and checkpoints (default: out)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace a run already in --out")
    parser.add_argument("--resume", action="store_true",
                        help="continue the run in --out from its last checkpoint")
    parser.add_argument("--encoding", default="utf-8",
                        help="the text file's encoding (default: utf-8)")
    parser.add_argument("--errors", choices=["strict", "replace"], default="strict",
                        help="bytes that do not decode: stop with an error (strict, the default) "
                             "or replace them with U+FFFD (replace)")
    parser.add_argument("--distribute", action="store_true",
                        help="train data-parallel over every local device (tensorflow: GPUs, else CPU devices; "
                             "jax: all devices), or over several hosts (see the README); the batch is split "
                             "across them and the learning rate is unchanged")
    _add_backend_flag(parser)
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    settings = parser.add_argument_group("settings (each overrides the preset's value)")
    fields = {f.name: f for f in dataclasses.fields(GPTConfig) + dataclasses.fields(training.TrainingConfig)}
    for field in (fields[name] for name in training.SETTING_NAMES):
        flag = "--" + field.name.replace("_", "-")
        preset_values = ", ".join(
            f"{name}: {values[field.name]}" for name, values in training.PRESETS.items()
            if field.name in values
        )
        help_text = f"presets: {preset_values}" if preset_values else f"default: {field.default}"
        if field.type is bool:
            settings.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=help_text)
        elif field.name in SETTING_CHOICES:
            settings.add_argument(flag, choices=SETTING_CHOICES[field.name], default=None, help=help_text)
        else:
            metavar = "N" if field.type is int else "X"
            settings.add_argument(flag, type=field.type, default=None, metavar=metavar, help=help_text)
    return parser


def _train(args):
    seq2seq = _is_seq2seq(args)
    if args.resume and args.overwrite:
        raise ConfigError("--resume and --overwrite contradict each other; choose one")
    checkpoint = training.read_checkpoint(args.out) if args.resume else None
    if checkpoint and (checkpoint.get("model_class", "GPT") == "Seq2Seq") != seq2seq:
        saved_task = "lm" if seq2seq else "seq2seq"
        raise ConfigError(f"the run in {args.out} trains a {saved_task} model; resume it with --task {saved_task}")
    defaults = training.default_settings(seq2seq, args.synthetic)
    model_settings, training_settings = training.split_settings(_resolve_settings(args, checkpoint, defaults))
    training_config = training.TrainingConfig(**training_settings)
    GPTConfig(**model_settings)  # fail on a bad shape before reading any text
    if checkpoint and checkpoint["step"] >= training_config.max_iters:
        raise InputError(
            f"the run in {args.out} has already done its {checkpoint['step']} steps; "
            f"pass a larger --max-iters to train it further"
        )
    if args.vocab_size is not None and (args.tokenizer != "bpe" or checkpoint):
        raise ConfigError("--vocab-size sets the size of a new BPE vocabulary: it goes with --tokenizer bpe, "
                          "and not with --resume")
    if seq2seq:
        _check_seq2seq_flags(args)
    if not args.resume:
        _check_output_folder(args.out, args.overwrite)

    import keras

    keras.utils.set_random_seed(training_config.seed)
    if seq2seq:
        model, rows, held_out = _build_and_train_seq2seq(args, checkpoint, model_settings, training_config)
    else:
        if args.texts:
            corpus = data.Corpus.from_files(args.texts, args.encoding, args.errors)
        else:
            corpus = data.Corpus.from_text(data.default_corpus(), "the Python standard library's sources")
        with (training.data_parallel(training_config.batch_size) if args.distribute
              else contextlib.nullcontext()) as replicas:
            model, rows = _build_and_train(args, corpus, checkpoint, model_settings, training_config, replicas)
    best = min(rows, key=lambda row: row["val_loss"])
    print(
        f"\nbest validation loss {best['val_loss']:.4f} at step {best['step']}; "
        f"saved {args.out / 'model.keras'}, {args.out / 'history.csv'}, {args.out / 'loss.png'}"
    )
    if seq2seq:
        _show_targets(model, held_out)
        return
    print("sample from the final model:\n")
    for piece in generation.stream(model, "", max_new_tokens=300, temperature=0.8, top_k=200,
                                   seed=training_config.seed):
        _print_piece(piece)
    print()


def _is_seq2seq(args):
    if args.synthetic and args.task == "lm":
        raise ConfigError("--synthetic tasks train a seq2seq model; leave out --task lm")
    return args.task == "seq2seq" or args.synthetic is not None


def _check_seq2seq_flags(args):
    if args.tokenizer != "char":
        raise ConfigError("the seq2seq model reads characters; --tokenizer bpe is for language models")
    if args.distribute:
        raise ConfigError("--distribute trains language models only for now")
    if args.synthetic and args.texts:
        raise ConfigError(f"--synthetic {args.synthetic} makes its own pairs; leave out the file")
    if not args.synthetic and len(args.texts) != 1:
        raise ConfigError("--task seq2seq trains on one file of source<TAB>target lines, or on --synthetic TASK")


def _build_and_train_seq2seq(args, checkpoint, model_settings, training_config):
    """Read or make the pairs, make the model (new, or from the checkpoint) and train it.

    Returns (model, evaluation rows, held-out pairs). The held-out pairs are
    chosen by the seed, so a resumed run holds out the same ones.
    """
    if args.synthetic:
        train_pairs, held_out = pairs.synthetic(args.synthetic, training_config.seed)
        name = f"the synthetic {args.synthetic} task"
    else:
        train_pairs, held_out = pairs.split(pairs.read_pairs(args.texts[0], args.encoding, args.errors),
                                            training_config.seed)
        name = str(args.texts[0])
    if checkpoint:
        model = Seq2Seq.from_config(checkpoint["model_config"])
        tokenizer, block_size = model.tokenizer, model.config.block_size
    else:
        texts = (text for part in (train_pairs, held_out) for text in part.sources + part.targets)
        tokenizer = CharTokenizer.from_texts(texts, special_tokens=CharTokenizer.SPECIAL_TOKENS)
        block_size = model_settings.pop("block_size", None) or pairs.block_size_needed(tokenizer, train_pairs,
                                                                                       held_out)
        model = Seq2Seq.from_gpt_config(
            GPTConfig(vocab_size=tokenizer.vocabulary_size, block_size=block_size, **model_settings), tokenizer,
            dtype=training.dtype_policy(training_config.precision))
    train_set = pairs.encode(train_pairs, tokenizer, block_size)
    held_out_set = pairs.encode(held_out, tokenizer, block_size)
    model.build()
    config = model.config
    print(
        f"training on {name}: {len(train_pairs):,} pairs, {len(held_out):,} held out "
        f"({tokenizer.vocabulary_size - len(tokenizer.special_tokens)} characters)\n"
        f"model: seq2seq, encoder and decoder of {config.n_layer} layers each, {config.n_head} heads, width "
        f"{config.n_embd}, sources and targets of up to {config.block_size} tokens, {model.count_params():,} "
        f"parameters; {_backend_and_precision(training_config)}\n"
        + _schedule(training_config, checkpoint, None)
        + f"; exact match measured on {min(len(held_out), pairs.HELD_OUT_PAIRS):,} held-out pairs",
        flush=True,
    )
    rows = training.train(model, train_set, held_out_set, training_config, args.out, resume=bool(checkpoint))
    return model, rows, held_out


def _show_targets(model, held_out, count=8):
    """Print what the final model writes for a few held-out sources, and its exact match on them all."""
    # As many as the evaluations decoded, in batches of the same size: no new compile.
    measured = held_out.subset(range(min(len(held_out), pairs.HELD_OUT_PAIRS)))
    decoded = generation.generate_target(model, measured.sources)
    right = sum(got == want for got, want in zip(decoded, measured.targets))
    print(f"the final model decodes {right:,} of {len(measured):,} held-out pairs exactly; a few:")
    for source, want, got in list(zip(measured.sources, measured.targets, decoded))[:count]:
        print(f"  {source!r} -> {got!r}" + ("" if got == want else f"   (expected {want!r})"))


def _backend_and_precision(training_config):
    import keras

    return f"{keras.backend.backend()} backend, {training_config.precision}"


def _schedule(training_config, checkpoint, replicas):
    return (
        (f"resuming at step {checkpoint['step']} of " if checkpoint else "")
        + f"{training_config.max_iters} steps of batch {training_config.batch_size}"
        + (f" split across {replicas} devices" if replicas else "") + "; "
        f"validation loss every {training_config.eval_interval} steps, "
        f"checkpoint every {training_config.checkpoint_interval}"
    )


def _build_and_train(args, corpus, checkpoint, model_settings, training_config, replicas):
    """Make the model (new, or from the checkpoint) and train it; (model, evaluation rows).

    `replicas`: how many devices share each batch, or None when not distributed.
    """
    show_progress = sys.stdout.isatty()
    if checkpoint:
        model = GPT.from_config(checkpoint["model_config"])
        tokenizer = model.tokenizer
    else:
        tokenizer = _new_tokenizer(args, corpus, show_progress)
        model = GPT.from_gpt_config(GPTConfig(vocab_size=tokenizer.vocabulary_size, **model_settings), tokenizer,
                                    dtype=training.dtype_policy(training_config.precision))
    config = model.config
    try:
        token_ids = data.encode_corpus(corpus, tokenizer, args.out, show_progress)
    except InputError as error:
        if checkpoint and any(tokenizer.unknown_characters(piece) for piece in corpus.pieces()):
            raise InputError(f"{error}: resume with the text the run started on") from None
        raise
    train_ids, validation_ids = data.split(token_ids)
    data.check_enough_tokens(train_ids, validation_ids, config.block_size)
    model.build((None, config.block_size))
    kind = "characters" if isinstance(tokenizer, CharTokenizer) else "byte-level BPE tokens"
    print(
        f"training on {corpus.name}: {len(token_ids):,} tokens ({kind}, {tokenizer.vocabulary_size:,} in the "
        f"vocabulary); {len(train_ids):,} train / {len(validation_ids):,} validation\n"
        f"model: {config.n_layer} layers, {config.n_head} heads, width {config.n_embd}, "
        f"context {config.block_size}, {model.count_params():,} parameters; "
        f"{_backend_and_precision(training_config)}\n"
        + _schedule(training_config, checkpoint, replicas),
        flush=True,
    )
    rows = training.train(model, train_ids, validation_ids, training_config, args.out, resume=bool(checkpoint))
    return model, rows


def _new_tokenizer(args, corpus, show_progress):
    if args.tokenizer == "bpe":
        vocabulary_size = args.vocab_size or DEFAULT_BPE_VOCABULARY
        print(f"learning a {vocabulary_size:,}-token byte-level BPE vocabulary from {corpus.name} "
              f"(a sample of up to {data.BPE_SAMPLE_BYTES // 2**20} MB)", flush=True)
        return BPETokenizer.train(corpus.sample(data.BPE_SAMPLE_BYTES), vocabulary_size, show_progress)
    tokenizer = CharTokenizer.from_texts(corpus.pieces())
    if not tokenizer.vocabulary.strip():
        raise InputError(f"{corpus.name} has no text in it")
    return tokenizer


def _resolve_settings(args, checkpoint, defaults):
    """The defaults (`training.default_settings`), then the --preset's values,
    then explicit flags; on resume, the checkpoint's values first.

    A resumed run may change how it trains (say, more --max-iters), never the
    model's shape or its precision.
    """
    explicit = {
        name: value for name, value in vars(args).items()
        if name in training.SETTING_NAMES and value is not None
    }
    requested = {**(training.PRESETS[args.preset] if args.preset else {}), **explicit}
    if checkpoint is None:
        return {**defaults, **requested}
    saved = {name: checkpoint["model_config"][name] for name in training.MODEL_SHAPE_SETTINGS}
    # The optimizer state saved with float16 has a loss scale that the others lack.
    saved["precision"] = checkpoint["training_config"].get("precision", "fp32")
    conflicts = [
        f"{name} is {saved[name]} in the checkpoint, {value} here"
        for name, value in requested.items()
        if name in saved and value != saved[name]
    ]
    if conflicts:
        raise ConfigError(
            f"cannot resume with a different model: {'; '.join(conflicts)}; "
            f"drop those flags, or start a new run in another --out"
        )
    return {**saved, **checkpoint["training_config"],
            **{name: value for name, value in requested.items() if name not in saved}}


def _check_output_folder(out, overwrite):
    if out.exists() and not out.is_dir():
        raise InputError(f"--out {out} is a file, not a folder")
    existing = [out / name for name in ("model.keras", training.CHECKPOINT_STATE) if (out / name).exists()]
    if existing and not overwrite:
        raise RunExistsError(
            f"{existing[0]} already exists; pass --resume to continue that run, "
            f"--overwrite to replace it, or choose another --out"
        )
    try:
        out.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=out).close()
    except OSError as error:
        raise InputError(f"cannot write to --out {out}: {error.strerror}") from None
    if overwrite:
        # The replaced run's checkpoint must not be resumed into the new one.
        for name in (training.CHECKPOINT_STATE, training.CHECKPOINT_WEIGHTS):
            (out / name).unlink(missing_ok=True)


# --- generation ----------------------------------------------------------------


def generate_main(argv=None):
    return _run(_generate, _generate_parser(), argv)


def _generate_parser():
    parser = _Parser(prog="gptlite-generate", description="Sample text from a trained gptlite model.")
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
    parser.add_argument("--unknown", choices=["error", "skip", "replace"], default="error",
                        help="prompt characters the model never saw: stop with an error (the default), "
                             "leave them out, or replace each with a space")
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
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    return parser


def _generate(args):
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
        sources = data.read_text(args.source_file).splitlines()
    targets = generation.iter_targets(
        model, [source for source in sources for _ in range(args.num_samples)],
        max_new_tokens=args.max_new_tokens, temperature=args.temperature or 0.0, top_k=args.top_k,
        top_p=args.top_p, seed=args.seed, unknown=args.unknown, stop=args.stop, use_cache=args.use_cache,
        num_beams=args.num_beams)
    for target in targets:
        print(target, flush=True)


def _draw_attention(args):
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
        known_prompt = generation.known_text(model.tokenizer, text, args.unknown, "prompt")
        prompt_length = len(model.tokenizer.encode(known_prompt))
        written_for = f"{len(maps.tokens)} tokens" if prompt_length == len(maps.tokens) else \
            f"the last {len(maps.tokens)} of {prompt_length} tokens, the model's context"
    print(f"wrote {args.attention} ({maps.title} for {written_for})")


def _print_piece(text):
    sys.stdout.write(text)
    sys.stdout.flush()


# --- export --------------------------------------------------------------------


def export_main(argv=None):
    return _run(_export, _export_parser(), argv)


def _export_parser():
    parser = _Parser(prog="gptlite-export",
                     description="Write a trained model in a form other programs can serve without gptlite.")
    parser.add_argument("--model", type=pathlib.Path, default=pathlib.Path("out/model.keras"),
                        help="the model file (default: out/model.keras)")
    parser.add_argument("--format", choices=["saved_model"], default="saved_model",
                        help="saved_model: a TensorFlow SavedModel, token ids in, next-token logits out "
                             "(the default and, for now, the only format)")
    parser.add_argument("--out", type=pathlib.Path, required=True, help="the folder to write; must not exist")
    _add_backend_flag(parser)
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    return parser


def _export(args):
    # Checked before the model loads, so that the mistake shows at once (export checks again).
    saving.check_export_backend()
    if args.out.exists():
        raise RunExistsError(f"{args.out} already exists; choose another --out")
    model = saving.load(args.model)
    saving.export_saved_model(model, args.out)
    print(f"wrote {args.out}: load it with tf.saved_model.load; its 'serve' signature maps token_ids "
          f"(batch, up to {model.config.block_size} tokens, int32) to the next token's logits")


# --- inspection ----------------------------------------------------------------


def inspect_main(argv=None):
    return _run(_inspect, _inspect_parser(), argv)


def _inspect_parser():
    parser = _Parser(prog="gptlite-inspect",
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
    parser.add_argument("--unknown", choices=["error", "skip", "replace"], default="error",
                        help="characters the model never saw: stop with an error (the default), "
                             "leave them out, or replace each with a space")
    _add_backend_flag(parser)
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    return parser


def _inspect(args):
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


def main(argv=None):
    """`gptlite train|generate|export|inspect ...`: each command under one name."""
    argv = sys.argv[1:] if argv is None else list(argv)
    commands = {"train": train_main, "generate": generate_main, "export": export_main, "inspect": inspect_main}
    if not argv or argv[0] not in commands:
        print(f"usage: gptlite {{{','.join(commands)}}} ... (gptlite COMMAND --help for its options)",
              file=sys.stderr)
        return 2
    return commands[argv[0]](argv[1:])


if __name__ == "__main__":
    sys.exit(main())
