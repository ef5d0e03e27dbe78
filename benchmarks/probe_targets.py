"""Seq2seq decoding speed: targets/s of `generate_target` over a list of sources, as a run's evaluation decodes them.

    python benchmarks/probe_targets.py [--sources 1000] [--repeats 3] [--beams N]

The model has random weights (speed only) and the seq2seq preset's shape
(encoder and decoder of 2 blocks, 4 heads, width 128) with a block size of 21,
the reverse task's; the sources are the reverse task's held-out strings, so
every target runs its full 20 tokens (random weights seldom end early). Each
figure is the median of --repeats calls after one warm-up call, which also
gives the cold time (compiling included).
"""

import argparse
import statistics
import time

import keras

import gptlite
from gptlite.data import pairs


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sources", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--beams", type=int, default=None)
    args = parser.parse_args()
    _, held_out = pairs.synthetic("reverse", seed=0, train_pairs=10, held_out_pairs=args.sources)
    tokenizer = gptlite.CharTokenizer.from_texts(held_out.sources, special_tokens=("pad", "start", "end"))
    keras.utils.set_random_seed(0)
    model = gptlite.Seq2Seq(vocab_size=tokenizer.vocabulary_size, n_layer=2, n_head=4, n_embd=128, block_size=21,
                            tokenizer=tokenizer)
    model.build()

    def timed():
        start = time.perf_counter()
        gptlite.generate_target(model, held_out.sources, num_beams=args.beams)
        return time.perf_counter() - start

    cold = timed()
    rate = statistics.median(len(held_out.sources) / timed() for _ in range(args.repeats))
    print(f"| {args.sources} sources | beams {args.beams or '-'} | {rate:,.0f} targets/s | cold {cold:.2f} s |")


if __name__ == "__main__":
    main()
