"""Time the parts of a decode step apart, compiled with XLA, at batch 1.

    python benchmarks/probe_decode_parts.py [--size cpu|big] [--dtype float32|bfloat16]

Prints milliseconds for: the sampler alone (a call), one cached decode step
(a call), a forward pass over the whole window (a call), and, inside one
compiled while-loop of 16 iterations, a cached step and a whole-window pass
(per iteration); the model's matrix products alone, one token through every
Dense layer and the output projection inside the same kind of loop (per
iteration), which is as fast as a cached step at batch 1 could be, since it
reads every weight once and does nothing else; and, for scale, one read of
as many bytes as the model's weights (a NumPy sum).
`cpu` is the cpu preset's shape (4 x 4 x 128, context 64), `big` the gpu
preset's (6 x 6 x 384, context 256). Random weights; TensorFlow backend.
"""

import argparse
import time

import keras
import numpy as np
import tensorflow as tf
from keras import ops

from gptlite.decode.sampling import RowSettings, sample_next_token, SamplingConfig
from helpers.models import SIZES, VOCABULARY_SIZE, random_model

ITERATIONS = 16


def milliseconds_per_call(function, *args, calls=300):
    function(*args)  # compile
    start = time.perf_counter()
    for _ in range(calls):
        result = function(*args)
    ops.convert_to_numpy(keras.tree.flatten(result)[0])
    return (time.perf_counter() - start) / calls * 1000


def in_a_loop(step, state):
    """Run state = step(i, state) ITERATIONS times in one compiled while-loop."""
    return ops.while_loop(lambda i, _: i < ITERATIONS, lambda i, s: (i + 1, step(i, s)),
                          (ops.convert_to_tensor(0), state), maximum_iterations=ITERATIONS)[1]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=list(SIZES), default="cpu")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    args = parser.parse_args()
    keras.config.set_dtype_policy(args.dtype)
    block_size = SIZES[args.size]["block_size"]
    model = random_model(args.size)
    settings = RowSettings.of([SamplingConfig(temperature=1.0)], VOCABULARY_SIZE)
    logits = np.random.default_rng(0).normal(size=(1, VOCABULARY_SIZE)).astype("float32")
    noise = np.random.default_rng(1).random((1, VOCABULARY_SIZE)).astype("float32")
    cache = model.empty_cache(1)
    token, position = np.zeros((1, 1), "int32"), np.array([10], "int32")
    window = np.zeros((1, block_size), "int32")

    def cached_step(i, cache):
        return model.call_with_cache(token, cache, ops.reshape(i, (1,)))[1]

    def matmuls_alone(i, x):
        # Each product feeds on the last and the result is rescaled, so that
        # nothing can be hoisted out of the loop or overflow.
        for block in model.blocks:
            qkv = block.attention.qkv_projection(x)  # (1, 1, 3C)
            x = x + block.attention.output_projection(qkv[..., : model.config.n_embd])
            x = x + block.feed_forward.contract(ops.gelu(block.feed_forward.expand(x), approximate=True))
            x = x / (ops.sqrt(ops.mean(ops.square(x))) + 1.0)
        logits = model.embedding.logits(x)  # (1, 1, V)
        return x + ops.mean(ops.cast(logits, x.dtype))

    def window_pass(i, window):
        # Each pass feeds on the last, so that the compiler cannot hoist it out of the loop.
        next_token = ops.cast(ops.argmax(model(window)[:, -1], axis=-1), "int32")[:, None]
        return ops.concatenate([window[:, 1:], next_token], axis=1)

    compiled = lambda f: tf.function(f, jit_compile=True, autograph=False)
    sampler = compiled(lambda l, n: sample_next_token(l, settings, n))
    print(f"sampler: {milliseconds_per_call(sampler, logits, noise):.2f} ms a call")
    print(f"one cached step: {milliseconds_per_call(compiled(model.call_with_cache), token, cache, position):.2f} "
          "ms a call")
    print(f"whole {block_size}-token window: {milliseconds_per_call(compiled(model), window):.2f} ms a call")
    loop = compiled(lambda c: in_a_loop(cached_step, c))
    print(f"cached step in a loop: {milliseconds_per_call(loop, cache, calls=50) / ITERATIONS:.3f} ms an iteration")
    loop = compiled(lambda x: in_a_loop(matmuls_alone, x))
    hidden = np.ones((1, 1, model.config.n_embd), keras.backend.standardize_dtype(model.compute_dtype))
    print(f"matrix products alone in a loop: {milliseconds_per_call(loop, hidden, calls=50) / ITERATIONS:.3f} "
          "ms an iteration")
    loop = compiled(lambda w: in_a_loop(window_pass, w))
    print(f"whole window in a loop: {milliseconds_per_call(loop, window, calls=20) / ITERATIONS:.3f} ms an iteration")
    weight_bytes = sum(ops.convert_to_numpy(v).nbytes for v in model.weights)
    as_many_bytes = np.ones(weight_bytes // 4, "float32")
    print(f"one read of {weight_bytes / 1e6:.1f} MB (the weights' size): "
          f"{milliseconds_per_call(lambda: as_many_bytes.sum(), calls=50):.2f} ms")


if __name__ == "__main__":
    main()
