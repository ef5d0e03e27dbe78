"""A whole training run against its steps: do checkpoints, evaluations and the disk cost the run its speed?

    python benchmarks/probe_whole_run.py [TEXT] [--steps 300 800] [--slow-fsync 0 5] [--rounds 2] [--code DIR]
                                   [--reference]

Each run is a child process of its own, the runs taken in turns round by
round. gptlite runs as `train.py TEXT` does (`gptlite.train_on_text` with
the `cpu` preset and its evaluation and checkpoint intervals, 250 steps),
for each of --steps; with a --slow-fsync of S seconds, `os.fsync` first
sleeps S seconds in the child: a disk that syncs slowly (a laptop's, a
network home folder, a cloud volume). `--code DIR` runs the gptlite found
in DIR beside this one (a checkout of other code). `--reference` adds the
PyTorch re-implementation of nanoGPT's loop (benchmarks/torch_reference.py)
run as nanoGPT's train.py runs it with `always_save_checkpoint`: at every
evaluation (eval_iters batches of each split) the model's and optimizer's
state go to ckpt.pt with `torch.save`, which syncs nothing.

Reported, medians over the rounds: each run's wall time (the training call;
for the reference its loop), the steps' own time (gptlite: its history's
tokens per second; the reference: the median step), and two steady states,
each as a multiple of the bare step: the wall time of the longest run less
the shortest's, over their difference in steps ("whole"), and, within the
longest run, the time from its first evaluation to its last but one over
the steps between ("mid-run": the evaluations, checkpoints and writes in
between count, the start and the end's wait for the disk do not). gptlite's
run also reports where its time went (the history's last `*_s` columns,
where the code has them).
"""

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile

from helpers import with_code

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent
DEFAULT_TEXT = REPO.parent / "shared" / "data" / "tinyshakespeare.txt"

GPTLITE = """
import json, os, statistics, sys, time
text, out, steps, slow = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
if slow:
    fsync = os.fsync
    def slow_fsync(descriptor):
        time.sleep(slow)
        fsync(descriptor)
    os.fsync = slow_fsync
import gptlite
gptlite.compile_cache.use()
import keras
started = time.perf_counter()
run = gptlite.train_on_text([text], out, {"max_iters": steps}, verbose=0)
wall = time.perf_counter() - started
rows, config = run.history, run.training_config
tokens = config.batch_size * run.model.config.block_size * config.grad_accum
step_s = statistics.median(tokens / row["tokens_per_s"] for row in rows)
parts = {name: value for name, value in rows[-1].items() if name.endswith("_s") and name != "elapsed_s"}
evaluations = {row["step"]: row["elapsed_s"] for row in rows}
print(json.dumps(dict(wall_s=wall, step_s=step_s, parts=parts, evaluations=evaluations)))
"""

REFERENCE = """
import json, os, statistics, sys, time
text, out, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
import torch
from helpers.torch_reference import ReferenceTrainer, character_splits
from gptlite.training.settings import PRESETS
settings = {**PRESETS["cpu"], "max_iters": steps, "lr": 1e-3}
train_ids, validation_ids, vocabulary_size = character_splits(open(text, encoding="utf-8").read())
started = time.perf_counter()
trainer = ReferenceTrainer(train_ids, validation_ids, vocabulary_size, settings)
step_times, evaluations = [], {}
for iteration in range(1, steps + 1):
    began = time.perf_counter()
    trainer.step()
    step_times.append(time.perf_counter() - began)
    if iteration % settings["eval_interval"] == 0 or iteration == steps:
        evaluations[iteration] = time.perf_counter() - started
        # nanoGPT's estimate_loss: both splits; then always_save_checkpoint.
        trainer.validation_loss(settings["eval_iters"])
        saved_ids, trainer.validation_ids = trainer.validation_ids, trainer.train_ids
        trainer.validation_loss(settings["eval_iters"])
        trainer.validation_ids = saved_ids
        torch.save({"model": trainer.model.state_dict(), "optimizer": trainer.optimizer.state_dict(),
                    "iter_num": iteration}, os.path.join(out, "ckpt.pt"))
wall = time.perf_counter() - started
print(json.dumps(dict(wall_s=wall, step_s=statistics.median(step_times[1:]), parts={}, evaluations=evaluations)))
"""


def run(kind, code, text, steps, slow):
    with tempfile.TemporaryDirectory() as out:
        if kind == "reference":
            command = [sys.executable, "-c", REFERENCE, str(text), out, str(steps)]
        else:
            command = [sys.executable, "-c", GPTLITE, str(text), str(pathlib.Path(out) / "run"), str(steps), str(slow)]
        # The reference imports this folder's helpers; gptlite's run imports the checkout `code`'s gptlite.
        environment = with_code(dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"), HERE if kind == "reference" else code)
        result = subprocess.run(command, capture_output=True, text=True, env=environment, cwd=tempfile.gettempdir())
    if result.returncode:
        sys.exit(result.stderr[-3000:])
    return json.loads(result.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("text", nargs="?", type=pathlib.Path, default=DEFAULT_TEXT)
    parser.add_argument("--steps", type=int, nargs="+", default=[300, 800])
    parser.add_argument("--slow-fsync", type=float, nargs="+", default=[0.0, 5.0], metavar="S")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--code", type=pathlib.Path, nargs="*", default=[REPO])
    parser.add_argument("--reference", action="store_true")
    args = parser.parse_args()
    kinds = [(f"gptlite {code}, fsync +{slow:g} s", "gptlite", code, slow) for code in args.code
             for slow in args.slow_fsync]
    if args.reference:
        kinds.append(("reference (nanoGPT's loop)", "reference", None, 0.0))
    results = {name: {steps: [] for steps in args.steps} for name, *_ in kinds}
    for round_index in range(args.rounds):
        for name, kind, code, slow in kinds:
            for steps in args.steps:
                result = run(kind, code, args.text, steps, slow)
                results[name][steps].append(result)
                print(json.dumps({"round": round_index, "run": name, "steps": steps, **result}), flush=True)
    shortest, longest = min(args.steps), max(args.steps)
    report = {}
    for name, by_steps in results.items():
        wall = {steps: statistics.median(result["wall_s"] for result in runs) for steps, runs in by_steps.items()}
        step_s = statistics.median(result["step_s"] for runs in by_steps.values() for result in runs)
        report[name] = {"wall_s": wall, "step_ms": round(step_s * 1000, 2)}
        if longest > shortest:
            steady = (wall[longest] - wall[shortest]) / (longest - shortest)
            report[name].update(whole_steady_ms=round(steady * 1000, 2), whole_over_step=round(steady / step_s, 3))
        mid = []
        for result in by_steps[longest]:
            marks = sorted((int(float(step)), seconds) for step, seconds in result["evaluations"].items())
            if len(marks) >= 3:
                (first, began), (last, ended) = marks[0], marks[-2]
                mid.append((ended - began) / (last - first))
        if mid:
            report[name].update(mid_run_ms=round(statistics.median(mid) * 1000, 2),
                                mid_run_over_step=round(statistics.median(mid) / step_s, 3))
        report[name]["parts_of_longest"] = by_steps[longest][-1]["parts"]
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
