"""`gptlite serve` from the moment it says it is ready: is it at full speed then?

    python benchmarks/serve_ready.py [--shape cpu|wide] [--clients 16] [--requests 8] [--tokens 64] [--rounds 3]
                                     [--late 5 60] [--measure first interleaved clients] [--code DIR ...]

A model of --shape with random weights (see benchmarks/serve.py) is served
by `gptlite serve` in a process of its own, started anew for each
measurement as on a new machine: HOME and XDG_CACHE_HOME point into a new
empty folder (cold), or into the one a first start filled (warm), and no
compile cache is named, so the server keeps its programs in gptlite's
default folder there. Each kind of measurement runs --rounds cold and warm
starts; the report gives medians. Each start reports when /health first
answered (any status) and when it first said ready (200). The moment it is
ready:

- first: one streamed completion of --tokens new tokens (seconds to its
  first text and to its end), then an 8-token one alone;
- interleaved: an 8-token request sent 0.2 s into a 1,000-token one (with
  the same settings), its time as a share of the long one's; again --late
  seconds after ready (default 5 and 60, or as soon after as the earlier
  ones let; the cold start's 0 s alone). Between them, from 1 s after the
  first pair for 3 s, the idle server's CPU use (CPU seconds per second,
  from /proc);
- clients: --clients clients at once, each sending --requests streamed
  requests of --tokens tokens one after another, temperature and top_p
  mixed as in benchmarks/serve.py: p50 and p99 of the time to the first
  text, errors, and the aggregate tokens per second, beside the decode
  engine's own ceiling for that many rows (`helpers.wave`, in
  this process, after the servers): their ratio. The CPU time
  the server and the clients (threads of this process) used, and the
  ratio the cores allow at most while the clients run beside the engine
  (their CPU time and the engine's at its ceiling on every core, HTTP
  costing the server nothing).

With several --code folders (checkouts to compare), each round measures
each in turn, so that the machine's slower and faster minutes fall on all.
Each round, and the report, say what share of the machine's CPU time was
stolen meanwhile (a virtual machine's host giving it to others: see
`helpers.stolen_share`).
"""

import argparse
import json
import os
import pathlib
import signal
import statistics
import sys
import tempfile
import threading
import time

from helpers import cpu_ticks, stolen_share
from helpers import REPO, complete, free_port, load_phase, make_model, start_server, wait_settled

INTERLEAVED_LONG = 1000
INTERLEAVED_SHORT = 8
IDLE_SECONDS = 3
MAX_QUEUE = 64  # gptlite serve's own default


def launch(model, cache, code, max_batch):
    """Start `gptlite serve`; (process, port, seconds to /health's first answer, seconds to its first 200)."""
    port = free_port()
    process, answered, ready = start_server(model, port, max_batch, MAX_QUEUE, cache, code)
    return process, port, answered, ready


def stop(process):
    process.send_signal(signal.SIGTERM)
    process.wait(120)


def cpu_seconds(pid):
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one(url, tokens, number=0):
    import httpx

    with httpx.Client(base_url=url, timeout=600) as http:
        seconds, first, status, ok = complete(http, tokens, number)
    if not ok:
        sys.exit(f"a request of {tokens} tokens was not answered whole (status {status})")
    return seconds, first


def interleaved(url):
    """An 8-token request 0.2 s into a 1,000-token one: (short s, long s, ratio)."""
    long = {}
    thread = threading.Thread(target=lambda: long.setdefault("seconds", one(url, INTERLEAVED_LONG)[0]))
    thread.start()
    time.sleep(0.2)
    short = one(url, INTERLEAVED_SHORT)[0]
    thread.join()
    return dict(short_s=short, long_s=long["seconds"], ratio=short / long["seconds"])


def measure(kind, model, cache, code, args):
    process, port, answered, ready = launch(model, cache, code, args.max_batch)
    url = f"http://127.0.0.1:{port}"
    result = dict(health_answered_s=answered, ready_s=ready)
    try:
        if kind == "first":
            seconds, first = one(url, args.tokens)
            result.update(first_text_s=first, completion_s=seconds, short_alone_s=one(url, INTERLEAVED_SHORT)[0])
        elif kind == "interleaved":
            at_ready = time.perf_counter()
            result["after_0_s"] = interleaved(url)
            if args.late:
                time.sleep(1)  # the requests' last chunks
                idle_cpu, idle_from = cpu_seconds(process.pid), time.perf_counter()
                time.sleep(IDLE_SECONDS)
                result["idle_cpu_per_s"] = (cpu_seconds(process.pid) - idle_cpu) / (time.perf_counter() - idle_from)
            for late in args.late:
                time.sleep(max(0.0, at_ready + late - time.perf_counter()))
                sent = time.perf_counter() - at_ready
                result[f"after_{late:g}_s"] = {**interleaved(url), "sent_after_ready_s": sent}
        else:
            server_cpu, clients_cpu = cpu_seconds(process.pid), time.process_time()
            result.update(load_phase(url, args.clients, args.requests, args.tokens))
            result.update(server_cpu_s=cpu_seconds(process.pid) - server_cpu,
                          clients_cpu_s=time.process_time() - clients_cpu)
    finally:
        stop(process)
    return result


def medians(results):
    """The median of each number the rounds measured (a nested result: the first round's)."""
    return {key: statistics.median(result[key] for result in results)
            if isinstance(value, (int, float)) and not isinstance(value, bool) else value
            for key, value in results[0].items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=["cpu", "wide"], default="cpu")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--max-batch", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3, help="starts of each kind, cold and warm; medians reported")
    parser.add_argument("--late", type=float, nargs="*", default=[5, 60],
                        help="seconds after ready to send the interleaved requests again (warm start)")
    parser.add_argument("--measure", nargs="*", choices=["first", "interleaved", "clients"],
                        default=["first", "interleaved", "clients"], help="which measurements (default: all)")
    parser.add_argument("--code", type=pathlib.Path, nargs="+", default=[REPO],
                        help="serve with the gptlite found in each folder (checkouts of other code, to compare): "
                             "measured in turns, each round")
    args = parser.parse_args()

    report = dict(shape=args.shape, tokens=args.tokens, clients=args.clients, requests=args.requests)
    started = cpu_ticks()
    with tempfile.TemporaryDirectory() as folder:
        model = make_model(args.shape, folder)
        warm_caches = {}
        for code in args.code:
            warm_caches[code] = pathlib.Path(tempfile.mkdtemp(dir=folder))
            # The warm starts' cache, filled: with what a server builds after ready too.
            process, port, _, _ = launch(model, warm_caches[code], code, args.max_batch)
            wait_settled(port)
            stop(process)
        for kind in args.measure:
            rounds = {(code, start): [] for code in args.code for start in ("cold", "warm")}
            for _ in range(args.rounds):
                for code in args.code:
                    cold_cache = pathlib.Path(tempfile.mkdtemp(dir=folder))  # a new, empty home folder
                    round_started = cpu_ticks()
                    late = args.late
                    if kind == "interleaved":
                        args.late = []
                    rounds[code, "cold"].append(measure(kind, model, cold_cache, code, args))
                    args.late = late
                    rounds[code, "warm"].append(measure(kind, model, warm_caches[code], code, args))
                    print(json.dumps({"kind": kind, "code": str(code), "cold": rounds[code, "cold"][-1],
                                      "warm": rounds[code, "warm"][-1],
                                      "stolen_share": stolen_share(round_started)}), flush=True)
            for (code, start), results in rounds.items():
                report.setdefault(str(code), {})[f"{kind}_{start}"] = medians(results)

        if "clients" in args.measure:
            import keras

            from helpers import wave

            engine_model = keras.saving.load_model(model)
            wave(engine_model, args.clients, args.tokens)  # compiles
            cpu = time.process_time()
            seconds = statistics.median(wave(engine_model, args.clients, args.tokens) for _ in range(5))
            tokens = args.clients * args.tokens
            report["ceiling_tokens_per_s"] = tokens / seconds
            report["ceiling_cpu_s_per_token"] = (time.process_time() - cpu) / (5 * tokens)
            for code in args.code:
                warm = report[str(code)]["clients_warm"]
                report[str(code)]["served_over_ceiling"] = warm["tokens_per_s"] / report["ceiling_tokens_per_s"]
                # The most the cores allow while the clients run beside the engine: their CPU time and the
                # engine's at its ceiling, packed onto every core, with HTTP costing the server nothing.
                served = warm["complete"] * args.tokens
                busy = warm["clients_cpu_s"] + served * report["ceiling_cpu_s_per_token"]
                report[str(code)]["cores_allow_over_ceiling"] = (
                    min(1.0, served / (busy / os.cpu_count()) / report["ceiling_tokens_per_s"]))
    report["stolen_share"] = stolen_share(started)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    main()
