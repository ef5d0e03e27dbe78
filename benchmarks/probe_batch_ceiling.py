"""How much a batch of rows can gain over one row on this machine: the decode engine alone, no server.

    python benchmarks/probe_batch_ceiling.py [--shape cpu|wide] [--rows 16] [--tokens 64] [--rounds 5]

The workload of benchmarks/serve.py's clients, without HTTP, without a
worker thread or its batch window, and without clients on the same cores:
a `gptlite.decode.engine.Engine` set as the server's (`ENGINE_SETTINGS`)
admits --rows rows of an empty prompt at once and steps until each has
--tokens new tokens; then the same for one row. Each is timed --rounds
times after a first, compiling, wave; prints tokens per second of each
(median) and their ratio, the most that --rows clients at once can get over
one client alone when each request costs nothing beyond its decoding.
"""

import argparse
import json
import statistics
import tempfile

from helpers import make_model, wave


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=["cpu", "wide"], default="cpu")
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    import keras

    with tempfile.TemporaryDirectory() as folder:
        model = keras.saving.load_model(make_model(args.shape, folder))
    rates = {}
    for rows in (args.rows, 1):
        wave(model, rows, args.tokens)  # compiles
        seconds = statistics.median(wave(model, rows, args.tokens) for _ in range(args.rounds))
        rates[rows] = rows * args.tokens / seconds
    print(json.dumps({"shape": args.shape, "tokens_per_s": rates, "ratio": rates[args.rows] / rates[1]}))


if __name__ == "__main__":
    main()
