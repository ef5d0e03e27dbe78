"""gptlite's generation beside llama.cpp's on the same model, exported with `gptlite export --format gguf`.

    python benchmarks/vs_llama_cpp.py [--shapes cpu gpt2 smollm2] [--new-tokens 200] [--repeats 3] [--batch 16]
        [--rounds 1]

Needs llama-cpp-python (pip install -e ".[llama]"; it builds llama.cpp from
source). Random weights (speed only) in three shapes: the cpu preset's (4
layers, width 128, context 64, a 65-character vocabulary), GPT-2 small's (12
layers, width 768, 50,257 tokens) and SmolLM2-135M's (30 layers, width 576,
9 heads sharing 3 key/value heads, SwiGLU 1536, 49,152 tokens, written as
llama.cpp's `llama`). Each writes --new-tokens greedily at batch 1 after a
short prompt, within the context window (the cpu shape's 64 tokens hold 59
new ones). gptlite runs `gptlite.generate`; llama.cpp runs the f32, f16 and
q8_0 files through llama-cpp-python on 2 threads, each in a process of its
own; one that crashes is reported so, and run again without llama.cpp's
weight repacking (`llama-cli --no-repack`). "cold" is the first call (gptlite's
compiling, llama.cpp's loading included); the rate is the median of
--repeats calls after one more. gptlite's prefill runs as a plain graph
in a process's first two calls of a shape and compiled once its compile,
started aside at the third, is done (docs/generation.md): its "2nd call"
row is the second call's rate, and its "f32" rate, from the fourth call
on, runs compiled in every round after the first, where the compile may
still be going (it ends before llama.cpp is timed). `--batch N` also times
gptlite writing N texts at once at GPT-2 small's shape (the server's case),
in tokens a second of all rows together. `--rounds N` measures every engine N times, in turn, each
round after the last, since a shared machine's speed drifts within minutes:
the table gives each rate's median over the rounds (its cold call, the
first round's) and, for each shape, the median of the rounds' ratios of
gptlite's rate to llama.cpp's f32.

Batch-1 decoding reads every weight once a token, so its ceiling is the
memory's read bandwidth over the bytes a token reads. The bandwidth is
measured in the same run (two threads summing a 512 MB array, the best of
five), and each rate is given as the fraction of it that it reaches: the
weights' bytes (the GGUF file less the position table, which is only looked
up; the token table is read whole, as the output layer) times tokens a
second, over the bandwidth.
"""

import argparse
import itertools
import json
import pathlib
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

import gptlite

from helpers import time_calls
from helpers.llama_cpp import open_llama_cpp
from helpers.models import LARGE_SHAPES as SHAPES, model_of, PROMPT

OUTTYPES = ("f32", "f16", "q8_0")


def read_bandwidth(threads=2, megabytes=512, tries=5):
    """Bytes a second `threads` threads read from memory, summing disjoint parts of one array: the best of
    `tries` (NumPy's reduction lets go of the interpreter's lock, so the threads run at once)."""
    array = np.ones(megabytes * 2**20 // 4, np.float32)
    best = 0.0
    for _ in range(tries):
        workers = [threading.Thread(target=np.add.reduce, args=(part,)) for part in np.array_split(array, threads)]
        start = time.perf_counter()
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        best = max(best, array.nbytes / (time.perf_counter() - start))
    return best


def weight_bytes_per_token(model, file_bytes):
    """What one batch-1 token reads: the file's bytes less its position table's, in the file's own precision."""
    config = model.config
    table = config.block_size * config.n_embd if config.position == "learned" else 0
    return file_bytes * (1 - table / model.count_params())


def llama_cpp_rate(path, prompt_ids, new_tokens, repeats, repack=True):
    """(cold seconds, median seconds) of llama.cpp writing `new_tokens` greedily, in this process."""
    start = time.perf_counter()
    llm = open_llama_cpp(path, len(prompt_ids) + new_tokens, repack)

    def run():
        return list(itertools.islice(llm.generate(prompt_ids, temp=0.0, top_k=1, reset=True), new_tokens))

    run()
    cold = time.perf_counter() - start
    _, seconds, _ = time_calls(run, repeats)
    return cold, seconds


def wait_for_compiles():
    """Wait for the programs gptlite compiles aside (its threads' names say so), so that they use none of the
    CPU while another engine is timed."""
    for thread in threading.enumerate():
        if thread.name.startswith("gptlite-prepare"):
            thread.join()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=["cpu", "gpt2", "smollm2"], choices=["cpu", *SHAPES])
    parser.add_argument("--new-tokens", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=1,
                        help="times each engine is measured, in turn; the table gives the medians")
    parser.add_argument("--batch", type=int, default=16,
                        help="gptlite's rows at once beside batch 1 at GPT-2 small's shape (1: none)")
    parser.add_argument("--child", nargs=4, metavar=("FILE", "PROMPT_IDS", "NEW", "REPACK"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        path, prompt_ids, new, repack = args.child
        print(json.dumps(llama_cpp_rate(path, json.loads(prompt_ids), int(new), args.repeats, repack == "repack")))
        return

    bandwidth = read_bandwidth()
    print(f"memory read bandwidth, 2 threads: {bandwidth / 1e9:.1f} GB/s", flush=True)
    rows, ratios = [], {}
    for shape in args.shapes:
        model = model_of(shape)
        prompt_ids = model.tokenizer.encode(PROMPT).tolist()
        new = min(args.new_tokens, model.config.block_size - len(prompt_ids))
        f32_bytes = weight_bytes_per_token(model, 4 * model.count_params())
        # (engine, weights) -> [rate of each round], its first cold call, its bytes a token
        rates, colds, reads = {}, {}, {}

        def record(engine, weights, rate, cold, read):
            rates.setdefault((engine, weights), []).append(rate)
            colds.setdefault((engine, weights), cold)
            reads[engine, weights] = read
            print((shape, engine, weights, rate, cold), flush=True)

        with tempfile.TemporaryDirectory() as folder:
            paths = {}
            for outtype in OUTTYPES:
                paths[outtype] = pathlib.Path(folder) / f"{shape}-{outtype}.gguf"
                gptlite.export_gguf(model, paths[outtype], outtype)
            repacks = {outtype: "repack" for outtype in OUTTYPES}  # "no-repack" once a file has crashed
            generate_one = lambda: gptlite.generate(model, PROMPT, max_new_tokens=new, temperature=0.0)
            for round_number in range(args.rounds):
                if round_number == 0:  # a process's first calls, whose prefill is a plain graph
                    cold, second, _ = time_calls(generate_one, 1)
                    record("gptlite", "f32, 2nd call", new / second, cold, f32_bytes)
                _, seconds, _ = time_calls(generate_one, args.repeats)  # its first call is a warm-up
                record("gptlite", "f32", new / seconds, cold, f32_bytes)
                wait_for_compiles()
                if args.batch > 1 and shape == "gpt2":
                    cold, seconds, _ = time_calls(
                        lambda: gptlite.generate(model, [PROMPT] * args.batch, max_new_tokens=new, temperature=0.0),
                        args.repeats)
                    record("gptlite", f"f32, batch {args.batch}", args.batch * new / seconds, cold, f32_bytes)
                for outtype, path in paths.items():
                    file_bytes = weight_bytes_per_token(model, path.stat().st_size)
                    for repack in ("repack", "no-repack") if repacks[outtype] == "repack" else ("no-repack",):
                        weights = outtype if repack == "repack" else f"{outtype}, no repack"
                        child = subprocess.run([sys.executable, __file__, "--repeats", str(args.repeats), "--child",
                                                str(path), json.dumps(prompt_ids), str(new), repack],
                                               capture_output=True, text=True, cwd=pathlib.Path(__file__).parent)
                        if child.returncode:
                            rates.setdefault(("llama.cpp", weights), [])
                            reads["llama.cpp", weights] = file_bytes
                            repacks[outtype] = "no-repack"
                            continue  # crashed: the same file without repacking next
                        cold, seconds = json.loads(child.stdout.strip().splitlines()[-1])
                        record("llama.cpp", weights, new / seconds, cold, file_bytes)
                        break
        for (engine, weights), values in rates.items():
            rate = statistics.median(values) if values else None
            rows.append((shape, engine, weights, rate, colds.get((engine, weights)), reads[engine, weights]))
        theirs = rates.get(("llama.cpp", "f32")) or rates.get(("llama.cpp", "f32, no repack"))
        if theirs:
            ratios[shape] = statistics.median(ours / their for ours, their in zip(rates["gptlite", "f32"], theirs))
        print(f"{shape}: {new} new tokens after a {len(prompt_ids)}-token prompt", flush=True)

    print(f"Memory read bandwidth (2 threads): {bandwidth / 1e9:.1f} GB/s; medians of {args.rounds} rounds")
    print("| shape | engine | weights | tokens/s | cold, s | MB a token | of the bandwidth |")
    print("|---|---|---|---:|---:|---:|---:|")
    for shape, engine, weights, rate, cold, read in rows:
        batch_one = "batch" not in weights
        share = f"{read * rate / bandwidth:.0%}" if rate is not None and batch_one else ""
        rate = "crashed" if rate is None else f"{rate:,.1f}"
        cold = "" if cold is None else f"{cold:.1f}"
        print(f"| {shape} | {engine} | {weights} | {rate} | {cold} | {read / 1e6:.0f} | {share} |")
    for shape, ratio in ratios.items():
        print(f"{shape}: gptlite over llama.cpp's f32, the median of the rounds' ratios: {ratio:.2f}x")
    print(json.dumps({"bandwidth": bandwidth, "rows": rows, "ratios": ratios}))


if __name__ == "__main__":
    main()
