"""`gptlite serve`: a model behind OpenAI's completions API, with a page to try it."""

import importlib.util
import os
import pathlib

from gptlite.cli.command import check_model, command, writing_backend
from gptlite.cli.flags import add_backend_flags, add_compile_cache_flags, Parser
from gptlite.errors import InputError
from gptlite.serving.settings import ServeSettings

SUMMARY = "serve a model over HTTP: OpenAI's completions API and a page to try it"


def make_parser(prog):
    defaults = ServeSettings()
    parser = Parser(prog=prog, description="Serve a model over HTTP: OpenAI's completions API at /v1, batching "
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
    parser.add_argument("--film", action="store_true",
                        help="show the film of the model's run too (train.py --film; kept in the model's folder)")
    add_compile_cache_flags(parser)
    add_backend_flags(parser)
    return parser


def run(args):
    from gptlite import serving

    if importlib.util.find_spec("starlette") is None or importlib.util.find_spec("uvicorn") is None:
        raise InputError("serving needs starlette and uvicorn: pip install \"gptlite[serve]\"")
    if not 0 < args.port < 65536:
        raise InputError(f"`port` must be from 1 to 65535, got {args.port}")
    settings = ServeSettings(batch_window_ms=args.batch_window_ms, max_batch=args.max_batch,
                             max_queue=args.max_queue, max_tokens_limit=args.max_tokens_limit,
                             max_n=args.max_n, api_key=args.api_key, truncate=args.truncate)
    serving.serve(args.model, args.host, args.port, settings, name=args.name, film=args.film)


main = command("gptlite-serve", make_parser, run, writing_backend, check_model)
