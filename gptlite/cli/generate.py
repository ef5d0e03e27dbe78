"""`generate.py` / `gptlite generate`: sample text from a trained model, streaming it as it comes."""

import pathlib

from gptlite.cli.command import check_model, command, print_piece, writing_backend
from gptlite.cli.flags import (add_backend_flags, add_compile_cache_flags, add_sampling_flags, add_unknown_flag,
                               Parser, sampling_config, sampling_settings)
from gptlite.errors import InputError
from gptlite.model.config import ATTENTION_PARTS

SUMMARY = "sample text from a trained model (a seq2seq model: its target for a source), streaming it"


def make_parser(prog):
    parser = Parser(prog=prog, description="Sample text from a trained gptlite model.")
    parser.add_argument("--model", type=pathlib.Path, default=pathlib.Path("out/model.keras"),
                        help="the model file (default: out/model.keras)")
    parser.add_argument("--prompt", default=None,
                        help="text for a language model to continue (default: empty, which starts from a new line)")
    parser.add_argument("--source", default=None, metavar="TEXT",
                        help="for a seq2seq model: the source to write the target of")
    parser.add_argument("--source-file", type=pathlib.Path, default=None, metavar="FILE",
                        help="for a seq2seq model: a file of sources, one a line; prints one target a line")
    add_sampling_flags(parser, notes={
        "max_new_tokens": "a seq2seq target has at most its model's block size less one (its default)",
        "temperature": "a seq2seq model's default is 0"})
    parser.add_argument("--num-samples", type=int, default=1, metavar="N",
                        help="how many samples to draw, together in one batch (default: 1)")
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
    add_unknown_flag(parser, "prompt characters the model never saw")
    inside = parser.add_argument_group("seeing inside (instead of sampling)")
    inside.add_argument("--attention", type=pathlib.Path, default=None, metavar="FILE",
                        help="draw the attention weights over the prompt's tokens (a seq2seq model: its source "
                             "and the target it writes) to FILE (.png, .svg or .pdf): a heatmap per layer (rows) "
                             "and head (columns); a prompt longer than 64 tokens shows its last 64")
    inside.add_argument("--layer", type=int, default=None, metavar="L",
                        help="with --attention: draw layer L only (from 0)")
    inside.add_argument("--head", type=int, default=None, metavar="H",
                        help="with --attention: draw head H only (from 0); with --layer, that one head, large")
    inside.add_argument("--part", choices=ATTENTION_PARTS, default=None,
                        help="with --attention, for a seq2seq model: the encoder's attention, the decoder's "
                             "self-attention, or cross-attention from target to source (the default)")
    add_compile_cache_flags(parser)
    add_backend_flags(parser)
    return parser


def check(args):
    """What generate refuses before its backend starts: a path that is no model file, and flags that do not go
    together or are out of their range."""
    check_model(args)
    drawing = [name for name in ("layer", "head", "part") if getattr(args, name) is not None]
    if drawing and args.attention is None:
        raise InputError(f"`{drawing[0]}` chooses what `attention` FILE draws; give `attention` too")
    if args.num_samples < 1:
        raise InputError(f"`num_samples` must be at least 1, got {args.num_samples}")
    if args.num_beams is not None and args.num_beams < 1:
        raise InputError(f"`num_beams` must be at least 1, got {args.num_beams}")
    if args.num_beams is not None and args.num_samples > 1:
        raise InputError("`num_beams` finds one text; it cannot be combined with `num_samples`")
    sampling_config(args)


def run(args):
    from gptlite.files import read_text
    from gptlite.tasks.task import draw_attention, write, Writing
    from gptlite.weights import saving

    asked = Writing(args.prompt, args.source, None if args.source_file is None else
                    read_text(args.source_file).splitlines(), args.num_samples, args.num_beams, args.stream,
                    args.slide, args.unknown, args.use_cache)
    model = saving.load(args.model)
    if args.attention is not None:
        drawn = draw_attention(model, args.attention, asked, args.part, args.layer, args.head, args.model)
        print(f"wrote {args.attention} ({drawn})")
        return
    for piece in write(model, asked, sampling_settings(args), args.model):
        print_piece(piece)


main = command("gptlite-generate", make_parser, run, writing_backend, check)
