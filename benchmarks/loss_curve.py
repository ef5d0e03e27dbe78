"""Validation loss against training time: gptlite's `cpu` preset beside nanoGPT's loop, drawn as one plot.

    python benchmarks/loss_curve.py [TEXT] [--out benchmarks/plots/loss_vs_time.png] [--max-iters 2000]

Two runs, each a child process of its own started with HOME and XDG_CACHE_HOME in a new empty folder, one
after the other: nanoGPT's model and loop re-written in PyTorch (`torch_reference.py`, eager, nanoGPT's CPU
configuration for Tiny Shakespeare: 4 x 4 x 128, context 64, batch 12, learning rate 1e-3), its validation
loss measured every 250 steps over 20 batches; and gptlite as `train.py TEXT` trains (`train_on_text`, the
`cpu` preset), its loss read from the run's history.csv. The time axis is seconds since each run's first step
was asked for (gptlite's `elapsed_s`: its compile and its evaluations count; the reference's: its evaluations
count), so the curves compare what each run spends to reach a loss. Prints each run's points, and writes the
plot.
"""

import argparse
import csv
import json
import os
import pathlib
import tempfile

from children import run_child

HERE = pathlib.Path(__file__).resolve().parent
SHAKESPEARE = HERE.parent.parent / "shared" / "data" / "tinyshakespeare.txt"
REFERENCE = dict(n_layer=4, n_head=4, n_embd=128, block_size=64, dropout=0.0, batch_size=12, lr=1e-3, min_lr=1e-4,
                 warmup_iters=100, beta2=0.99, weight_decay=0.1)
EVAL_INTERVAL, EVAL_BATCHES = 250, 20


def reference_points(text_path, max_iters, seed):
    """The reference's (seconds, validation loss) at every EVAL_INTERVAL steps."""
    import time

    import torch

    from torch_reference import ReferenceTrainer, character_splits

    torch.set_num_threads(os.cpu_count())
    train_ids, validation_ids, vocab_size = character_splits(pathlib.Path(text_path).read_text())
    trainer = ReferenceTrainer(train_ids, validation_ids, vocab_size, {**REFERENCE, "max_iters": max_iters}, seed=seed)
    points, started = [], time.perf_counter()
    for step in range(1, max_iters + 1):
        trainer.step()
        if step % EVAL_INTERVAL == 0 or step == max_iters:
            points.append((time.perf_counter() - started, trainer.validation_loss(EVAL_BATCHES), step))
    return points


def gptlite_points(text_path, max_iters, seed):
    """gptlite's (seconds, validation loss) at each evaluation, as train.py trains."""
    import gptlite

    out = pathlib.Path(tempfile.mkdtemp(prefix="loss-curve-"))
    gptlite.train_on_text([text_path], out, {"max_iters": max_iters, "seed": seed}, verbose=0)
    with open(out / "history.csv") as file:
        return [(float(row["elapsed_s"]), float(row["val_loss"]), int(row["step"])) for row in csv.DictReader(file)]


def draw(curves, path):
    from matplotlib.figure import Figure

    figure = Figure(figsize=(6, 4), dpi=100)
    axes = figure.subplots()
    for label, points in curves.items():
        axes.plot([seconds for seconds, _, _ in points], [loss for _, loss, _ in points], marker="o", label=label)
    axes.set_xlabel("seconds of training (2 CPU cores)")
    axes.set_ylabel("validation loss (nats per character)")
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, format="png")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("text", nargs="?", default=str(SHAKESPEARE))
    parser.add_argument("--out", type=pathlib.Path, default=HERE / "plots" / "loss_vs_time.png")
    parser.add_argument("--max-iters", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=1337)
    parser.add_argument("--child", choices=["reference", "gptlite"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        points = (reference_points if args.child == "reference" else gptlite_points)(args.text, args.max_iters,
                                                                                      args.seed)
        print(json.dumps({"points": points}))
        return
    curves = {}
    for child, label in (("reference", "nanoGPT's loop (PyTorch, eager)"), ("gptlite", "gptlite, cpu preset")):
        home = tempfile.mkdtemp(prefix="loss-curve-home-")
        env = {**os.environ, "HOME": home, "XDG_CACHE_HOME": f"{home}/.cache"}
        curves[label] = run_child(child, [__file__, args.text, "--max-iters", str(args.max_iters), "--seed",
                                          str(args.seed), "--child", child], env)
        curves[label] = curves[label]["points"]
        for seconds, loss, step in curves[label]:
            print(f"{label}: step {step}, {seconds:.1f} s, validation loss {loss:.4f}", flush=True)
    draw(curves, args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
