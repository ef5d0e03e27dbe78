"""`gptlite inspect`: what a model predicts and attends to at each position, what each head does, and its
positions."""

import json
import pathlib
import sys

from gptlite.cli.command import check_model, command
from gptlite.cli.flags import add_backend_flags, add_unknown_flag, Parser
from gptlite.errors import InputError

SUMMARY = "look inside a model: next-token candidates and attention per position, what each head does, positions"


def make_parser(prog):
    parser = Parser(prog=prog,
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
    parser.add_argument("--heads", action="store_true",
                        help="with --prompt: score every head of every layer on TEXT instead (where it looks: the "
                             "token before, the first, itself; as an induction head, on a probe of random tokens "
                             "repeated twice; what knocking it out costs the loss), with the labels its scores earn")
    parser.add_argument("--top", type=int, default=5, metavar="K",
                        help="how many next tokens and attended tokens to show (default: 5)")
    parser.add_argument("--json", action="store_true", help="print the same as JSON")
    parser.add_argument("--positions", type=pathlib.Path, default=None, metavar="FILE",
                        help="draw the position encoding and the similarity of positions to FILE "
                             "(.png, .svg or .pdf)")
    add_unknown_flag(parser, "characters the model never saw")
    add_backend_flags(parser)
    return parser


def run(args):
    from gptlite.inside import heads, inspection
    from gptlite.tasks.task import describe, given_text
    from gptlite.weights import saving

    if args.top < 1:
        raise InputError(f"`top` must be at least 1, got {args.top}")
    if args.prompt is None and args.source is None and args.positions is None:
        raise InputError("give `prompt` TEXT (a language model), `source` TEXT (a seq2seq model) "
                         "or `positions` FILE")
    if args.target is not None and args.source is None:
        raise InputError("`target` goes with `source`")
    if args.heads and args.prompt is None and args.source is None:
        raise InputError("`heads` scores a language model's heads on a text: give `prompt` TEXT too")
    model = saving.load(args.model)
    text = given_text(model, args.prompt, args.source, args.model)
    messages = sys.stderr if args.json else sys.stdout
    print(f"model: {describe(model)}", file=messages)  # its shape and architecture switches
    if args.positions is not None:
        inspection.plot_positions(model, args.positions)
        print(f"wrote {args.positions} ({model.config.position} position encoding, "
              f"{model.config.block_size} positions)", file=messages)
    if text is None:
        return
    if args.heads:
        report = heads.heads(model, text, unknown=args.unknown)
        print(json.dumps(report.to_json(), ensure_ascii=False, indent=1) if args.json else report.table())
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


main = command("gptlite-inspect", make_parser, run, check=check_model)
