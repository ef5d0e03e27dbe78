"""Decoding with a cache as long as the text reaches, beside one of the whole context window.

    python benchmarks/cache_reach.py [--shapes gpt2 smollm2] [--batch-sizes 1 16] [--new-tokens 200] [--repeats 3]

Each step attends over the whole key/value cache. `gptlite.generate` gives
the decode engine the positions its rows reach (prompt and new tokens), so
that the cache holds the power of two of slots that covers them (`Engine`'s
`reach`); without it, the cache has block_size slots. This writes
--new-tokens greedily after a 5-token prompt through the engine both ways,
alternating in one process, at GPT-2 small's shape (context 1,024) and
SmolLM2-135M's (2,048), random weights (`vs_llama_cpp.py`'s models), and
prints tokens a second of all rows (medians of --repeats after a first
call each), the ratio, and whether the texts are the same. Batches above
one are timed at GPT-2's shape only.
"""

import argparse
import statistics
import time

import numpy as np

from gptlite.decode.engine import Engine
from gptlite.decode.sampling import SamplingConfig
from helpers.models import model_of, PROMPT


def decode(model, rows_ids, new_tokens, reach):
    """Every row's new tokens, greedy, from an engine with that reach (0: the whole window)."""
    engine = Engine(model, len(rows_ids), reach=reach)
    drawn = engine.admit(rows_ids, SamplingConfig(temperature=0.0, max_new_tokens=new_tokens))
    tokens = {row: list(first.ids) for row, first in drawn.items()}
    while len(tokens[0]) < new_tokens:
        for row, more in engine.step(min(32, new_tokens - len(tokens[0]))).items():
            tokens[row] += list(more.ids)
    return [tokens[row] for row in sorted(tokens)]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=["gpt2", "smollm2"], choices=["gpt2", "smollm2"])
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 16])
    parser.add_argument("--new-tokens", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print("| shape | batch | whole window: tokens/s | as far as the text reaches: tokens/s | ratio | same text |")
    print("|---|---:|---:|---:|---:|---|")
    for shape in args.shapes:
        model = model_of(shape)
        prompt = model.tokenizer.encode(PROMPT).tolist()
        # A batch of long caches is slow enough at SmolLM2's shape (16 rows of its 2,048 slots) to take half an
        # hour: batches are timed at GPT-2's shape only.
        for batch_size in args.batch_sizes if shape == "gpt2" else [1]:
            rows_ids = [prompt] * batch_size
            ways = {"whole": 0, "reach": len(prompt) + args.new_tokens}
            texts = {way: decode(model, rows_ids, args.new_tokens, reach) for way, reach in ways.items()}
            seconds = {way: [] for way in ways}
            for _ in range(args.repeats):
                for way, reach in ways.items():
                    start = time.perf_counter()
                    decode(model, rows_ids, args.new_tokens, reach)
                    seconds[way].append(time.perf_counter() - start)
            rates = {way: batch_size * args.new_tokens / statistics.median(values) for way, values in seconds.items()}
            same = np.array_equal(texts["whole"], texts["reach"])
            print(f"| {shape} | {batch_size} | {rates['whole']:,.1f} | {rates['reach']:,.1f} | "
                  f"{rates['reach'] / rates['whole']:.2f}x | {'yes' if same else 'no'} |", flush=True)


if __name__ == "__main__":
    main()
