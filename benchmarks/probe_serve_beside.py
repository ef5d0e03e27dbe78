"""`gptlite serve` of two codes side by side, once warm: the same load phases sent to each by turns.

    python benchmarks/probe_serve_beside.py --code BEFORE [--rounds 8] [--requests 20] [--tokens 64] [--shape cpu|wide]

Both servers (this checkout's gptlite and the one in --code) run at once,
each in a process of its own on its own compile cache folder, started a
first time to fill it and a second time to be measured, as `serve.py` does;
both are warmed with a few requests. Then each round sends every phase (one
client, then 16 clients, streamed, then unstreamed: `serve.py`'s phases) to
one server and then to the other, the order swapped each round, so that
what else the machine does meanwhile falls on both alike. An idle server
uses no CPU, so the one not measured does not slow the other. It reports
each phase's tokens/s of every round, the medians, and the ratio of the
medians (this code over --code).

Separate starts measured in turns (`serve.py --code`) gave 16-client figures
that changed by 1.6x from one start to the next, for either code: a few
rounds could not tell the codes apart. Here every round measures both.
"""

import argparse
import json
import os
import pathlib
import signal
import statistics
import sys
import tempfile

import helpers

PHASES = [("1 client, streamed", 1, True), ("16 clients, streamed", 16, True),
          ("1 client, whole", 1, False), ("16 clients, whole", 16, False)]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--code", type=pathlib.Path, required=True, help="the other checkout's folder")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--requests", type=int, default=20, help="requests per client in a phase")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--shape", choices=sorted(helpers.SERVE_SHAPES), default="cpu")
    parser.add_argument("--max-batch", type=int, default=16)
    args = parser.parse_args()
    codes = {"this": helpers.REPO, "other": args.code.resolve()}

    servers, urls = {}, {}
    with tempfile.TemporaryDirectory() as folder:
        model = helpers.make_model(args.shape, folder)
        try:
            for name, code in codes.items():
                cache, port = pathlib.Path(folder) / f"compile-cache-{name}", helpers.free_port()
                first, *_ = helpers.start_server(model, port, args.max_batch, 2 * args.max_batch, cache, code)
                first.send_signal(signal.SIGTERM)
                first.wait(120)
                servers[name], *_ = helpers.start_server(model, port, args.max_batch, 2 * args.max_batch, cache, code)
                urls[name] = f"http://127.0.0.1:{port}"
                for _, clients, stream in PHASES:
                    helpers.load_phase(urls[name], clients, 2, args.tokens, stream)
            figures = {(name, phase): [] for name in codes for phase, _, _ in PHASES}
            for number in range(args.rounds):
                order = list(codes) if number % 2 == 0 else list(codes)[::-1]
                for phase, clients, stream in PHASES:
                    for name in order:
                        result = helpers.load_phase(urls[name], clients, args.requests, args.tokens, stream)
                        if result["complete"] != result["requests"] or result["errors_5xx"]:
                            sys.exit(f"{name} answered {result['complete']} of {result['requests']} requests whole")
                        figures[name, phase].append(round(result["tokens_per_s"]))
                print(f"round {number + 1}: " + "; ".join(
                    f"{phase}: {figures['this', phase][-1]} against {figures['other', phase][-1]}"
                    for phase, _, _ in PHASES), file=sys.stderr, flush=True)
        finally:
            for server in servers.values():
                server.send_signal(signal.SIGTERM)
                server.wait(120)
    report = {"this": str(codes["this"]), "other": str(codes["other"]), "shape": args.shape, "rounds": args.rounds,
              "phases": {}}
    for phase, _, _ in PHASES:
        this, other = figures["this", phase], figures["other", phase]
        report["phases"][phase] = dict(this_tokens_per_s=this, other_tokens_per_s=other,
                                       this_median=statistics.median(this), other_median=statistics.median(other),
                                       ratio=statistics.median(this) / statistics.median(other))
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    main()
