"""A language model's prefill as a plain TensorFlow graph (as `generate` runs it) beside the same compiled with XLA
(`Engine(compiled_prefill=True)`, as the server runs it), side by side in one process.

    python benchmarks/prefill.py [--shape cpu|wide] [--rounds 8]

For 1 and 16 rows of an empty prompt ("\\n", widened to the shortest cache,
64 columns, as the server's engine pads it), times `Engine.admit`, which
runs the prefill and draws each row's first token: the first call (tracing
and, compiled, XLA's compile) and the median of the others. Random weights,
the `cpu` preset's shape or `wide` (6 layers, width 384, context 256).
"""

import argparse
import json
import statistics
import tempfile
import time

from helpers import make_model


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=["cpu", "wide"], default="cpu")
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()

    import keras

    from gptlite.decode.engine import Engine
    from gptlite.decode.sampling import SamplingConfig

    with tempfile.TemporaryDirectory() as folder:
        model = keras.saving.load_model(make_model(args.shape, folder))
    prompt = model.tokenizer.encode("\n")
    report = {"shape": args.shape}
    for rows in (1, 16):
        for compiled in (False, True):
            seconds = []
            for _ in range(args.rounds):
                engine = Engine(model, rows, short_caches=True, mixed_settings=True, compiled_prefill=compiled)
                started = time.perf_counter()
                engine.admit([prompt] * rows, SamplingConfig(temperature=0.8, top_p=0.9, seed=1))
                seconds.append(time.perf_counter() - started)
            report[f"{rows} rows, {'compiled' if compiled else 'graph'}"] = {
                "first_s": round(seconds[0], 3), "median_ms": round(1000 * statistics.median(seconds[1:]), 1)}
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
