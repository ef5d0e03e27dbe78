"""`gptlite export`: a trained model in a form other programs load without gptlite."""

import pathlib

from gptlite.cli.command import check_model, command
from gptlite.cli.flags import add_backend_flags, Parser
from gptlite.errors import RunExistsError
from gptlite.exports import check_export, export, EXPORT_FORMATS

SUMMARY = f"write a model in a form other programs load ({', '.join(EXPORT_FORMATS)})"


def make_parser(prog):
    parser = Parser(prog=prog,
                    description="Write a trained model in a form other programs can serve without gptlite.")
    parser.add_argument("--model", type=pathlib.Path, default=pathlib.Path("out/model.keras"),
                        help="the model file (default: out/model.keras)")
    parser.add_argument("--format", choices=list(EXPORT_FORMATS), default=next(iter(EXPORT_FORMATS)),
                        help="; ".join(f"{name}: {kind.help}" for name, kind in EXPORT_FORMATS.items()))
    parser.add_argument("--out", type=pathlib.Path, required=True,
                        help="the folder to write (a file, for a format of one file); must not exist, unless "
                             "--overwrite")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an earlier export at --out, once the new one is whole")
    storing = {name: kind for name, kind in EXPORT_FORMATS.items() if kind.outtypes}
    outtypes = sorted({outtype for kind in storing.values() for outtype in kind.outtypes})
    parser.add_argument("--outtype", choices=outtypes, default=None,
                        help="; ".join(f"{name} only: {kind.outtype_help}" for name, kind in storing.items()))
    parser.add_argument("--film", action="store_true",
                        help="web only: show the film of the run the model was trained in (train.py --film), kept "
                             "in the model's folder")
    add_backend_flags(parser)
    return parser


def run(args):
    from gptlite.weights import saving

    check_export(args.format, args.outtype, args.film)  # before the model loads, so that the mistake shows at once
    if args.out.exists() and not args.overwrite:
        raise RunExistsError(f"{args.out} already exists; choose another `out`, or set `overwrite`")
    film = None
    if args.film:
        from gptlite.inside.film import Film

        film = Film(args.model.parent)  # before the model loads: a run without a film is said at once
    print(export(saving.load(args.model), args.format, args.out, args.outtype, args.overwrite, film))


main = command("gptlite-export", make_parser, run, check=check_model)
