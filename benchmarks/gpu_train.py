"""The `gpu` preset beside nanoGPT's loop on one CUDA GPU: whole runs, steady steps and losses.

    python benchmarks/gpu_train.py [TEXT] [--runs reference gptlite gptlite-attention-dropout]
        [--max-iters 5000] [--eval-interval 250] [--reference-eval-iters 200]

Each run is a process of its own, timed from its launch to its exit:
- reference: `torch_reference.py`'s nanoGPT model and loop as nanoGPT's GPU
  configuration runs them (bf16 autocast, `torch.compile`, TF32, fused
  AdamW), with nanoGPT's own loop around the steps: both splits evaluated
  on 200 batches every 250 steps, a checkpoint saved when the validation
  loss improves, the loss read back every 10 steps;
- gptlite: `train.py TEXT --preset gpu` as a user runs it (its own
  evaluations and checkpoints), on the backend of KERAS_BACKEND;
- gptlite-attention-dropout: the same with `--attention-dropout 0.2`, which
  makes its recipe nanoGPT's exactly (the preset leaves attention dropout
  off so that attention runs fused).
Every line a run prints is shown as it comes, with the seconds since its
launch. Reports for each: wall seconds, launch to exit; the median
milliseconds of a training step between evaluations (the first interval, which compiles, left
out; each interval ends with a device sync); tokens a second at that median;
the best and the last validation loss.
"""

import argparse
import csv
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
DEFAULT_TEXT = HERE.parents[1] / "shared" / "data" / "tinyshakespeare.txt"
RUNS = ("reference", "gptlite", "gptlite-attention-dropout")
# nanoGPT's train_shakespeare_char configuration where it differs from the preset.
REFERENCE_EVAL_ITERS = 200  # batches of each split at each evaluation
REFERENCE_LOG_INTERVAL = 10


def reference_child(text_path, max_iters, eval_interval, eval_iters, out_dir):
    import torch

    from gptlite.training.settings import PRESETS
    from helpers.torch_reference import ReferenceTrainer, character_splits

    settings = {**PRESETS["gpu"], "max_iters": max_iters, "eval_interval": eval_interval}
    train_ids, validation_ids, vocabulary_size = character_splits(pathlib.Path(text_path).read_text(encoding="utf-8"))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    trainer = ReferenceTrainer(train_ids, validation_ids, vocabulary_size, settings, "bf16", device=device,
                               compile=device == "cuda")
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    rows, best = [], float("inf")
    interval_began = time.perf_counter()
    for iteration in range(max_iters + 1):
        if iteration % settings["eval_interval"] == 0 or iteration == max_iters:
            sync()
            steps_s = time.perf_counter() - interval_began
            train_loss = trainer.validation_loss(eval_iters, trainer.train_ids)
            val_loss = trainer.validation_loss(eval_iters)
            rows.append({"step": iteration, "train_loss": train_loss, "val_loss": val_loss, "interval_s": steps_s})
            if val_loss < best and iteration > 0:
                best = val_loss
                torch.save({"model": trainer.model.state_dict(), "optimizer": trainer.optimizer.state_dict(),
                            "iter_num": iteration}, os.path.join(out_dir, "ckpt.pt"))
            if iteration == max_iters:
                break
            interval_began = time.perf_counter()
        loss = trainer.step()
        if iteration % REFERENCE_LOG_INTERVAL == 0:
            loss.item()
    return rows


def interval_rows(history_path):
    """gptlite's history.csv as the reference's rows: each evaluation's step and losses, and the seconds of the
    steps since the evaluation before."""
    rows, last = [], 0.0
    with open(history_path, newline="") as file:
        for row in csv.DictReader(file):
            steps_s = float(row["steps_s"])
            rows.append({"step": int(row["step"]), "train_loss": float(row["train_loss"]),
                         "val_loss": float(row["val_loss"]), "interval_s": steps_s - last})
            last = steps_s
    return rows


def run(name, text_path, settings, out_dir):
    started = time.perf_counter()
    steps = ["--max-iters", str(settings["max_iters"]), "--eval-interval", str(settings["eval_interval"])]
    if name == "reference":
        command = [sys.executable, __file__, str(text_path), "--child", *steps, "--out", out_dir,
                   "--reference-eval-iters", str(settings["reference_eval_iters"])]
    else:
        command = [sys.executable, str(HERE.parent / "train.py"), str(text_path), "--preset", "gpu", *steps,
                   "--checkpoint-interval", str(settings["eval_interval"]), "--out", out_dir]
        if name == "gptlite-attention-dropout":
            command += ["--attention-dropout", "0.2"]
    # Each line of the child's output as it comes, named, so that a run cut short still shows how far it got.
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=HERE.parent)
    lines = []
    for line in child.stdout:
        lines.append(line.rstrip("\n"))
        print(f"[{name} {time.perf_counter() - started:.1f} s] {lines[-1][:300]}", flush=True)
    wall = time.perf_counter() - started
    if child.wait():
        sys.exit(f"{name} failed")
    if name == "reference":
        rows = json.loads(lines[-1])
    else:
        rows = interval_rows(pathlib.Path(out_dir) / "history.csv")
    return wall, rows


def summary(name, wall, rows, settings):
    evaluated = [row for row in rows if row["step"] > 0]
    interval = settings["eval_interval"]
    # Whole intervals only, the first (which compiles) left out.
    steady = [row["interval_s"] / interval for previous, row in zip(evaluated, evaluated[1:])
              if row["step"] - previous["step"] == interval]
    step_s = statistics.median(steady)
    best = min(evaluated, key=lambda row: row["val_loss"])
    return {"run": name, "wall_s": wall, "ms_per_step": step_s * 1000,
            "tokens_per_s": settings["batch_size"] * settings["block_size"] / step_s,
            "best_val_loss": best["val_loss"], "best_step": best["step"], "last_val_loss": evaluated[-1]["val_loss"],
            "last_train_loss": evaluated[-1]["train_loss"]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("text", nargs="?", type=pathlib.Path, default=DEFAULT_TEXT)
    parser.add_argument("--runs", nargs="+", choices=RUNS, default=list(RUNS))
    parser.add_argument("--max-iters", type=int, default=5000)
    parser.add_argument("--eval-interval", type=int, default=250)
    parser.add_argument("--reference-eval-iters", type=int, default=REFERENCE_EVAL_ITERS)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(reference_child(args.text, args.max_iters, args.eval_interval, args.reference_eval_iters,
                                          args.out)))
        return

    from gptlite.training.settings import PRESETS

    settings = {**PRESETS["gpu"], "max_iters": args.max_iters, "eval_interval": args.eval_interval,
                "reference_eval_iters": args.reference_eval_iters}
    results = []
    for name in args.runs:
        with tempfile.TemporaryDirectory() as out_dir:
            wall, rows = run(name, args.text.resolve(), settings, out_dir)
        result = summary(name, wall, rows, settings)
        results.append(result)
        print(json.dumps(result), flush=True)
    first = results[0]
    print(f"\n`gpu` preset's shape, batch {settings['batch_size']}, context {settings['block_size']}, "
          f"{args.max_iters} steps; ratios to {first['run']}\n")
    print("| run | wall s, launch to exit | ms/step | tokens/s | best val loss (step) | last val loss "
          "| last train loss |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for result in results:
        ratio = "" if result is first else f" ({result['wall_s'] / first['wall_s']:.2f}x)"
        step_ratio = "" if result is first else f" ({result['ms_per_step'] / first['ms_per_step']:.2f}x)"
        print(f"| {result['run']} | {result['wall_s']:.1f}{ratio} | {result['ms_per_step']:.2f}{step_ratio} | "
              f"{result['tokens_per_s']:,.0f} | {result['best_val_loss']:.4f} ({result['best_step']}) | "
              f"{result['last_val_loss']:.4f} | {result['last_train_loss']:.4f} |")


if __name__ == "__main__":
    main()
