"""gptlite's generation against KerasHub's GPT-2 `generate`, side by side in one process.

    python benchmarks/peers.py [--sizes cpu big] [--batch-sizes 1 8] [--repeats 3]

Both models have random weights (speed only), a 65-token vocabulary and the
same shape: `cpu` is the cpu preset's (4 layers, 4 heads, width 128,
context 64), `big` the gpu preset's (6 x 6 x 384, context 256). Each
generates block_size - 1 new tokens from a one-token prompt, sampling from
the whole distribution at temperature 1 (KerasHub's "random" sampler), with
XLA on for both (KerasHub's default "auto" leaves it off on a CPU). KerasHub
cannot go past its position table, so the run stays within the context
window. "cold" is the first call with a new model, compilation included; the
rates are the median of --repeats calls after it.
"""

import argparse
import statistics
import time

import keras
import keras_hub
import numpy as np

import gptlite
from helpers.models import SIZES, VOCABULARY_SIZE, random_model

def gptlite_runner(size, batch_size):
    model = random_model(size)
    new_tokens = SIZES[size]["block_size"] - 1
    return lambda seed: gptlite.generate(model, ["A"] * batch_size, new_tokens, temperature=1.0, seed=seed)


def keras_hub_runner(size, batch_size):
    shape = SIZES[size]
    keras.utils.set_random_seed(0)
    backbone = keras_hub.models.GPT2Backbone(
        vocabulary_size=VOCABULARY_SIZE, num_layers=shape["n_layer"], num_heads=shape["n_head"], hidden_dim=shape["n_embd"],
        intermediate_dim=4 * shape["n_embd"], dropout=0.0, max_sequence_length=shape["block_size"],
    )
    model = keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)
    model.compile(sampler="random", jit_compile=True)
    token_ids = np.zeros((batch_size, shape["block_size"]), "int32")
    padding_mask = np.zeros((batch_size, shape["block_size"]), bool)
    token_ids[:, 0], padding_mask[:, 0] = 33, True  # the prompt: one token; the rest is generated
    inputs = {"token_ids": token_ids, "padding_mask": padding_mask}
    return lambda seed: model.generate(inputs, stop_token_ids=None)


def measure(runner, repeats):
    start = time.perf_counter()
    runner(0)
    cold = time.perf_counter() - start
    times = []
    for seed in range(1, repeats + 1):
        start = time.perf_counter()
        runner(seed)
        times.append(time.perf_counter() - start)
    return cold, statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print("| size | new tokens | batch | gptlite tokens/s | KerasHub GPT-2 tokens/s | ratio | gptlite cold (s) "
          "| KerasHub cold (s) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for size in args.sizes:
        new_tokens = SIZES[size]["block_size"] - 1
        for batch_size in args.batch_sizes:
            ours_cold, ours = measure(gptlite_runner(size, batch_size), args.repeats)
            theirs_cold, theirs = measure(keras_hub_runner(size, batch_size), args.repeats)
            rate = lambda seconds: batch_size * new_tokens / seconds
            print(f"| {size} | {new_tokens} | {batch_size} | {rate(ours):,.0f} | {rate(theirs):,.0f} "
                  f"| {theirs / ours:.1f}x | {ours_cold:.2f} | {theirs_cold:.2f} |", flush=True)


if __name__ == "__main__":
    main()
