"""Generation speed: tokens/s and time to first token, cached against full recomputation.

    python benchmarks/generate.py [--new-tokens 500 | --within-window] [--batch-sizes 1 8] [--sizes cpu big]

Models have random weights (speed only) and a 65-token vocabulary:
`cpu` is the cpu preset's shape (4 layers, 4 heads, width 128, context 64),
`big` the gpu preset's (6 layers, 6 heads, width 384, context 256).
"cached" is gptlite's generation; "recompute" runs the compiled model on the
whole window for every token (what nanoGPT's `generate` does). With 500 new
tokens both sizes outgrow their context, and every token past it needs the
whole window recomputed; `--within-window` generates block_size - 1 tokens
from a one-token prompt instead, so the cached path never slides. Each figure is
the median of --repeats runs after one warm-up run that also measures the
first-token time with compilation included.
"""

import argparse
import statistics
import time

import keras
import numpy as np

import gptlite

SIZES = {
    "cpu": dict(n_layer=4, n_head=4, n_embd=128, block_size=64),
    "big": dict(n_layer=6, n_head=6, n_embd=384, block_size=256),
}


def cached(model, batch_size, new_tokens, seed):
    prompts = ["A"] * batch_size
    if batch_size == 1:
        pieces = gptlite.stream(model, "A", max_new_tokens=new_tokens, temperature=1.0, seed=seed)
        start = time.perf_counter()
        next(pieces)
        first = time.perf_counter() - start
        for _ in pieces:
            pass
        return first, time.perf_counter() - start
    start = time.perf_counter()
    gptlite.generate(model, prompts, max_new_tokens=new_tokens, temperature=1.0, seed=seed)
    return None, time.perf_counter() - start


def recompute(model, batch_size, new_tokens, seed):
    import tensorflow as tf

    block_size = model.config.block_size
    forward = getattr(model, "_benchmark_forward", None)
    if forward is None:
        forward = tf.function(lambda ids, i: keras.ops.take(model(ids), i, axis=1), jit_compile=True)
        model._benchmark_forward = forward
    rng = np.random.default_rng(seed)
    rows = np.zeros((batch_size, 1), dtype=np.int32)
    start = time.perf_counter()
    first = None
    for _ in range(new_tokens):
        context = rows[:, -block_size:]
        window = np.zeros((batch_size, block_size), dtype=np.int32)
        window[:, : context.shape[1]] = context
        logits = keras.ops.convert_to_numpy(forward(window, np.int32(context.shape[1] - 1)))
        probabilities = np.exp(logits - logits.max(axis=1, keepdims=True))
        probabilities /= probabilities.sum(axis=1, keepdims=True)
        chosen = np.array([rng.choice(len(p), p=p) for p in probabilities], dtype=np.int32)
        rows = np.concatenate([rows, chosen[:, None]], axis=1)
        first = first or time.perf_counter() - start
    return first, time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--new-tokens", type=int, default=500)
    parser.add_argument("--within-window", action="store_true",
                        help="generate block_size - 1 tokens, so that the context never slides")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    tokenizer = gptlite.CharTokenizer("".join(chr(32 + i) for i in range(65)))
    print("| size | new tokens | batch | method | tokens/s (median) | first token, cold (s) | first token, warm (ms) |")
    print("|---|---:|---:|---|---:|---:|---:|")
    for size in args.sizes:
        keras.utils.set_random_seed(0)
        model = gptlite.GPT(vocab_size=65, tokenizer=tokenizer, **SIZES[size])
        model.build((None, SIZES[size]["block_size"]))
        new_tokens = SIZES[size]["block_size"] - 1 if args.within_window else args.new_tokens
        for batch_size in args.batch_sizes:
            for name, method in (("cached", cached), ("recompute", recompute)):
                cold_first, _ = method(model, batch_size, new_tokens, seed=0)
                runs = [method(model, batch_size, new_tokens, seed=i + 1) for i in range(args.repeats)]
                rate = statistics.median(batch_size * new_tokens / total for _, total in runs)
                warm_first = [first for first, _ in runs if first is not None]
                cold = f"{cold_first:.2f}" if cold_first is not None else "–"
                warm = f"{statistics.median(warm_first) * 1000:.1f}" if warm_first else "–"
                print(f"| {size} | {new_tokens} | {batch_size} | {name} | {rate:,.0f} | {cold} | {warm} |",
                      flush=True)


if __name__ == "__main__":
    main()
