"""Generation speed: tokens/s and time to first token, cached against full recomputation.

    python benchmarks/generate.py [--new-tokens 500 | --within-window] [--slide 1|half]
        [--batch-sizes 1 8] [--sizes cpu big] [--methods cached recompute] [--repeats 3]
        [--dtype float32|bfloat16] [--kv-heads 6 2] [--plot FILE]

Models have random weights (speed only) and a 65-token vocabulary:
`cpu` is the cpu preset's shape (4 layers, 4 heads, width 128, context 64),
`big` the gpu preset's (6 layers, 6 heads, width 384, context 256).
"cached" is gptlite's generation; "recompute" is the same with
`use_cache=False`, which runs the model on the whole window for every token
(what nanoGPT's `generate` does) and gives the same text for the same seed
(a note is printed if it does not). With 500 new tokens both sizes outgrow
their context: with `--slide 1` every token past it needs the whole window
recomputed, with `--slide half` one token in block_size / 2 does.
`--within-window` generates block_size - 1 tokens from a one-token prompt
instead, so the window never moves. Each figure is the median of --repeats
runs after one warm-up run, which also measures the first-token time with
compilation included (cold: the first generation with a new model).
`--dtype bfloat16` builds the models with bfloat16 weights and arithmetic;
`--kv-heads` measures each shape once per number of key/value heads given
(grouped-query attention; default: as many as query heads), side by side.
`--plot FILE` draws tokens/s against batch size, a line for each size and method, to a PNG.
"""

import argparse
import statistics
import time

import keras

import gptlite
from helpers.models import SIZES, random_model

def timed(model, batch_size, new_tokens, seed, use_cache, slide):
    """(seconds to the first token or None, seconds in all, the texts)."""
    settings = dict(max_new_tokens=new_tokens, temperature=1.0, seed=seed, use_cache=use_cache, slide=slide)
    start = time.perf_counter()
    if batch_size == 1:
        pieces = gptlite.stream(model, "A", **settings)
        first_piece = next(pieces)
        first = time.perf_counter() - start
        texts = [first_piece + "".join(pieces)]
        return first, time.perf_counter() - start, texts
    texts = gptlite.generate(model, ["A"] * batch_size, **settings)
    return None, time.perf_counter() - start, texts


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--new-tokens", type=int, default=500)
    parser.add_argument("--within-window", action="store_true",
                        help="generate block_size - 1 tokens, so that the context never slides")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--slide", default="1", choices=["1", "half"],
                        help="how far a full window moves: 1 token, or half the block size")
    parser.add_argument("--methods", nargs="+", default=["cached", "recompute"],
                        choices=["cached", "recompute"])
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--kv-heads", type=int, nargs="+", default=[None])
    parser.add_argument("--plot", default=None, metavar="FILE", help="draw tokens/s against batch size to FILE")
    args = parser.parse_args()
    rates = {}  # (size, key/value heads, method) -> {batch size: tokens/s}
    keras.config.set_dtype_policy(args.dtype)
    print("| size | key/value heads | cache MB (batch 1) | new tokens | slide | batch | method | tokens/s (median) "
          "| first token, cold (s) | first token, warm (ms) |")
    print("|---|---:|---:|---:|---:|---:|---|---:|---:|---:|")
    for size, kv_heads in ((size, kv_heads) for size in args.sizes for kv_heads in args.kv_heads):
        model = random_model(size, n_kv_head=kv_heads)
        config = model.config
        cache_mb = config.n_layer * 2 * config.kv_heads * config.head_size * config.block_size * 4 / 2**20
        new_tokens = SIZES[size]["block_size"] - 1 if args.within_window else args.new_tokens
        slide = 1 if args.slide == "1" else SIZES[size]["block_size"] // 2
        for batch_size in args.batch_sizes:
            texts = {}
            for name in args.methods:
                use_cache = name != "recompute"
                cold_first, _, _ = timed(model, batch_size, new_tokens, 0, use_cache, slide)
                runs = [timed(model, batch_size, new_tokens, i + 1, use_cache, slide) for i in range(args.repeats)]
                texts[name] = [run[2] for run in runs]
                rate = statistics.median(batch_size * new_tokens / total for _, total, _ in runs)
                rates.setdefault((size, config.kv_heads, name), {})[batch_size] = rate
                warm_first = [first for first, _, _ in runs if first is not None]
                cold = f"{cold_first:.2f}" if cold_first is not None else "–"
                warm = f"{statistics.median(warm_first) * 1000:.1f}" if warm_first else "–"
                print(f"| {size} | {config.kv_heads} | {cache_mb:.2f} | {new_tokens} | {slide} | {batch_size} | {name} "
                      f"| {rate:,.0f} | {cold} | {warm} |", flush=True)
            for name in texts:
                if texts[name] != texts[args.methods[0]]:
                    print(f"  note: {size}, batch {batch_size}: {name} and {args.methods[0]} texts differ")
    if args.plot:
        draw(rates, args.plot)


def draw(rates, path):
    """Tokens/s against batch size (both axes logarithmic), a line for each size, key/value heads and method."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(6, 4), dpi=100)
    axes = figure.subplots()
    for (size, kv_heads, method), by_batch in rates.items():
        batches = sorted(by_batch)
        axes.plot(batches, [by_batch[batch] for batch in batches], marker="o",
                  label=f"{size} shape, {method}" + (f", {kv_heads} key/value heads" if len(rates) > 2 else ""))
    axes.set_xscale("log", base=2)
    axes.set_yscale("log")
    axes.set_xlabel("batch (rows written together)")
    axes.set_ylabel("tokens/s, all rows together")
    axes.grid(alpha=0.3, which="both")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, format="png")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
