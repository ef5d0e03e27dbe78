"""`gptlite serve` under load: many clients at once against one client alone, and a soak at the queue limit.

    python benchmarks/serve.py [--model runs/x/model.keras] [--clients 16] [--requests 20] [--tokens 64]
                               [--shape cpu|wide] [--soak-seconds 30] [--max-batch 16] [--batch-window-ms MS]

Without --model, a model of the `cpu` preset's shape (4 layers, width 128,
context 64; `--shape wide`: 6 layers, width 384, context 256) with random
weights and a 65-character vocabulary is saved and served; prompts are
empty (a new text). The server runs
as `gptlite serve` in a process of its own on a free port. The benchmark
starts twice on one compile cache folder, empty at first: it reports how
long each start took to answer /health and to say it is ready (its
warm-up's programs built). On the second, once ready, it first sends --requests
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
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from children import new_machine

REPO = pathlib.Path(__file__).resolve().parent.parent
SHAPES = {"cpu": dict(n_layer=4, n_head=4, n_embd=128, block_size=64),
          "wide": dict(n_layer=6, n_head=6, n_embd=384, block_size=256)}
CHARACTERS = "\n !$&',-.3:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"  # Tiny Shakespeare's 65
# An empty prompt starts from a newline: with 64 new tokens, the text fills the cpu shape's 64-token
# context exactly (its last token needs one whole-window pass), so the figures are of decoding within
# the context, not of a window sliding past it.
PROMPT = ""


def make_model(shape, folder):
    import gptlite

    tokenizer = gptlite.CharTokenizer(CHARACTERS)
    model = gptlite.GPT(vocab_size=tokenizer.vocabulary_size, tokenizer=tokenizer, **SHAPES[shape])
    model.build((None, model.config.block_size))
    path = pathlib.Path(folder) / f"{shape}.keras"
    gptlite.save(model, path)
    return path


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_server(model, port, max_batch, max_queue, cache, code=REPO, flags=()):
    """Launch `gptlite serve` as on a new machine, its home folder `cache` (empty on a cold start: the compile cache
    is gptlite's default folder in it, and no cache is named); (process, seconds from launch to /health's first
    answer, seconds until it says it is ready, its warm-up done)."""
    environment = new_machine(cache)
    started = time.perf_counter()
    # Its output goes to a file: a pipe that nobody reads until the end would stop a server that logs much.
    log = tempfile.TemporaryFile("w+")
    process = subprocess.Popen(
        [sys.executable, "-m", "gptlite", "serve", str(model), "--port", str(port), "--max-batch", str(max_batch),
         "--max-queue", str(max_queue), *flags],
        cwd=code, stdout=log, stderr=subprocess.STDOUT, text=True, env=environment)
    import httpx

    deadline = time.monotonic() + 600
    ready = None
    while True:
        if process.poll() is not None:
            log.seek(0)
            sys.exit(f"the server failed:\n{log.read()[-3000:]}")
        if time.monotonic() > deadline:
            sys.exit("the server did not become ready in 10 minutes")
        try:
            health = httpx.get(f"http://127.0.0.1:{port}/health")
            ready = ready or time.perf_counter() - started  # it answers (503 while it warms up)
            if health.status_code == 200 and not health.json().get("compiling"):
                return process, ready, time.perf_counter() - started
        except httpx.TransportError:
            pass
        time.sleep(0.05)


# Each request's sampling settings, by its number: a mix, as many clients send.
TEMPERATURES = (0.6, 0.8, 1.0, 1.2)
TOP_PS = (0.9, 1.0)


def request_body(tokens, number, stream):
    """Request `number`'s body: `tokens` new tokens of a new text, its temperature and top_p by turns."""
    return {"prompt": PROMPT, "max_tokens": tokens, "temperature": TEMPERATURES[number % len(TEMPERATURES)],
            "top_p": TOP_PS[number // len(TEMPERATURES) % len(TOP_PS)], "stream": stream}


def in_threads(client, clients):
    """Run client(number) on `clients` threads at once; the seconds until the last is done."""
    started = time.perf_counter()
    threads = [threading.Thread(target=client, args=(number,)) for number in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - started


def complete(http, tokens, number, stream=True):
    """One request, streamed or not; (seconds, seconds to its first text, status, ok). Unstreamed, the first
    text comes with the whole answer."""
    body = request_body(tokens, number, stream)
    started = time.perf_counter()
    if not stream:
        response = http.post("/v1/completions", json=body)
        seconds = time.perf_counter() - started
        ok = response.status_code == 200 and response.json()["usage"]["completion_tokens"] == tokens \
            and response.json()["choices"][0]["finish_reason"] == "length"
        return seconds, seconds, response.status_code, ok
    first, text, reasons = None, "", []
    with http.stream("POST", "/v1/completions", json=body) as response:
        status = response.status_code
        for line in response.iter_lines():
            if not line.startswith("data: {"):
                continue
            for choice in json.loads(line[6:]).get("choices", []):
                if choice["text"] and first is None:
                    first = time.perf_counter() - started
                text += choice["text"]
                reasons.append(choice["finish_reason"])
    seconds = time.perf_counter() - started
    # A character model: one character a token.
    ok = status == 200 and len(text) == tokens and "length" in reasons
    return seconds, first if first is not None else seconds, status, ok


def load_phase(url, clients, requests, tokens, stream=True):
    import httpx

    results = []
    lock = threading.Lock()

    def client(number):
        with httpx.Client(base_url=url, timeout=600) as http:
            for request in range(requests):
                result = complete(http, tokens, number * requests + request, stream)
                with lock:
                    results.append(result)

    elapsed = in_threads(client, clients)
    latencies = sorted(seconds for seconds, _, _, _ in results)
    firsts = sorted(first for _, first, _, _ in results)
    p99 = lambda values: values[min(len(values) - 1, int(0.99 * len(values)))]
    return dict(
        clients=clients, stream=stream, requests=len(results), complete=sum(ok for *_, ok in results),
        errors_5xx=sum(status >= 500 for _, _, status, _ in results),
        p50_s=statistics.median(latencies), p99_s=p99(latencies),
        first_text_p50_s=statistics.median(firsts), first_text_p99_s=p99(firsts),
        tokens_per_s=sum(ok for *_, ok in results) * tokens / elapsed,
    )


def rss_mb(pid):
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


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
    parser.add_argument("--shape", choices=sorted(SHAPES), default="cpu")
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
        # A cold start (an empty compile cache), stopped once compiled; then a warm one, which is measured.
        server, cold_ready, cold_compiled = start_server(model, port, args.max_batch, args.max_queue, cache, args.code,
                                                         flags)
        server.send_signal(signal.SIGTERM)
        server.wait(120)
        server, warm_ready, warm_compiled = start_server(model, port, args.max_batch, args.max_queue, cache, args.code,
                                                         flags)
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
                  start=dict(cold_health_s=cold_ready, cold_compiled_s=cold_compiled, warm_health_s=warm_ready,
                             warm_compiled_s=warm_compiled),
                  alone=alone, together=together,
                  speedup=together["tokens_per_s"] / alone["tokens_per_s"],
                  alone_unstreamed=alone_whole, together_unstreamed=together_whole,
                  speedup_unstreamed=together_whole["tokens_per_s"] / alone_whole["tokens_per_s"],
                  p99_over_p50=together["p99_s"] / together["p50_s"], soak=soaked)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    main()
