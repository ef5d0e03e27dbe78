"""Pre-norm and post-norm blocks with and without the learning rate's warm-up: validation loss against step, one
plot.

    python benchmarks/norm_position.py [TEXT] [--preset cpu] [--n-layer N] [--max-iters N] [--eval-interval 25]
        [--seed 1337] [--parallel 2] [--out benchmarks/plots/norm_position.png]

Four runs of the preset's budget on TEXT (default: Tiny Shakespeare), each as train.py trains (`train_on_text`), in
a child process of its own: the norms before each sublayer (`norm_position="pre"`, the default) or after each
residual addition (`"post"`, the original Transformer's), each with the preset's warm-up (100 steps of a linear
rise to the peak rate) and with none (`warmup_iters=0`: the peak rate from the first step). `--n-layer` and
`--max-iters` change the preset's depth and steps, for a deeper model, where post-norm is known to need its
warm-up most. Every run is deterministic, so `--parallel` runs that many children at a time, and their times are
not reported. Each run's validation loss comes from its history.csv, evaluated every `--eval-interval` steps so
that the first hundred steps show.
"""

import argparse
import concurrent.futures
import csv
import json
import os
import pathlib
import tempfile

from helpers import run_child
from helpers import draw_lines

HERE = pathlib.Path(__file__).resolve().parent
SHAKESPEARE = HERE.parent.parent / "shared" / "data" / "tinyshakespeare.txt"
RUNS = {"pre-norm, 100 warm-up steps": {"norm_position": "pre"},
        "post-norm, 100 warm-up steps": {"norm_position": "post"},
        "pre-norm, no warm-up": {"norm_position": "pre", "warmup_iters": 0},
        "post-norm, no warm-up": {"norm_position": "post", "warmup_iters": 0}}


def points(text, preset, settings):
    """A run's (step, train loss, validation loss) at each evaluation."""
    import gptlite

    with tempfile.TemporaryDirectory(prefix="norm-position-") as out:
        gptlite.train_on_text([text], out, settings, preset=preset, verbose=0)
        with open(pathlib.Path(out) / "history.csv") as file:
            return [(int(row["step"]), float(row["train_loss"]), float(row["val_loss"]))
                    for row in csv.DictReader(file)]


def draw(curves, path, title):
    lines = {label: ([step for step, _, _ in rows], [loss for _, _, loss in rows],
                     {"linestyle": "-" if label.startswith("pre") else "--"}) for label, rows in curves.items()}
    draw_lines(lines, path, "step", title, size=(6.5, 4.2), ylim=(None, 3.5))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("text", nargs="?", default=str(SHAKESPEARE))
    parser.add_argument("--preset", default="cpu")
    parser.add_argument("--n-layer", type=int, help="blocks (default: the preset's)")
    parser.add_argument("--max-iters", type=int, help="steps (default: the preset's)")
    parser.add_argument("--eval-interval", type=int, default=25)
    parser.add_argument("--seed", type=int, default=1337)
    parser.add_argument("--parallel", type=int, default=2, help="children at a time")
    parser.add_argument("--out", type=pathlib.Path, default=HERE / "plots" / "norm_position.png")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    every = {"eval_interval": args.eval_interval, "seed": args.seed,
             **{name: getattr(args, name) for name in ("n_layer", "max_iters") if getattr(args, name)}}
    if args.child:
        print(json.dumps({"points": points(args.text, args.preset, {**every, **RUNS[args.child]})}))
        return

    def run(label):
        command = [__file__, args.text, "--preset", args.preset, "--eval-interval", str(args.eval_interval),
                   "--seed", str(args.seed), "--child", label]
        command += [f"--{name.replace('_', '-')}={every[name]}" for name in ("n_layer", "max_iters") if name in every]
        return run_child(label, command, dict(os.environ))["points"]

    with concurrent.futures.ThreadPoolExecutor(args.parallel) as pool:
        curves = dict(zip(RUNS, pool.map(run, RUNS)))
    changed = "".join(f", {name} {every[name]}" for name in ("n_layer", "max_iters") if name in every)
    title = f"{args.preset} preset's budget{changed}, seed {args.seed}"
    print(f"\n{title}; validation loss at steps\n")
    shown = [step for step, _, _ in curves[next(iter(RUNS))] if step in (25, 50, 100, 250, 500, 1000)]
    print("| run | " + " | ".join(f"{step:,}" for step in shown) + " | last | lowest (step) |")
    print("|---|" + "---:|" * (len(shown) + 2))
    for label, rows in curves.items():
        losses = {step: loss for step, _, loss in rows}
        lowest = min(rows, key=lambda row: row[2])
        print(f"| {label} | " + " | ".join(f"{losses[step]:.3f}" for step in shown) +
              f" | {rows[-1][2]:.3f} | {lowest[2]:.3f} ({lowest[0]:,}) |")
    draw(curves, args.out, title)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
