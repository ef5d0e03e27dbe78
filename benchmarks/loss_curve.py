"""Validation loss against training time: gptlite as `train.py TEXT` trains beside nanoGPT's loop, drawn as one plot.

    python benchmarks/loss_curve.py [TEXT] [--preset NAME] [--rounds 1] [--max-iters N]
        [--out benchmarks/plots/loss_vs_time.png]

Two runs a round, each a child process of its own started with HOME and XDG_CACHE_HOME in a new empty folder,
one after the other: nanoGPT's model and loop re-written in PyTorch (`torch_reference.py`, eager, nanoGPT's CPU
configuration for Tiny Shakespeare: 4 x 4 x 128, context 64, batch 12, 2,000 steps, learning rate 1e-3), its
validation loss measured every 250 steps over 20 batches; and gptlite as `train.py TEXT` trains
(`train_on_text` with the default preset, or --preset's), its loss read from the run's history.csv. --max-iters
sets both runs' steps (otherwise nanoGPT's 2,000 and the preset's own). Round r uses seed 1337 + r.

The plot's time axis (round 1) is seconds since each run's first step was asked for (gptlite's `elapsed_s`: its
compile and its evaluations count; the reference's: its evaluations count), so the curves compare what each
run spends to reach a loss. The table adds each run's whole wall time, from the child process's start to its
exit (Python's start, imports, reading the text, saving the model: what a person waits for), as medians over
the rounds with gptlite's ratio to the loop's.
"""

import argparse
import csv
import json
import os
import pathlib
import tempfile
import time

from helpers import draw_lines, in_turns, medians, new_machine, run_child

HERE = pathlib.Path(__file__).resolve().parent
SHAKESPEARE = HERE.parent.parent / "shared" / "data" / "tinyshakespeare.txt"
REFERENCE = dict(n_layer=4, n_head=4, n_embd=128, block_size=64, dropout=0.0, batch_size=12, lr=1e-3, min_lr=1e-4,
                 warmup_iters=100, beta2=0.99, weight_decay=0.1)
EVAL_INTERVAL, EVAL_BATCHES, REFERENCE_STEPS = 250, 20, 2000


def reference_points(text_path, max_iters, seed):
    """The reference's (seconds, validation loss) at every EVAL_INTERVAL steps."""
    import time

    import torch

    from helpers.torch_reference import ReferenceTrainer, character_splits

    torch.set_num_threads(os.cpu_count())
    train_ids, validation_ids, vocab_size = character_splits(pathlib.Path(text_path).read_text())
    trainer = ReferenceTrainer(train_ids, validation_ids, vocab_size, {**REFERENCE, "max_iters": max_iters}, seed=seed)
    points, started = [], time.perf_counter()
    for step in range(1, max_iters + 1):
        trainer.step()
        if step % EVAL_INTERVAL == 0 or step == max_iters:
            points.append((time.perf_counter() - started, trainer.validation_loss(EVAL_BATCHES), step))
    return points


def gptlite_points(text_path, max_iters, seed, preset=None):
    """gptlite's (seconds, validation loss) at each evaluation, as train.py trains (`preset`: the default's)."""
    import gptlite

    out = pathlib.Path(tempfile.mkdtemp(prefix="loss-curve-"))
    settings = {"seed": seed, **({"max_iters": max_iters} if max_iters else {})}
    gptlite.train_on_text([text_path], out, settings, preset=preset, verbose=0)
    with open(out / "history.csv") as file:
        return [(float(row["elapsed_s"]), float(row["val_loss"]), int(row["step"])) for row in csv.DictReader(file)]


def draw(curves, path):
    lines = {label: ([seconds for seconds, _, _ in points], [loss for _, loss, _ in points], {"marker": "o"})
             for label, points in curves.items()}
    draw_lines(lines, path, "seconds of training (2 CPU cores)")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("text", nargs="?", default=str(SHAKESPEARE))
    parser.add_argument("--out", type=pathlib.Path, default=HERE / "plots" / "loss_vs_time.png")
    parser.add_argument("--max-iters", type=int)
    parser.add_argument("--preset", help="gptlite's preset (default: train.py's default)")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--seed", type=int, default=1337, help=argparse.SUPPRESS)
    parser.add_argument("--child", choices=["reference", "gptlite"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        if args.child == "reference":
            points = reference_points(args.text, args.max_iters or REFERENCE_STEPS, args.seed)
        else:
            points = gptlite_points(args.text, args.max_iters, args.seed, args.preset)
        print(json.dumps({"points": points}))
        return
    from gptlite.training.settings import DEFAULT_PRESET

    labels = {"reference": "nanoGPT's loop (PyTorch, eager)", "gptlite": f"gptlite, {args.preset or DEFAULT_PRESET} "
              f"preset{'' if args.preset else ' (the default)'}"}
    def run(child, round_index):
        """One run from a new machine's empty home folder: its points, last loss and steps, and its wall time."""
        command = [__file__, args.text, "--seed", str(1337 + round_index), "--child", child]
        command += (["--max-iters", str(args.max_iters)] if args.max_iters else []) + \
            (["--preset", args.preset] if args.preset else [])
        started = time.perf_counter()
        points = run_child(child, command, new_machine(tempfile.mkdtemp(prefix="loss-curve-home-")))["points"]
        wall = time.perf_counter() - started  # the child's start to its exit
        for seconds, loss, step in points:
            print(f"round {round_index + 1}, {labels[child]}: step {step}, {seconds:.1f} s, validation loss "
                  f"{loss:.4f}", flush=True)
        return {"val_loss": points[-1][1], "steps": points[-1][2], "wall_s": wall, "points": points}

    runs = in_turns(list(labels), args.rounds, run)
    figures = medians(runs, ("val_loss", "wall_s"))
    print(f"\nmedians of {args.rounds} (seeds 1337..{1336 + args.rounds}); wall: the child process's start to exit\n")
    print("| run | steps | validation loss (each seed) | median | wall s | ratio |")
    print("|---|---:|---|---:|---:|---:|")
    for child, label in labels.items():
        losses = " / ".join(f"{result['val_loss']:.3f}" for result in runs[child])
        print(f"| {label} | {runs[child][0]['steps']:,} | {losses} | {figures[child]['val_loss']:.3f} | "
              f"{figures[child]['wall_s']:.1f} | {figures[child]['wall_s'] / figures['reference']['wall_s']:.2f}x |")
    draw({label: runs[child][0]["points"] for child, label in labels.items()}, args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
