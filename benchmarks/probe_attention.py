"""Fused attention (`keras.ops.dot_product_attention`) against step-by-step attention, in training.

    KERAS_BACKEND=torch python benchmarks/probe_attention.py --preset gpu --batch-size 8 --precision bf16 --steps 5
    KERAS_BACKEND=torch python benchmarks/probe_attention.py --preset cpu --steps 40

One model, random tokens; the two kinds alternate --rounds times in one
process (the attention layers' class is swapped between `fit` calls), so
noise hits both alike. Prints ms per step for each run and the medians. On
torch the layers choose by themselves; this forces each way in turn.
"""

import argparse
import statistics
import time

import keras
import numpy as np

import gptlite
from gptlite.data import lm
from gptlite.model.attention import Attention
from gptlite.training import fit
from gptlite.training.settings import dtype_policy, PRECISIONS, PRESETS, split_settings


class StepByStepAttention(Attention):
    def call(self, x, context=None, context_mask=None, training=None, return_attention_scores=False):
        return super().call(x, training=training, return_attention_scores=True)[0]


class FusedAttention(Attention):
    def call(self, x, context=None, context_mask=None, training=None, return_attention_scores=False):
        length = keras.ops.shape(x)[1]
        qkv = keras.ops.reshape(self.qkv_projection(x), (-1, length, 3, self.n_head, self.head_size))
        attended = keras.ops.dot_product_attention(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], is_causal=True)
        merged = keras.ops.reshape(attended, (-1, length, self.n_head * self.head_size))
        return self.output_dropout(self.output_projection(merged), training=training)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="cpu", choices=sorted(PRESETS))
    parser.add_argument("--batch-size", type=int)
    parser.add_argument("--precision", default="fp32", choices=sorted(PRECISIONS))
    parser.add_argument("--steps", type=int, default=40, help="steps per timed run")
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()

    settings = {**PRESETS[args.preset], "precision": args.precision}
    if args.batch_size:
        settings["batch_size"] = args.batch_size
    model_settings, training_settings = split_settings(settings)
    config = gptlite.TrainingConfig(**training_settings)
    keras.utils.set_random_seed(0)
    model = gptlite.GPT(vocab_size=65, dtype=dtype_policy(args.precision), **model_settings)
    block_size = model.config.block_size
    model.build((None, block_size))
    fit.compile_for_training(model, config)
    token_ids = np.random.default_rng(0).integers(0, 65, 200_000).astype(np.uint16)
    model.fit(lm.RandomWindows(token_ids, block_size, config.batch_size, 3), epochs=1, verbose=0)

    times = {"fused": [], "step by step": []}
    for _ in range(args.rounds):
        for kind, cls in (("fused", FusedAttention), ("step by step", StepByStepAttention)):
            for block in model.blocks:
                block.attention.__class__ = cls
            start = time.perf_counter()
            model.fit(lm.RandomWindows(token_ids, block_size, config.batch_size, args.steps), epochs=1, verbose=0)
            times[kind].append((time.perf_counter() - start) / args.steps * 1000)
    for kind, runs in times.items():
        print(f"{kind}: median {statistics.median(runs):.0f} ms/step ({', '.join(f'{t:.0f}' for t in runs)})")


if __name__ == "__main__":
    main()
