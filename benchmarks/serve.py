"""`gptlite serve` under load: many clients at once against one client alone, and a soak at the queue limit.

    python benchmarks/serve.py [--model runs/x/model.keras] [--clients 16] [--requests 20] [--tokens 64]
                               [--shape cpu|wide] [--soak-seconds 30] [--max-batch 16] [--batch-window-ms MS]

Without --model, a model of the `cpu` preset's shape (4 layers, width 128,
context 64; `--shape wide`: 6 layers, width 384, context 256) with random
weights and a 65-character vocabulary is saved and served; prompts are
empty (a new text). The server runs
as `gptlite serve` in a process of its own on a free port. The benchmark
starts twice on one compile cache folder, empty at first: it reports how
long each start took to answer /health, to say it is ready (its
warm-up's programs built) and to build what it builds after ready (the
loops of full windows: /health's `building`). On the second, once it has, it first sends --requests
streamed requests of --tokens new tokens from one client, one after
another; then --clients clients each send --requests such requests, all at
once; then both phases again with unstreamed requests (the whole answer
at once). Requests mix temperatures (0.6 to 1.2) and top_p (0.9, 1). It reports
each phase's latency and time to the first text (p50, p99) and aggregate
new tokens per second, checks that every answer has the tokens asked for
and finish_reason "length", and counts 5xx answers (there must be none).
Then the soak: for --soak-seconds, twice the queue
limit of clients send requests without pause; a 503 must carry Retry-After,
every request gets an answer, and the server's resident memory (RSS, from
/proc) after the first third and at the end is reported.
"""

import argparse
import json
import os
import pathlib
import signal
import tempfile
import threading
import time

from helpers import free_port, load_phase, make_model, PROMPT, REPO, rss_mb, SERVE_SHAPES, start_server, wait_settled

def soak(url, pid, seconds, clients, tokens):
    import httpx

    counts = dict(sent=0, answered=0, ok=0, busy=0, busy_without_retry_after=0, other=0)
    lock = threading.Lock()
    stop = time.monotonic() + seconds
    memory = {}

    def client():
        with httpx.Client(base_url=url, timeout=600) as http:
            while time.monotonic() < stop:
                with lock:
                    counts["sent"] += 1
                response = http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": tokens})
                with lock:
                    counts["answered"] += 1
                    if response.status_code == 200:
                        counts["ok"] += 1
                    elif response.status_code == 503:
                        counts["busy"] += 1
                        counts["busy_without_retry_after"] += "retry-after" not in response.headers
                    else:
                        counts["other"] += 1

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    time.sleep(seconds / 3)
    memory["rss_after_warm_up_mb"] = rss_mb(pid)
    for thread in threads:
        thread.join()
    memory["rss_at_end_mb"] = rss_mb(pid)
    return {**counts, **memory}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=pathlib.Path, default=None)
    parser.add_argument("--shape", choices=sorted(SERVE_SHAPES), default="cpu")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--max-batch", type=int, default=16)
    parser.add_argument("--max-queue", type=int, default=32)
    parser.add_argument("--soak-seconds", type=float, default=30)
    parser.add_argument("--batch-window-ms", type=float, default=None,
                        help="the server's --batch-window-ms (default: the server's own)")
    parser.add_argument("--code", type=pathlib.Path, default=REPO,
                        help="serve with the gptlite found in this folder (a checkout of other code, to compare)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as folder:
        model = args.model or make_model(args.shape, folder)
        cache = pathlib.Path(folder) / "compile-cache"
        port = free_port()
        flags = () if args.batch_window_ms is None else ("--batch-window-ms", str(args.batch_window_ms))
        # A cold start (an empty compile cache), stopped once it has built all it builds; then a warm one, measured
        # once it has too (its steady pace: benchmarks/serve_ready.py measures the moment it is ready).
        server, cold_ready, cold_compiled = start_server(model, port, args.max_batch, args.max_queue, cache, args.code,
                                                         flags)
        cold_settled = cold_compiled + wait_settled(port)
        server.send_signal(signal.SIGTERM)
        server.wait(120)
        server, warm_ready, warm_compiled = start_server(model, port, args.max_batch, args.max_queue, cache, args.code,
                                                         flags)
        warm_settled = warm_compiled + wait_settled(port)
        url = f"http://127.0.0.1:{port}"
        try:
            alone = load_phase(url, 1, args.requests, args.tokens)
            together = load_phase(url, args.clients, args.requests, args.tokens)
            alone_whole = load_phase(url, 1, args.requests, args.tokens, stream=False)
            together_whole = load_phase(url, args.clients, args.requests, args.tokens, stream=False)
            soaked = soak(url, server.pid, args.soak_seconds, 2 * args.max_queue, args.tokens) \
                if args.soak_seconds else None
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(120)
    report = dict(model=str(args.model or f"random weights, {args.shape} shape"), code=str(args.code),
                  tokens=args.tokens,
                  max_batch=args.max_batch, max_queue=args.max_queue, batch_window_ms=args.batch_window_ms,
                  start=dict(cold_health_s=cold_ready, cold_compiled_s=cold_compiled, cold_settled_s=cold_settled,
                             warm_health_s=warm_ready, warm_compiled_s=warm_compiled, warm_settled_s=warm_settled),
                  alone=alone, together=together,
                  speedup=together["tokens_per_s"] / alone["tokens_per_s"],
                  alone_unstreamed=alone_whole, together_unstreamed=together_whole,
                  speedup_unstreamed=together_whole["tokens_per_s"] / alone_whole["tokens_per_s"],
                  p99_over_p50=together["p99_s"] / together["p50_s"], soak=soaked)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    main()
