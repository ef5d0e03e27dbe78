"""Muon's training step with each count of Newton-Schulz iterations, timed side by side.

    python benchmarks/newton_schulz_steps.py [--preset laptop] [--iterations 5 3 4] [--blocks 15] [--block-steps 10]

One model per count, built and compiled as a run compiles it, in one process; blocks of `--block-steps` steps of
each model in turns, on one fixed batch of the preset's shape, so that the host's noise hits every count alike.
Prints each count's median ms per step and the median of its block-by-block ratio to the first count's. The step
here is `train_on_batch`'s, which costs a little more than `fit`'s, so a ratio here errs towards 1: it finds what
the iterations cost, and the steps a cheaper step leaves time for; the loss is `architectures.py`'s.
"""

import argparse
import time

import keras
import numpy as np

import gptlite
from gptlite.training.fit import compile_for_training
from gptlite.training.settings import PRESETS, split_settings


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="laptop")
    parser.add_argument("--iterations", type=int, nargs="+", default=[5, 3, 4])
    parser.add_argument("--blocks", type=int, default=15)
    parser.add_argument("--block-steps", type=int, default=10)
    parser.add_argument("--vocab-size", type=int, default=65, help="the vocabulary (Tiny Shakespeare's characters)")
    args = parser.parse_args()
    models = {}
    for count in args.iterations:
        model_settings, training_settings = split_settings(
            {**PRESETS[args.preset], "optimizer": "muon", "newton_schulz_steps": count})
        keras.utils.set_random_seed(1337)
        model = gptlite.GPT(vocab_size=args.vocab_size, **model_settings)
        model.build((None, model.config.block_size))
        compile_for_training(model, gptlite.TrainingConfig(**training_settings))
        models[count] = model
    rng = np.random.default_rng(0)
    shape = (PRESETS[args.preset]["batch_size"], PRESETS[args.preset]["block_size"])
    inputs, targets = rng.integers(0, args.vocab_size, size=shape), rng.integers(0, args.vocab_size, size=shape)
    for model in models.values():  # the compile, and a few steps past it
        for _ in range(5):
            model.train_on_batch(inputs, targets)
    times = {count: [] for count in models}
    for _ in range(args.blocks):
        for count, model in models.items():
            started = time.perf_counter()
            for _ in range(args.block_steps):
                model.train_on_batch(inputs, targets)
            times[count].append((time.perf_counter() - started) / args.block_steps * 1000)
    first = np.array(times[args.iterations[0]])
    print(f"\n{args.preset} preset's model and batch {shape}, {keras.backend.backend()}; medians of {args.blocks} "
          f"blocks of {args.block_steps} steps\n")
    print("| Newton-Schulz iterations | ms/step | ratio to " + f"{args.iterations[0]} |")
    print("|---:|---:|---:|")
    for count, block_times in times.items():
        ratio = np.median(np.array(block_times) / first)
        print(f"| {count} | {np.median(block_times):.1f} | {ratio:.3f} |")


if __name__ == "__main__":
    main()
