"""Fine-tuning a GPT-2 (124M) shape: gptlite's full and LoRA steps beside the PyTorch reference's, in one run.

    python benchmarks/finetune.py [--batch-size 1] [--block-size 256] [--steps 5] [--rounds 3] [--rank 8]
                                  [--backend tensorflow] [--precision fp32]

The shape is GPT-2 small's (12 layers, 12 heads, width 768, its 50,257-token
vocabulary) with a context of --block-size; random weights (speed only). The
reference is `torch_reference.py`'s nanoGPT model and AdamW step, eager, in
float32. gptlite trains through `gptlite.training.fit.train` as a fine-tuning run
does, in full and with LoRA adapters of --rank on every projection. Each
measurement runs in a process of its own, in turns (reference, full, LoRA,
then again), and reports ms per step in steady state (the time of --steps
steps after two warm-up steps, which include compiling) and the process's
peak resident memory by the last timed step. The figures are the medians
over --rounds.
"""

import argparse
import json
import os
import statistics
import sys

from helpers import in_turns, run_child, time_steps
from helpers.runs import GPT2_SMALL, measure_gptlite, WARMUP_STEPS



def measure_reference(args):
    import numpy as np
    import torch

    from helpers.torch_reference import ReferenceTrainer

    settings = dict(GPT2_SMALL, block_size=args.block_size, batch_size=args.batch_size, dropout=0.0, lr=1e-4,
                    min_lr=1e-5, warmup_iters=2, max_iters=1000, beta2=0.99, weight_decay=0.1)
    torch.set_num_threads(os.cpu_count())
    ids = np.random.default_rng(0).integers(0, GPT2_SMALL["vocab_size"], 200_000)
    trainer = ReferenceTrainer(ids, ids, GPT2_SMALL["vocab_size"], settings)
    return time_steps(trainer.step, args.steps, WARMUP_STEPS)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--block-size", type=int, default=256)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--backend", default="tensorflow")
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--child", choices=["reference", "full", "lora"], default=None)
    args = parser.parse_args()
    if args.child:
        result = (measure_reference(args) if args.child == "reference"
                  else measure_gptlite(args, args.rank if args.child == "lora" else 0))
        print(json.dumps(result))
        return

    env = dict(os.environ, KERAS_BACKEND=args.backend)
    flags = [f"--batch-size={args.batch_size}", f"--block-size={args.block_size}", f"--steps={args.steps}",
             f"--rank={args.rank}", f"--precision={args.precision}"]
    results = in_turns(["reference", "full", "lora"], args.rounds,
                       lambda kind, _: run_child(kind, [__file__, f"--child={kind}", *flags], env), sys.stderr)
    reference_ms = statistics.median(r["ms_per_step"] for r in results["reference"])
    full_ms = statistics.median(r["ms_per_step"] for r in results["full"])
    print(f"GPT-2 124M shape, context {args.block_size}, batch {args.batch_size}, {args.rounds} rounds; gptlite on "
          f"{args.backend} {args.precision}")
    print("| run | ms/step (median) | vs reference | peak RSS, MB | trained parameters |")
    print("|---|---:|---:|---:|---:|")
    for kind, rows in results.items():
        ms = statistics.median(r["ms_per_step"] for r in rows)
        rss = statistics.median(r["peak_rss_mb"] for r in rows)
        trained = rows[0].get("trainable", "")
        print(f"| {kind} | {ms:,.0f} | {ms / reference_ms:.2f}x | {rss:,.0f} | "
              f"{trained if isinstance(trained, str) else f'{trained:,}'} |")
    lora_ms = statistics.median(r["ms_per_step"] for r in results["lora"])
    print(f"LoRA step against the full step: {full_ms / lora_ms:.2f}x faster")


if __name__ == "__main__":
    main()
