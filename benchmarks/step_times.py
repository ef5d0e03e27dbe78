"""The training step of `architectures.py`'s variants, timed side by side in one process.

    python benchmarks/step_times.py [--preset cpu] [--variants modern_muon_1500 laptop ...] [--blocks 15]
        [--block-steps 10] [--vocab-size 65]

One model per variant (the preset's settings with the variant's over them), built and compiled as a run compiles
it; blocks of `--block-steps` steps of each model in turns, on one fixed batch of the variant's shape, so that the
host's noise hits every variant alike. Prints each variant's median ms per step and the median of its
block-by-block ratio to the first variant's: the steps a variant fits in the first one's wall time. The step here
is `train_on_batch`'s, which costs a little more than `fit`'s, so a ratio here errs towards 1; the loss is
`architectures.py`'s.
"""

import argparse
import time

import keras
import numpy as np

import gptlite
from gptlite.training.fit import compile_for_training
from gptlite.training.settings import split_settings

from helpers.runs import settings_for, VARIANTS


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="cpu")
    parser.add_argument("--variants", nargs="+", default=["modern_muon_1500", "laptop"], choices=list(VARIANTS))
    parser.add_argument("--blocks", type=int, default=15)
    parser.add_argument("--block-steps", type=int, default=10)
    parser.add_argument("--vocab-size", type=int, default=65, help="the vocabulary (Tiny Shakespeare's characters)")
    args = parser.parse_args()
    models, batches = {}, {}
    rng = np.random.default_rng(0)
    for name in args.variants:
        settings = {**settings_for(args.preset, {}), **VARIANTS[name]}
        model_settings, training_settings = split_settings(settings)
        keras.utils.set_random_seed(1337)
        model = gptlite.GPT(vocab_size=args.vocab_size, **model_settings)
        model.build((None, model.config.block_size))
        compile_for_training(model, gptlite.TrainingConfig(**training_settings))
        shape = (settings["batch_size"], settings["block_size"])
        batches[name] = rng.integers(0, args.vocab_size, size=shape), rng.integers(0, args.vocab_size, size=shape)
        for _ in range(5):  # the compile, and a few steps past it
            model.train_on_batch(*batches[name])
        models[name] = model
    times = {name: [] for name in models}
    for _ in range(args.blocks):
        for name, model in models.items():
            started = time.perf_counter()
            for _ in range(args.block_steps):
                model.train_on_batch(*batches[name])
            times[name].append((time.perf_counter() - started) / args.block_steps * 1000)
    first = np.array(times[args.variants[0]])
    print(f"\n{args.preset} preset with each variant's settings, {keras.backend.backend()}; medians of "
          f"{args.blocks} blocks of {args.block_steps} steps\n")
    print(f"| variant | parameters | ms/step | ratio to {args.variants[0]} |")
    print("|---|---:|---:|---:|")
    for name, block_times in times.items():
        ratio = np.median(np.array(block_times) / first)
        print(f"| {name} | {models[name].count_params():,} | {np.median(block_times):.1f} | {ratio:.3f} |")


if __name__ == "__main__":
    main()
