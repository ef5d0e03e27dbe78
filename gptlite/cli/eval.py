"""`gptlite eval`: a model's loss, perplexity and bits per character or byte on files."""

import json
import pathlib
import sys

from gptlite.cli.command import check_model, command, writing_backend
from gptlite.cli.flags import add_backend_flags, add_unknown_flag, Parser
from gptlite.data import CHAT_SYNTHETIC_TASKS

SUMMARY = "measure a model on text files: loss, perplexity, bits per character and per byte"


def make_parser(prog):
    parser = Parser(prog=prog, description="Measure a model on files: a GPT on text (loss per token, perplexity, bits "
                                            "per character and per byte), a chat model on conversations (.jsonl: the "
                                            "answers' loss and exact answers), a seq2seq model on source<TAB>target "
                                            "lines (exact match and loss per target token); see docs/scores.md.")
    parser.add_argument("model", type=pathlib.Path, help="the model file (a model.keras)")
    parser.add_argument("texts", nargs="*", type=pathlib.Path, metavar="FILE",
                        help="text files, or folders of them (a chat model: conversations files, .jsonl; a seq2seq "
                             "model: files of source<TAB>target lines), each scored on its own")
    parser.add_argument("--synthetic", choices=list(CHAT_SYNTHETIC_TASKS), default=None,
                        help="a chat model: score a synthetic chat task's 300 held-out questions instead")
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of a table")
    parser.add_argument("--encoding", default="utf-8", help="the files' encoding (default: utf-8)")
    parser.add_argument("--errors", choices=["strict", "replace"], default="strict",
                        help="bytes that do not decode: stop with an error (the default) or replace them")
    add_unknown_flag(parser, "characters the model never saw")
    add_backend_flags(parser)
    return parser


def run(args):
    from gptlite.tasks.task import evaluate
    from gptlite.weights import saving

    model = saving.load(args.model)
    result = evaluate(model, args.texts, encoding=args.encoding, errors=args.errors, unknown=args.unknown,
                      verbose=0 if args.json else sys.stdout.isatty(), synthetic=args.synthetic)
    if args.json:
        print(json.dumps({"model": str(args.model), "sources": [score.as_dict() for score in result.sources],
                          "total": result.total.as_dict()}, indent=1))
        return
    print("\n".join(result.table()))


main = command("gptlite-eval", make_parser, run, writing_backend, check_model)
