"""What each head does, measured: the figures of docs/inspection.md's "What does this head do?", and what it costs.

    python benchmarks/heads.py figures --model runs/shakespeare/model.keras [--text data/tinyshakespeare.txt]
    python benchmarks/heads.py speed [--backends tensorflow jax torch] [--shapes cpu gpt2] [--rounds 5]
                                     [--processes 3]
    python benchmarks/heads.py memory [--code DIR] [--tokens 1024]

`figures`: for a model trained on Tiny Shakespeare (the `cpu` preset: `python train.py data/tinyshakespeare.txt
--preset cpu --out runs/shakespeare`), `gptlite.heads` on windows of 64 characters of the text's last tenth (the
validation split): the table of one window, each head's scores and ablation averaged over --windows windows, the
logit lens (the share of positions where each block's output already ranks the model's final choice first) and a
logit's attribution, as JSON.

`speed`: `gptlite.heads` on 64 tokens of the `cpu` preset's shape, and of GPT-2 small's over 256 tokens (random
weights, benchmarks/helpers/models.py), each in --processes fresh processes as on a new machine (HOME and
XDG_CACHE_HOME in an empty folder): the first call after the model is built, and the median of --rounds calls
after it (none: 0), under each backend; medians over the processes. GPT-2 small's takes minutes a call on 2 cores:
its 145 ablated runs are each a whole forward pass of 256 tokens.

`memory`: the peak resident memory of a process that builds GPT-2 small's shape and traces --tokens tokens with it
(`gptlite.trace`), with this checkout's gptlite, and with the checkout at --code (an earlier commit, for "before");
this one's is also measured keeping one block (`layers=[0]`). A trace past `gptlite.inside.trace.MOST_TRACE_NUMBERS`
is refused before it runs: the refusal's time and memory are reported.
"""

import argparse
import json
import pathlib
import statistics
import sys
import tempfile

from helpers import new_machine, run_child, with_code

REPO = pathlib.Path(__file__).resolve().parent.parent
SPEED = """
import json, statistics, sys, time
import numpy as np
import gptlite
from helpers.models import model_of
shape, length, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
model = model_of(shape)
ids = np.random.default_rng(0).integers(0, min(model.config.vocab_size, 60000), length).tolist()
started = time.perf_counter()
gptlite.heads(model, ids)
first = time.perf_counter() - started
times = []
for _ in range(rounds):
    started = time.perf_counter()
    gptlite.heads(model, ids)
    times.append(time.perf_counter() - started)
print(json.dumps(dict(first_s=first, median_s=statistics.median(times) if times else first)))
"""
MEMORY = """
import json, resource, sys, time
import numpy as np
import gptlite
from helpers.models import model_of
length, layers = int(sys.argv[1]), json.loads(sys.argv[2])
model = model_of("gpt2")
built = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
ids = np.random.default_rng(0).integers(0, 50000, length).tolist()
started = time.perf_counter()
try:
    trace = gptlite.trace(model, ids) if layers is None else gptlite.trace(model, ids, layers=layers)
    said = f"{len(trace.ids)} tokens traced"
except gptlite.GPTLiteError as error:
    said = f"refused: {error}"
print(json.dumps(dict(seconds=time.perf_counter() - started, built_mb=built, said=said,
                      peak_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)))
"""


def figures(args):
    import numpy as np

    import gptlite
    from gptlite.inside.trace import text_ids

    model = gptlite.load(args.model)
    text = args.text.read_text()
    validation = text[int(len(text) * 0.9):]
    rng = np.random.default_rng(0)
    starts = rng.integers(0, len(validation) - 64, args.windows)
    windows = [validation[start:start + 64] for start in starts]
    reports = [gptlite.heads(model, window, calibrate=index == 0) for index, window in enumerate(windows)]
    first = reports[0]
    print(first.table(), file=sys.stderr)
    mean = {name: np.mean([getattr(report, name) for report in reports], axis=0).round(4).tolist()
            for name in ("previous_token", "first_token", "current_token", "induction", "ablation")}
    lens_shares, examples = [], []
    for window in windows[:args.lens_windows]:
        trace = gptlite.trace(model, window)
        lens = trace.logit_lens()  # (L + 1, T, V)
        final = lens[-1].argmax(-1)
        lens_shares.append([(layer.argmax(-1) == final).mean() for layer in lens])
    trace = gptlite.trace(model, windows[0])
    ids = text_ids(model, windows[0])
    position = len(ids) - 2
    parts = trace.attribution(position, int(ids[-1]))
    examples.append(dict(text=windows[0], position=position, token=windows[0][-1], logit=parts.logit,
                         largest=parts.largest(6)))
    print(json.dumps(dict(model=str(args.model), windows=len(windows), first_window=windows[0],
                          first_labels={f"{layer},{head}": found for (layer, head), found in first.labels().items()},
                          initial_largest={name: float(scores.max()) for name, scores in first.initial.items()},
                          mean_scores=mean, lens_share_of_final_choice=np.mean(lens_shares, axis=0).round(3).tolist(),
                          attribution=examples), indent=1))


def speed(args):
    results = {}
    for backend in args.backends:
        for shape, length in ((shape, {"cpu": 64, "gpt2": 256}[shape]) for shape in args.shapes):
            runs = []
            for round_index in range(args.processes):
                home = pathlib.Path(tempfile.mkdtemp(prefix="gptlite-heads-"))
                environment = dict(new_machine(home), KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3")
                runs.append(run_child(f"{backend} {shape}", ["-c", SPEED, shape, str(length), str(args.rounds)],
                                      environment))
            found = {key: statistics.median(run[key] for run in runs) for key in ("first_s", "median_s")}
            results[f"{backend} {shape} {length} tokens"] = found
            print(f"{backend}, {shape}, {length} tokens: {found}", file=sys.stderr, flush=True)
    print(json.dumps(results))


def memory(args):
    home = pathlib.Path(tempfile.mkdtemp(prefix="gptlite-heads-"))
    environment = dict(new_machine(home), TF_CPP_MIN_LOG_LEVEL="3")
    runs = {"this checkout": run_child("this", ["-c", MEMORY, str(args.tokens), "null"], environment),
            "this checkout, layers=[0]": run_child("this, one block", ["-c", MEMORY, str(args.tokens), "[0]"],
                                                  environment)}
    if args.code is not None:
        runs[f"code at {args.code}"] = run_child("before", ["-c", MEMORY, str(args.tokens), "null"],
                                                 with_code(environment, args.code))
    print(json.dumps(runs, indent=1))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    shown = commands.add_parser("figures")
    shown.add_argument("--model", type=pathlib.Path, required=True)
    shown.add_argument("--text", type=pathlib.Path, default=REPO.parent / "shared" / "data" / "tinyshakespeare.txt")
    shown.add_argument("--windows", type=int, default=20)
    shown.add_argument("--lens-windows", type=int, default=20)
    timed = commands.add_parser("speed")
    timed.add_argument("--backends", nargs="+", default=["tensorflow", "jax", "torch"])
    timed.add_argument("--shapes", nargs="+", choices=["cpu", "gpt2"], default=["cpu", "gpt2"])
    timed.add_argument("--rounds", type=int, default=5)
    timed.add_argument("--processes", type=int, default=3)
    held = commands.add_parser("memory")
    held.add_argument("--code", type=pathlib.Path, default=None)
    held.add_argument("--tokens", type=int, default=1024)
    args = parser.parse_args()
    {"figures": figures, "speed": speed, "memory": memory}[args.command](args)


if __name__ == "__main__":
    main()
