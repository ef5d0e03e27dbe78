"""One token through GPT-2 small's block products in each weight precision Keras offers, compiled with XLA.

    python benchmarks/decode_precisions.py [--repeats 5] [--iterations 10]

A batch-1 decoding step reads every weight once, so a precision of fewer
bytes is faster only if the backend's products read it at about the same
bytes a second. This times, inside one compiled while-loop (as gptlite's
decode loops run), one row through Keras Dense layers of GPT-2 small's 12
blocks (768 -> 2304, 768 -> 768, 768 -> 3072, 3072 -> 768 each), chained,
with the weights:
- float32;
- bfloat16 (layers of dtype bfloat16: bf16 weights and products);
- int8 and int4: Keras's own `layer.quantize(mode)`.
Each precision is timed in turn, `--repeats` times, alternating; the median
milliseconds a pass, the weights' bytes over it, and the ratio to float32's
time are printed. TensorFlow backend (set KERAS_BACKEND=jax for JAX's).
"""

import argparse
import statistics
import time

import keras
import numpy as np
from keras import ops

# GPT-2 small's products of one block, (in, out), 12 blocks.
BLOCK = [(768, 2304), (768, 768), (768, 3072), (3072, 768)]
LAYERS = 12
PRECISIONS = ("float32", "bfloat16", "int8", "int4")


def layers_of(precision):
    dtype = "bfloat16" if precision == "bfloat16" else "float32"
    layers = []
    for _ in range(LAYERS):
        for width_in, width_out in BLOCK:
            layer = keras.layers.Dense(width_out, use_bias=False, dtype=dtype)
            layer.build((None, width_in))
            if precision in ("int8", "int4"):
                layer.quantize(precision)
            layers.append(layer)
    return layers


def pass_function(layers, iterations):
    """A compiled function: `iterations` passes of one row through every layer, in one while-loop."""
    def one_pass(x):
        for layer, (width_in, _) in zip(layers, BLOCK * LAYERS):
            x = ops.tanh(layer(x[:, :width_in]))  # the first 768 of the 2304 go on, as a block's queries would
            x = ops.cast(x, "float32")
        return x

    def loop(x):
        return ops.fori_loop(0, iterations, lambda _, row: one_pass(row), x)

    if keras.backend.backend() == "jax":
        import jax

        return jax.jit(loop)
    import tensorflow as tf

    return tf.function(loop, jit_compile=True)


def weight_bytes(layers):
    return sum(int(np.prod(weight.shape)) * np.dtype(keras.backend.standardize_dtype(weight.dtype)).itemsize
               for layer in layers for weight in layer.weights)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--iterations", type=int, default=10)
    args = parser.parse_args()
    keras.utils.set_random_seed(0)
    row = ops.convert_to_tensor(np.random.default_rng(0).standard_normal((1, 768)).astype("float32"))
    programs = {}
    for precision in PRECISIONS:
        layers = layers_of(precision)
        function = pass_function(layers, args.iterations)
        ops.convert_to_numpy(function(row))  # compile
        programs[precision] = (function, weight_bytes(layers))
    seconds = {precision: [] for precision in PRECISIONS}
    for _ in range(args.repeats):
        for precision, (function, _) in programs.items():
            start = time.perf_counter()
            ops.convert_to_numpy(function(row))
            seconds[precision].append((time.perf_counter() - start) / args.iterations)
    base = statistics.median(seconds["float32"])
    print(f"backend {keras.backend.backend()}; {args.repeats} alternating repeats of {args.iterations} passes")
    print("| weights | ms a pass (median) | MB a pass | GB/s | time vs float32 |")
    print("|---|---:|---:|---:|---:|")
    for precision, (_, size) in programs.items():
        median = statistics.median(seconds[precision])
        print(f"| {precision} | {median * 1e3:.1f} | {size / 1e6:.0f} | {size / median / 1e9:.1f} | "
              f"{median / base:.2f}x |")


if __name__ == "__main__":
    main()
