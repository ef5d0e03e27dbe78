"""`train.py` / `gptlite train`: train a GPT or a seq2seq model on files and save it as model.keras."""

import argparse
import dataclasses
import pathlib

from gptlite.cli.command import chosen, command, print_piece
from gptlite.cli.flags import add_backend_flags, add_unknown_flag, FLAG_ALIASES, Parser
from gptlite import tasks, text
from gptlite.model import config
from gptlite.training import settings

SUMMARY = "train a GPT on text files (or a seq2seq model on pairs) and save it as model.keras"
SETTING_CHOICES = {"position": list(config.POSITIONS), "norm": list(config.NORMS),
                   "norm_position": list(config.NORM_POSITIONS), "mlp": list(config.MLPS),
                   "precision": list(settings.PRECISIONS), "optimizer": list(settings.OPTIMIZERS)}
# Settings whose flags say more than their defaults.
SETTING_HELP = {
    "grad_accum": "each optimizer step adds up the gradients of N batches of --batch-size (default: 1): a batch "
                  "N times larger in the memory of one; steps and intervals count optimizer steps",
    "steps_per_call": "optimizer steps each compiled call runs, so that the loop around the steps runs once for N "
                      "of them (default: 1; torch runs one a call); the same losses whatever N is; a stop (Ctrl-C) "
                      "waits for the call's last step",
    "lora_rank": "train rank-N low-rank adapters on the projections --lora-targets names, every other weight "
                 "frozen (default: 0, off); the saved model holds the merged weights",
    "lora_alpha": "the adapters' scale is X / --lora-rank (default: the rank, a scale of 1)",
    "lora_targets": f"which projections of each block get adapters, comma-separated from "
                    f"{','.join(config.LORA_TARGETS)} (default: all); 'embedding' also trains the token "
                    f"embedding whole, 'norms' every norm's scale (and shift)",
    "optimizer": "adamw or muon (the laptop preset's): Muon for the blocks' weight matrices (each update "
                 "orthogonalised), AdamW for the embeddings, the output head, norms and biases; the same learning "
                 "rate for both",
    "newton_schulz_steps": "with --optimizer muon: the Newton-Schulz iterations that orthogonalise each update "
                           "(presets: 3 for laptop, else 5, Keras's default)",
    "muon_momentum": "with --optimizer muon: the share of its momentum each step keeps before adding the "
                     "gradient (default: 0.95, Keras's)",
    "warmup_iters": "steps of linear learning-rate warm-up (presets: 100, or 5 for tiny; unless given, at most a "
                    "fifth of --max-iters)",
    "position": "learned (a trained table, GPT-2's; the default), sinusoidal (a fixed table) or rotary (RoPE: "
                "queries and keys turned by position inside attention)",
    "rope_theta": "rotary positions' base (default: 10000)",
    "norm": "layer (LayerNorm, GPT-2's; the default) or rms (RMSNorm, Llama's)",
    "norm_epsilon": "added to the variance in every norm (default: 1e-5)",
    "norm_position": "pre (each sublayer reads a normalised input, x + f(norm(x)), and a final norm comes before "
                     "the head; the default) or post (the sum is normalised, norm(x + f(x)), the original "
                     "Transformer's; no final norm)",
    "mlp": "the feed-forward: gelu (GPT-2's; the default), swiglu (Llama's) or relu2 (ReLU squared)",
    "mlp_hidden_size": "the feed-forward's hidden width (default: 4 x --n-embd for gelu and relu2, 8/3 x rounded "
                       "up to a multiple of 16 for swiglu)",
    "n_kv_head": "key/value heads, shared by groups of query heads (grouped-query attention; 1: multi-query); the "
                 "key/value cache holds N heads (default: --n-head)",
    "qk_norm": "RMS-normalise each head's queries and keys (default: off)",
    "qkv_bias": "biases on the query/key/value projection alone (Qwen2's; default: as --bias)",
    "head_dim": "each attention head's size (default: --n-embd / --n-head)",
}


def make_parser(prog):
    parser = Parser(
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
    parser.add_argument("--task", choices=tasks.TASKS, default=None,
                        help="lm: a GPT that continues text (the default); seq2seq: an encoder-decoder that learns "
                             "to write each line's target from its source; chat: a GPT that answers, trained on a "
                             "JSON Lines file of conversations (see docs/chat.md)")
    parser.add_argument("--synthetic", choices=settings.SYNTHETIC_TASKS + settings.CHAT_SYNTHETIC_TASKS,
                        default=None,
                        help="train on a built-in task instead of a file: seq2seq's addition (\"123+456\" -> "
                             "\"579\"), reverse or sort (strings of 5 to 20 letters), with steps "
                             + ", ".join(f"{t} {n}" for t, n in settings.SYNTHETIC_MAX_ITERS.items())
                             + " unless --max-iters says; or a chat model's task, with held-out questions to answer: "
                               "arithmetic (sums answered with the sum restated), direct (answered with the result "
                               "alone), recall (a code given early, asked for later), copy or backwards (a made-up "
                               "word written back, or reversed)")
    parser.add_argument("--val-file", type=pathlib.Path, default=None, metavar="FILE",
                        help="with --task chat: a JSON Lines file of conversations to validate on and whose last "
                             "answers are checked, instead of a held-out tenth of the training file's")
    parser.add_argument("--long-conversations", choices=["cut", "refuse"], default="cut",
                        help="with --task chat: a conversation longer than the context is cut to fit (the default) "
                             "or refused")
    _add_run_flags(parser)
    _add_setting_flags(parser)
    return parser


def _add_run_flags(parser):
    """The flags of how a run reads its text, starts, and records, besides what it trains on and the settings."""
    parser.add_argument("--tokenizer", choices=list(text.TOKENIZERS), default=None,
                        help="char: one token per character (the default); bpe: byte-level byte-pair "
                             "encoding learned from the text, for large or many-language corpora (a chat run's "
                             "keeps each digit apart). A new chat model without --preset chooses by its answers' "
                             "words (docs/chat.md)")
    parser.add_argument("--vocab-size", type=int, default=None, metavar="N",
                        help=f"tokens in a BPE vocabulary (default: {text.DEFAULT_BPE_VOCABULARY})")
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
                             "Hugging Face GPT-2, Llama, Qwen2 or Qwen3 folder, or a KerasHub GPT-2 preset (a folder, "
                             "or a name such as gpt2_base_en, downloaded where a network is reachable); it keeps its "
                             "shape and tokenizer, and its file is only read (see docs/pretrained.md)")
    add_unknown_flag(parser, "with --init-from: text characters the pretrained char vocabulary lacks")
    parser.add_argument("--distribute", action="store_true",
                        help="train data-parallel over every local device (tensorflow: GPUs, else CPU devices; "
                             "jax: all devices), or over several hosts (see docs/training.md); the batch is split "
                             "across them and the learning rate is unchanged")
    parser.add_argument("--tensorboard", action="store_true",
                        help="write TensorBoard event files at each evaluation (losses, bits per character, learning "
                             "rate, tokens per second, a text sample) to --out/tensorboard; view them with: "
                             "tensorboard --logdir OUT/tensorboard")
    parser.add_argument("--tensorboard-dir", type=pathlib.Path, default=None, metavar="DIR",
                        help="write the TensorBoard event files to DIR instead (implies --tensorboard)")
    parser.add_argument("--mfu", action="store_true", default=None,
                        help="show and record model FLOPs utilisation at each evaluation, against --peak-flops "
                             "(on by default for --preset gpu on a GPU)")
    parser.add_argument("--peak-flops", type=float, default=None, metavar="X",
                        help="the hardware's peak FLOPs per second for --mfu (default: 312e12, an A100's bfloat16 "
                             "peak, as nanoGPT uses); giving it turns --mfu on")
    add_backend_flags(parser)


def _add_setting_flags(parser):
    """A flag for each setting of `GPTConfig` and `TrainingConfig`, named as the setting is."""
    group = parser.add_argument_group("settings (each overrides the preset's value)")
    fields = {f.name: f for f in dataclasses.fields(config.GPTConfig) + dataclasses.fields(settings.TrainingConfig)}
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


def run(args):
    from gptlite.training import plan, run

    # Each argument of the run from its flag, named as the argument is but for FLAG_ALIASES'; the settings from
    # theirs, and tensorboard from two.
    made = {"settings": {name: getattr(args, name) for name in settings.SETTING_NAMES},
            "tensorboard": args.tensorboard_dir or args.tensorboard or None}
    arguments = {name: made[name] if name in made else getattr(args, FLAG_ALIASES.get(name, name))
                 for name in plan.RUN_ARGUMENTS}
    trained = run.train_on_text(**arguments)
    best = trained.best
    print(
        f"\nbest validation loss {best['val_loss']:.4f} at step {best['step']}; "
        f"saved {args.out / 'model.keras'}, {args.out / 'history.csv'}, {args.out / 'loss.png'}"
    )
    for piece in trained.closing_words():
        print_piece(piece)


def automatic_backend(args):
    """The backend for a run that names none, and a line saying so: a resumed run's own, from its run file; else
    from the precision the flags, run file or preset ask for (see gptlite.training.backend_choice). (None, None) where the
    resumed run's file cannot be read: the run reports that."""
    from gptlite.errors import GPTLiteError
    from gptlite.training import backend_choice, run_config

    if args.resume:
        try:
            return run_config.read_run_config(pathlib.Path(args.out) / run_config.FILE_NAME).backend, None
        except GPTLiteError:
            return None, None
    preset = settings.PRESETS.get(args.preset, {})
    backend, reason = backend_choice.training_backend(args.precision or preset.get("precision"))
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
