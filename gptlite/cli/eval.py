"""`gptlite eval`: a model's loss, perplexity and bits per character or byte on files."""

import json
import pathlib
import sys

from gptlite.cli.command import command
from gptlite.cli.flags import add_backend_flags, add_unknown_flag, Parser
from gptlite.training import settings

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
    parser.add_argument("--synthetic", choices=settings.CHAT_SYNTHETIC_TASKS, default=None,
                        help="a chat model: score a synthetic chat task's 300 held-out questions instead")
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of a table")
    parser.add_argument("--encoding", default="utf-8", help="the files' encoding (default: utf-8)")
    parser.add_argument("--errors", choices=["strict", "replace"], default="strict",
                        help="bytes that do not decode: stop with an error (the default) or replace them")
    add_unknown_flag(parser, "characters the model never saw")
    add_backend_flags(parser)
    return parser


def run(args):
    from gptlite.evaluation import scores
    from gptlite.weights import saving

    model = saving.load(args.model)
    result = scores.evaluate(model, args.texts, encoding=args.encoding, errors=args.errors,
                                 unknown=args.unknown, verbose=0 if args.json else sys.stdout.isatty(),
                                 synthetic=args.synthetic)
    if args.json:
        print(json.dumps({"model": str(args.model), "sources": [score.as_dict() for score in result.sources],
                          "total": result.total.as_dict()}, indent=1))
        return
    rows = result.sources + ([result.total] if len(result.sources) > 1 else [])
    if isinstance(result.total, scores.ChatScore):
        print(f"{'conversations':<30} {'exact':>7} {'loss':>7} {'ppl':>9} {'bits/char':>9} {'chats':>9} {'tokens':>11} "
              f"{'seconds':>8}")
        for score in rows:
            print(f"{score.name[-30:]:<30} {score.exact_answers:>7.1%} {score.loss:>7.4f} {score.perplexity:>9.3f} "
                  f"{score.bits_per_character:>9.4f} {score.conversations:>9,} {score.tokens:>11,} "
                  f"{score.seconds:>8.1f}")
        return
    if isinstance(result.total, scores.PairScore):
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


main = command("gptlite-eval", make_parser, run)
