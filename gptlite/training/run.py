"""A whole training run, as `train.py` does it: text files in, a trained model and its files out.

    import gptlite
    run = gptlite.train_on_text(["my_text.txt"], "runs/mine", {"max_iters": 500})
    print(gptlite.generate(run.model, "ROMEO:", max_new_tokens=100))

`train_on_text` chooses and fits the tokenizer, builds the model (or reads it
from the checkpoint it resumes), encodes the text once into a token file read
through a memory map, and trains, writing `model.keras`, `history.csv`,
`loss.png` and checkpoints to its folder. The same call trains a Seq2Seq
(`task="seq2seq"`) on a file of source<TAB>target lines or a synthetic task.
"""

import contextlib
import dataclasses
import os
import pathlib
import shutil
import sys
import tempfile

import keras
import numpy as np

from gptlite.data import chat_tasks, conversations, lm, pairs
from gptlite.decode import chat, generation
from gptlite.errors import ConfigError, InputError, MissingFileError, RunExistsError
from gptlite.evaluation.scores import exact_matches
from gptlite.model.config import GPTConfig, lora_targets
from gptlite.model.gpt import GPT, Seq2Seq
from gptlite.text import templates
from gptlite.text.tokenizers import BPETokenizer, CharTokenizer
from gptlite.training import fit, run_config
from gptlite.training.checkpoints import CHECKPOINT, CHECKPOINT_FILES, FORMAT_1_STATE, read_checkpoint
from gptlite.training.distribute import check_accumulation, data_parallel, on_gpu
from gptlite.training.history import check_tensorboard, DEFAULT_PEAK_FLOPS
from gptlite.training.settings import (CHAT_REPEATED, DEFAULT_BPE_VOCABULARY, SYNTHETIC_TASKS, TASKS, TOKENIZERS,
                                       TrainingConfig, chat_settings, chat_tokenizer, dtype_policy, resolve_settings,
                                       split_settings)
from gptlite.weights import pretrained

# How a run samples its model, at each TensorBoard evaluation and at its end.
SAMPLING = dict(max_new_tokens=300, temperature=0.8, top_k=200)


@dataclasses.dataclass
class TrainedRun:
    """What `train_on_text` returns."""

    model: keras.Model  # the GPT or Seq2Seq with the last step's weights (model.keras holds the best)
    history: list  # one dict per evaluation: step, train_loss, val_loss, learning_rate, elapsed_s, ...
    out_dir: pathlib.Path
    training_config: TrainingConfig  # the settings it trained with
    held_out: pairs.Pairs = None  # a Seq2Seq's held-out pairs
    # A chat run's held-out questions: a synthetic task's own, or the last answers of the conversations held out
    # of (or given beside) the training file: [(messages, answer)].
    held_out_questions: list = None

    @property
    def best(self):
        """The evaluation with the lowest validation loss: the model that model.keras holds."""
        return min(self.history, key=lambda row: row["val_loss"])


def train_on_text(sources=(), out_dir="out", settings=None, *, preset=None, task=None, synthetic=None,
                  tokenizer=None, vocab_size=None, encoding="utf-8", errors="strict", init_from=None,
                  unknown="error", distribute=False, resume=False, overwrite=False, tensorboard=None, mfu=None,
                  peak_flops=None, long_conversations="cut", val_file=None, verbose=1):
    """Train a model on the text of `sources` and write it to `out_dir`; a `TrainedRun`.

    sources: text files or folders of them (a folder's files in sorted path
        order), read in pieces so that no file has to fit in memory; none:
        about 2 MB of the Python standard library's sources. For
        task="seq2seq", one file of source<TAB>target lines.
    settings: a dict of `GPTConfig` and `TrainingConfig` fields that override
        the preset's (`{"max_iters": 500, "n_layer": 2}`).
    preset: "cpu" (the default for a GPT), "gpu", "tiny" or "seq2seq".
    task: "lm" for a GPT (the default), "seq2seq" for an encoder-decoder; `synthetic`
        ("addition", "reverse" or "sort") trains a Seq2Seq on a built-in task.
        "chat": a GPT on conversations, one JSON Lines file of them (see
        `gptlite.data.conversations`), or a built-in task (`synthetic`: one of
        `gptlite.data.chat_tasks`); the loss counts the answers' tokens alone. A
        model without a chat template gets the default one, its turn markers
        added to the tokenizer. A new chat model without a `preset` is sized
        from its conversations (`settings.chat_settings`: the context from
        their lengths, the steps from how many rows they fill; without a
        `tokenizer`, `settings.chat_tokenizer` chooses it from the words of
        their answers), and says so.
        A tenth of a file's conversations is held out (or `val_file`'s
        conversations are used instead): the validation loss is theirs, and
        each evaluation, like the end of `train.py`, reports how many of their
        last answers the model writes exactly, greedy (`exact_answers`).
    long_conversations: with task="chat", a conversation longer than the
        context is cut to fit ("cut") or refused ("refuse").
    val_file: with task="chat", a JSON Lines file of conversations to hold out
        instead of a tenth of the training file's.
    tokenizer: "char" (the default) or "bpe" (a byte-level BPE vocabulary of
        `vocab_size` tokens, learned from the text; a chat model's keeps each
        digit a token of its own), for a new model; a pretrained or resumed
        one keeps its own.
    encoding, errors: how the files are decoded (errors="replace" turns bad
        bytes into U+FFFD).
    init_from: fine-tune a pretrained GPT instead of training a new one: a
        gptlite .keras file, a Hugging Face GPT-2 folder, a KerasHub preset
        folder or name (see `gptlite.from_pretrained`). Its shape and
        tokenizer are kept (settings may shorten `block_size` and change
        `dropout`), training starts with a fresh optimizer and FINE_TUNING's
        defaults, and the source is only read. With `lora_rank` in
        `settings`, only low-rank adapters train (`GPT.enable_lora`).
    unknown: text characters a pretrained char vocabulary lacks: an error
        ("error"), left out ("skip") or spaces ("replace").
    distribute: train data-parallel over every local device (or the hosts
        that the KERAS_DISTRIBUTION_* variables name, under JAX).
    resume: continue the run in `out_dir` from its checkpoint; overwrite:
        replace the run there. Without either, a folder that holds a run is
        refused and left as it is. A run refused before it trains (a missing
        file, empty text, a setting that cannot work) writes nothing: not
        even `out_dir` is made.
    tensorboard: a folder for TensorBoard event files (True: `out_dir`/tensorboard),
        written at each evaluation: losses, bits per character, learning rate,
        tokens per second and a text sample.
    mfu, peak_flops: record a GPT's model FLOPs utilisation at each evaluation
        against `peak_flops` (FLOPs per second; default nanoGPT's, an A100's
        bfloat16 peak, 312e12). Giving `peak_flops` asks for it; unasked, the
        gpu preset records it on a GPU.
    verbose: 0 prints nothing; 1 says what it trains and each evaluation.
    """
    out_dir = pathlib.Path(out_dir)
    sources = [pathlib.Path(source) for source in ([sources] if isinstance(sources, (str, pathlib.Path))
                                                   else sources)]
    task = _task(task, synthetic)
    seq2seq = task == "seq2seq"
    if long_conversations not in conversations.LONG_CONVERSATIONS:
        raise ConfigError(f"long_conversations must be 'cut' or 'refuse', got {long_conversations!r}")
    if resume and overwrite:
        raise ConfigError("`resume=True` and `overwrite=True` contradict each other; choose one")
    if tokenizer not in (None, *TOKENIZERS):
        raise ConfigError(f"tokenizer must be 'char' or 'bpe', got {tokenizer!r}")
    checkpoint = read_checkpoint(out_dir) if resume else None
    if checkpoint and (checkpoint.get("model_class", "GPT") == "Seq2Seq") != seq2seq:
        saved_task = "lm" if seq2seq else "seq2seq"
        raise ConfigError(f"the run in {out_dir} trains a {saved_task} model; resume it with `task='{saved_task}'`")
    # A resumed run's weights are in its checkpoint: what it started from is not read again.
    starts_pretrained = bool(init_from) and not checkpoint
    if starts_pretrained:
        _check_init_from(init_from, out_dir, seq2seq, tokenizer, vocab_size)
    if vocab_size is not None and (tokenizer != "bpe" or checkpoint):
        raise ConfigError("`vocab_size` sets the size of a new BPE vocabulary: it goes with `tokenizer='bpe'`, "
                          "and not with `resume=True`")
    if tokenizer == "bpe" and vocab_size is not None:
        BPETokenizer.check_vocabulary_size(vocab_size)
    if not resume:  # refused before a model is read, and before a chat run reads its conversations (seconds)
        _check_folder(out_dir, overwrite)
    start = pretrained.from_pretrained(init_from) if starts_pretrained else None
    say = print if verbose else (lambda *args, **kwargs: None)
    chats = chat_defaults = chat_corpus = fitted = None
    if task == "chat":
        # The seed draws a synthetic task's conversations: the run's, as the settings will resolve it.
        seed = next((value for value in ((settings or {}).get("seed"), checkpoint and checkpoint["training_config"].get(
            "seed")) if value is not None), TrainingConfig.seed)
        chats = _conversations(sources, synthetic, encoding, seed, val_file)
        # A new tokenizer learns the messages' text (a template's markers are added after).
        chat_corpus = lm.Corpus.from_text("".join(message["content"] for conversation in chats.conversations
                                                    for message in conversation), chats.name)
        if preset is None and not (checkpoint or start):
            reading = None
            if tokenizer is None:
                tokenizer, reading = chat_tokenizer(conversations.repeated_answer_words(chats.conversations,
                                                                                        CHAT_REPEATED))
            # Sized by the tokens the model will read: a BPE vocabulary is learned first, then counted with.
            fitted = _bpe(chat_corpus, vocab_size, True, say) if tokenizer == "bpe" else None
            chat_defaults = chat_settings(conversations.default_template_lengths(chats.conversations, fitted),
                                          reading)
    model_settings, training_settings = split_settings(
        resolve_settings(preset, settings, checkpoint, seq2seq, synthetic, start and start.config,
                         chat=chat_defaults and chat_defaults[0]))
    training_config = TrainingConfig(**training_settings)
    GPTConfig(**model_settings)  # fail on a bad shape before reading any text
    if checkpoint and checkpoint["step"] >= training_config.max_iters:
        raise InputError(f"the run in {out_dir} has already done its {checkpoint['step']} steps; "
                         f"set a larger `max_iters` to train it further")
    if training_config.lora_rank and not (start or checkpoint):
        raise ConfigError("`lora_rank` trains adapters beside a pretrained model's frozen weights; a new model's "
                          "are random, so give `init_from` too, or leave `lora_rank` out to train every weight")
    if seq2seq:
        _check_seq2seq_options(sources, synthetic, tokenizer, distribute)
    if task == "chat" and (len(sources) != 1 if not synthetic else sources):
        raise ConfigError("a chat model trains on one JSON Lines file of conversations, or on a `synthetic` task "
                          "(and then on no file)")
    if val_file is not None and (task != "chat" or synthetic):
        raise ConfigError("`val_file` holds conversations to validate a chat run on: it goes with task='chat' and "
                          "a file of conversations")
    if distribute:
        check_accumulation(training_config.grad_accum)
    peak_flops = _peak_flops(mfu, peak_flops, preset, seq2seq)
    if tensorboard is True:
        tensorboard = out_dir / "tensorboard"
    if tensorboard:
        check_tensorboard(tensorboard)
    if tokenizer is None and not (start or checkpoint):
        tokenizer = "char"

    keras.utils.set_random_seed(training_config.seed)
    arguments = dict(sources=[str(source) for source in sources], task=task,
                     synthetic=synthetic, preset=preset, tokenizer=tokenizer, vocab_size=vocab_size,
                     encoding=encoding, errors=errors, init_from=init_from and str(init_from), unknown=unknown,
                     distribute=distribute)
    with _removed_if_refused(out_dir):
        if seq2seq:
            return _train_seq2seq(sources, synthetic, encoding, errors, out_dir, checkpoint, model_settings,
                                  training_config, say, verbose, tensorboard, arguments, overwrite)
        if chat_defaults:
            given = [f"{name} {value}" for name, value in (settings or {}).items()
                     if value is not None and value != chat_defaults[0].get(name, value)]
            say(chat_defaults[1] + (f" (given: {', '.join(given)})" if given else ""))
        if chats is not None:
            corpus = chat_corpus
        elif sources:
            corpus = lm.Corpus.from_files(sources, encoding, errors)
        else:
            corpus = lm.Corpus.from_text(lm.default_corpus(), "the Python standard library's sources")
        with data_parallel(training_config.batch_size) if distribute else contextlib.nullcontext() as replicas:
            if start is not None:
                wanted = (model_settings["block_size"], model_settings["dropout"],
                          dtype_policy(training_config.precision))
                model = start
                if wanted != (start.config.block_size, start.config.dropout, start.dtype_policy.name):
                    # Another context, dropout or precision: a copy built so (GPT-2's 124M weights, twice).
                    model = pretrained.from_pretrained(start, *wanted)
                say(f"starting from {init_from}")
            else:
                model = _gpt(corpus, checkpoint, model_settings, training_config, tokenizer, vocab_size, say,
                             chats is not None, fitted)
            if not model.built:
                model.build((None, model.config.block_size))
            if chats is not None and not checkpoint:
                had_template = model.tokenizer is not None and model.tokenizer.chat_template is not None
                model = conversations.chat_ready(model, training_config.seed)
                if not had_template:
                    frozen = training_config.lora_rank and "embedding" not in lora_targets(training_config.lora_targets)
                    say("the model gets gptlite's chat template; its turn markers are new tokens: "
                        + " ".join(templates.TURN_MARKERS)
                        # benchmarks/journal.md, "Chat tasks": a small base's adapters learned nothing of a task in 750 steps
                        # with the embedding frozen (the markers' rows as made, digits it never read), and learned
                        # with it trained.
                        + ("\nLoRA leaves the embedding frozen, the new markers' rows too: add embedding to "
                           "lora_targets to train it whole beside the adapters" if frozen else ""))
            if training_config.lora_rank:
                model.enable_lora(training_config.lora_rank, training_config.lora_alpha,
                                  training_config.lora_targets)
            kind = {CharTokenizer: "characters", BPETokenizer: "byte-level BPE tokens"}.get(
                type(model.tokenizer), "the pretrained model's tokens")
            metrics = {}
            if chats is not None:  # packed before the folder is made: a refusal leaves an earlier run as it is
                train_ids, validation_ids, data_line, metrics = _chat_rows(model, chats, kind, training_config,
                                                                           long_conversations)
            if not checkpoint:
                _make_folder(out_dir, overwrite)
            if chats is None:
                train_ids, validation_ids = _encode(corpus, model.tokenizer, out_dir, bool(checkpoint), model.config,
                                                    unknown, bool(start))
                data_line = (f"training on {corpus.name}: {len(train_ids) + len(validation_ids):,} tokens ({kind}, "
                             f"{model.tokenizer.vocabulary_size:,} in the vocabulary); {len(train_ids):,} train / "
                             f"{len(validation_ids):,} validation")
            config = model.config
            _write_run_config(out_dir, arguments, config, training_config)
            say(data_line + "\n"
                f"model: {config.n_layer} layers, {_heads(config)}, width {config.n_embd}, "
                f"context {config.block_size}, {_architecture(config)}, {_parameters(model)}; "
                f"{_backend_and_precision(training_config)}\n" + _schedule(training_config, checkpoint, replicas),
                flush=True)
            history = fit.train(model, train_ids, validation_ids, training_config, out_dir, verbose=verbose,
                                     resume=bool(checkpoint), peak_flops=peak_flops, tensorboard=tensorboard,
                                     metrics=metrics, sample=lambda m: sample_text(m, training_config.seed))
        return TrainedRun(model, history, out_dir, training_config,
                          held_out_questions=chats.held_out if chats is not None else None)


def sample_text(model, seed):
    """What a GPT writes from nothing, as a run samples it (`SAMPLING`)."""
    return generation.generate(model, "", seed=seed, **SAMPLING)


def _peak_flops(mfu, peak_flops, preset, seq2seq):
    """The peak FLOPs per second to measure MFU against, or None when it is not measured."""
    if peak_flops is not None or mfu:
        if seq2seq:
            raise ConfigError("MFU (`mfu`, `peak_flops`) is estimated for a GPT; a seq2seq run has none")
        if peak_flops is not None and not peak_flops > 0:
            raise ConfigError(f"peak_flops must be positive, got {peak_flops!r}")
        return peak_flops or DEFAULT_PEAK_FLOPS
    if mfu is not None or preset != "gpu" or seq2seq:
        return None
    return DEFAULT_PEAK_FLOPS if on_gpu() else None


def _check_init_from(init_from, out_dir, seq2seq, tokenizer, vocab_size):
    """Refuse an `init_from` that the other settings contradict, or that the run would write over: the model it
    names is only read, before anything is written."""
    if seq2seq:
        raise ConfigError("`init_from` fine-tunes a GPT; a seq2seq model trains from the start")
    if tokenizer is not None or vocab_size is not None:
        given = f"`tokenizer={tokenizer}`" if tokenizer is not None else "`vocab_size`"
        raise ConfigError(f"a pretrained model keeps its own tokenizer: leave out {given} with `init_from`")
    source, target = pathlib.Path(init_from), out_dir / "model.keras"
    if source.is_file() and target.exists() and target.samefile(source):
        raise ConfigError(f"`init_from` is the model in `out_dir` {out_dir}; write the new run to another `out_dir`")
    if source.is_dir() and out_dir.exists() and out_dir.samefile(source):
        raise ConfigError(f"`out_dir` {out_dir} is the folder of `init_from`, which is only read; write the new "
                          f"run to another `out_dir`")


def _heads(config):
    if config.kv_heads == config.n_head:
        return f"{config.n_head} heads"
    return f"{config.n_head} heads sharing {config.kv_heads} key/value heads"


def _architecture(config):
    """The architecture's switches, in a few words: "learned positions, LayerNorm, GELU" for GPT-2's."""
    words = [f"{config.position} positions", {"layer": "LayerNorm", "rms": "RMSNorm"}[config.norm],
             {"gelu": "GELU", "swiglu": "SwiGLU"}[config.mlp]]
    return ", ".join(words + (["QK-norm"] if config.qk_norm else []))


def _parameters(model):
    total = model.count_params()
    trainable = sum(int(np.prod(weight.shape)) for weight in model.trainable_weights)
    return f"{total:,} parameters" + (f", {trainable:,} of them trained" if trainable != total else "")


def _task(task, synthetic):
    """What the run trains: "lm", "seq2seq" or "chat", from `task` and `synthetic`, checked."""
    if task not in (None, *TASKS):
        raise ConfigError(f"task must be one of {', '.join(TASKS)}, got {task!r}")
    if synthetic in chat_tasks.CHAT_SYNTHETIC_TASKS:
        if task not in (None, "chat"):
            raise ConfigError(f"the synthetic {synthetic} task trains a chat model; leave out `task={task!r}`")
        return "chat"
    if synthetic is not None and synthetic not in SYNTHETIC_TASKS:
        raise ConfigError(f"synthetic must be one of {', '.join(SYNTHETIC_TASKS + chat_tasks.CHAT_SYNTHETIC_TASKS)}"
                          f", got {synthetic!r}")
    if synthetic and task in ("lm", "chat"):
        raise ConfigError(f"the synthetic {synthetic} task trains a seq2seq model; leave out `task={task!r}`")
    return "seq2seq" if synthetic else (task or "lm")


@dataclasses.dataclass
class _Chats:
    conversations: list  # the ones to train on
    held_out: list  # questions to check the answers of: [(messages, answer)]
    name: str
    validation: list = None  # a file's conversations held out, whose loss validates; a synthetic task has none


def _chat_rows(model, chats, kind, training_config, long_conversations):
    """A chat run's (train rows, validation rows, the line that says what it trains on, its metrics)."""
    tokenizer, block_size = model.tokenizer, model.config.block_size
    if chats.validation is None:  # a synthetic task: its validation rows come from its training conversations
        rows = conversations.pack(tokenizer, chats.conversations, block_size, long_conversations)
        train_rows, validation_rows = conversations.split(rows, seed=training_config.seed)
        packed = f"packed into {len(rows):,} rows"
    else:
        train_rows, validation_rows = (conversations.pack(tokenizer, chosen, block_size, long_conversations)
                                       for chosen in (chats.conversations, chats.validation))
        rows = train_rows
        packed = f"and {len(chats.validation):,} held out, packed into {len(train_rows) + len(validation_rows):,} rows"
    answers = int(train_rows.trained[:, 1:].sum())
    cut = train_rows.cut + (validation_rows.cut if chats.validation is not None else 0)
    line = (f"training on {chats.name}: {rows.conversations:,} conversations ({kind}, "
            f"{tokenizer.vocabulary_size:,} in the vocabulary) {packed} of {block_size + 1} tokens, "
            f"{answers:,} of the training tokens answers' (the loss counts those); "
            f"{len(train_rows):,} rows train / {len(validation_rows):,} validation"
            + (f"; {cut:,} conversations longer than the context were cut" if cut else ""))
    metrics = {}
    if chats.held_out:
        checked = chats.held_out[:chat.EVALUATED_QUESTIONS]
        metrics["exact_answers"] = lambda m: chat.exact_answers(m, checked)
    return train_rows, validation_rows, line, metrics


def _conversations(sources, synthetic, encoding, seed, val_file=None):
    """A chat run's conversations: a synthetic task's, or a file's with a tenth held out (or `val_file`'s)."""
    if synthetic:
        made = chat_tasks.synthetic(synthetic, seed)
        return _Chats(made.conversations, made.held_out, f"the synthetic {synthetic} conversations")
    read = conversations.read_conversations(sources[0], encoding)
    if val_file is not None:
        train, validation = read, conversations.read_conversations(val_file, encoding)
    else:
        train, validation = conversations.hold_out(read, seed=seed)
    return _Chats(train, conversations.last_answers(validation), str(sources[0]), validation)


def _check_seq2seq_options(sources, synthetic, tokenizer, distribute):
    if tokenizer not in (None, "char"):
        raise ConfigError("the seq2seq model reads characters; `tokenizer='bpe'` is for language models")
    if distribute:
        raise ConfigError("`distribute=True` trains language models only for now")
    if synthetic and sources:
        raise ConfigError(f"the synthetic {synthetic} task makes its own pairs; give no file")
    if not synthetic and len(sources) != 1:
        raise ConfigError("a seq2seq model trains on one file of source<TAB>target lines, or on a `synthetic` task")


def _check_folder(out_dir, overwrite):
    """Refuse an `out_dir` that holds a run (unless told to replace it), or that cannot be written to.

    Nothing is made yet: `_make_folder` does that once the text and settings have passed.
    """
    if out_dir.exists() and not out_dir.is_dir():
        raise InputError(f"`out_dir` {out_dir} is a file, not a folder")
    existing = [out_dir / name for name in ("model.keras", CHECKPOINT, FORMAT_1_STATE) if (out_dir / name).exists()]
    if existing and not overwrite:
        raise RunExistsError(f"{existing[0]} already exists; set `resume=True` to continue that run, "
                             f"`overwrite=True` to replace it, or choose another `out_dir`")
    nearest = next(folder for folder in (out_dir, *out_dir.absolute().parents) if folder.exists())
    if not nearest.is_dir():
        raise InputError(f"cannot write to `out_dir` {out_dir}: {nearest} is a file")
    if not os.access(nearest, os.W_OK | os.X_OK):
        raise InputError(f"cannot write to `out_dir` {out_dir}: permission denied")


def _make_folder(out_dir, overwrite):
    """Make `out_dir`, checked by `_check_folder`; replacing a run, remove its checkpoint."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=out_dir).close()
    except OSError as error:
        raise InputError(f"cannot write to `out_dir` {out_dir}: {error.strerror}") from None
    if overwrite:
        # The replaced run's checkpoint must not be resumed into the new one.
        for name in CHECKPOINT_FILES:
            (out_dir / name).unlink(missing_ok=True)


@contextlib.contextmanager
def _removed_if_refused(out_dir):
    """A run refused before it trained leaves no `out_dir` behind where there was none."""
    existed = out_dir.exists()
    try:
        yield
    except (ConfigError, InputError, MissingFileError, RunExistsError):
        trained = any((out_dir / name).exists() for name in ("model.keras", CHECKPOINT, FORMAT_1_STATE))
        if not existed and out_dir.is_dir() and not trained:
            shutil.rmtree(out_dir, ignore_errors=True)
        raise


def _gpt(corpus, checkpoint, model_settings, training_config, tokenizer, vocab_size, say, chat, fitted):
    """The GPT to train: the checkpoint's, or a new one with a tokenizer fitted to the corpus (`fitted`, where
    it already is); a chat model's BPE keeps digits apart."""
    if checkpoint:
        return GPT.from_config(checkpoint["model_config"])
    if fitted is None:
        fitted = _bpe(corpus, vocab_size, chat, say) if tokenizer == "bpe" else _characters(corpus)
    return GPT.from_gpt_config(GPTConfig(vocab_size=fitted.vocabulary_size, **model_settings), fitted,
                               dtype=dtype_policy(training_config.precision))


def _characters(corpus):
    """A character vocabulary of the corpus's text."""
    if not corpus.size:  # said before any tokenizer is learned from it
        raise InputError(f"{corpus.name} has no text in it")
    fitted = CharTokenizer.from_texts(corpus.pieces())
    if not fitted.vocabulary.strip():
        raise InputError(f"{corpus.name} has no text in it")
    return fitted


def _bpe(corpus, vocab_size, digits_apart, say):
    """A byte-level BPE vocabulary learned from the corpus (`BPETokenizer.train`)."""
    if not corpus.size:  # said before any tokenizer is learned from it
        raise InputError(f"{corpus.name} has no text in it")
    vocab_size = vocab_size or DEFAULT_BPE_VOCABULARY
    say(f"learning a {vocab_size:,}-token byte-level BPE vocabulary from {corpus.name} "
        f"(a sample of up to {lm.BPE_SAMPLE_BYTES // 2**20} MB{'; each digit a token' if digits_apart else ''})",
        flush=True)
    return BPETokenizer.train(corpus.sample(lm.BPE_SAMPLE_BYTES), vocab_size, sys.stdout.isatty(), digits_apart)


def _encode(corpus, tokenizer, out_dir, resuming, config, unknown, pretrained_tokenizer):
    """(train ids, validation ids) of the corpus, encoded once into a token file in `out_dir`."""
    try:
        token_ids = lm.encode_corpus(corpus, tokenizer, out_dir, sys.stdout.isatty(), unknown)
    except InputError as error:
        if resuming and any(tokenizer.unknown_characters(piece) for piece in corpus.pieces()):
            raise InputError(f"{error}: resume with the text the run started on") from None
        if pretrained_tokenizer and unknown == "error":
            raise InputError(f"{error}: the pretrained model never saw them; `unknown='skip'` leaves them out, "
                             f"`unknown='replace'` makes them spaces") from None
        raise
    train_ids, validation_ids = lm.split(token_ids)
    lm.check_enough_tokens(train_ids, validation_ids, config.block_size)
    return train_ids, validation_ids


def _train_seq2seq(sources, synthetic, encoding, errors, out_dir, checkpoint, model_settings, training_config,
                   say, verbose, tensorboard, arguments, overwrite):
    """Read or make the pairs, make the model (new, or from the checkpoint) and train it.

    The held-out pairs are chosen by the seed, so a resumed run holds out the same ones.
    """
    if synthetic:
        train_pairs, held_out = pairs.synthetic(synthetic, training_config.seed)
        name = f"the synthetic {synthetic} task"
    else:
        train_pairs, held_out = pairs.split(pairs.read_pairs(sources[0], encoding, errors), training_config.seed)
        name = str(sources[0])
    if checkpoint:
        model = Seq2Seq.from_config(checkpoint["model_config"])
        tokenizer, block_size = model.tokenizer, model.config.block_size
    else:
        texts = (text for part in (train_pairs, held_out) for text in part.sources + part.targets)
        tokenizer = CharTokenizer.from_texts(texts, special_tokens=CharTokenizer.SPECIAL_TOKENS)
        model_settings = dict(model_settings)
        block_size = model_settings.pop("block_size", None) or pairs.block_size_needed(tokenizer, train_pairs,
                                                                                       held_out)
        model = Seq2Seq.from_gpt_config(
            GPTConfig(vocab_size=tokenizer.vocabulary_size, block_size=block_size, **model_settings), tokenizer,
            dtype=dtype_policy(training_config.precision))
    train_set = pairs.encode(train_pairs, tokenizer, block_size)
    held_out_set = pairs.encode(held_out, tokenizer, block_size)
    model.build()
    config = model.config
    if not checkpoint:
        _make_folder(out_dir, overwrite)
    _write_run_config(out_dir, arguments, config, training_config)
    measured = held_out.subset(range(min(len(held_out), pairs.HELD_OUT_PAIRS)))
    say(f"training on {name}: {len(train_pairs):,} pairs, {len(held_out):,} held out "
        f"({tokenizer.vocabulary_size - len(tokenizer.special_tokens)} characters)\n"
        f"model: seq2seq, encoder and decoder of {config.n_layer} layers each, {config.n_head} heads, width "
        f"{config.n_embd}, sources and targets of up to {config.block_size} tokens, {model.count_params():,} "
        f"parameters; {_backend_and_precision(training_config)}\n"
        + _schedule(training_config, checkpoint, None)
        + f"; exact match measured on {len(measured):,} held-out pairs", flush=True)
    shown = measured.subset(range(min(len(measured), 8)))
    metrics = {"exact_match": lambda trained: exact_matches(trained, measured) / len(measured)}
    history = fit.train(model, train_set, held_out_set, training_config, out_dir, verbose=verbose,
                             resume=bool(checkpoint), metrics=metrics, tensorboard=tensorboard,
                             sample=lambda trained: target_lines(trained, shown))
    return TrainedRun(model, history, out_dir, training_config, held_out)


def target_lines(model, held_out):
    """A line for each held-out pair: its source, and the target a Seq2Seq decodes for it (greedily)."""
    decoded = generation.generate_target(model, held_out.sources, temperature=0.0)
    return "\n".join(f"{source} -> {got}" + ("" if got == want else f"   (expected {want})")
                     for source, got, want in zip(held_out.sources, decoded, held_out.targets))


def _write_run_config(out_dir, arguments, model_config, training_config):
    """`out_dir`/config.toml: the run's arguments, and every setting as the run resolved it."""
    shape = {name: value for name, value in dataclasses.asdict(model_config).items() if name != "vocab_size"}
    run_config.write_run_config(out_dir / run_config.FILE_NAME, arguments,
                                {**shape, **dataclasses.asdict(training_config)}, keras.backend.backend())


def _backend_and_precision(training_config):
    return f"{keras.backend.backend()} backend, {training_config.precision}"


def _schedule(training_config, checkpoint, replicas):
    accumulated = training_config.grad_accum
    return (
        (f"resuming at step {checkpoint['step']} of " if checkpoint else "")
        + f"{training_config.max_iters} steps of batch {training_config.batch_size}"
        + (f" split across {replicas} devices" if replicas else "")
        + (f", {accumulated} batches a step ({training_config.batch_size * accumulated} sequences)"
           if accumulated > 1 else "") + "; "
        f"validation loss every {training_config.eval_interval} steps, "
        f"checkpoint every {training_config.checkpoint_interval}"
    )
