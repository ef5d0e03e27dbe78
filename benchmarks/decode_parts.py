"""Time the parts of a decode step apart, compiled with XLA, on the cpu preset's shape.

    python benchmarks/decode_parts.py

Prints milliseconds per call for: the sampler alone, one cached decode step,
a forward pass over the whole 64-token window, and 16 cached steps inside one
compiled while-loop. Random weights; TensorFlow backend.
"""

import time

import keras
import numpy as np
import tensorflow as tf

import gptlite
from gptlite.generation import sample_next_token


def milliseconds_per_call(function, *args, calls=300):
    function(*args)  # compile
    start = time.perf_counter()
    for _ in range(calls):
        result = function(*args)
    keras.ops.convert_to_numpy(keras.tree.flatten(result)[0])
    return (time.perf_counter() - start) / calls * 1000


def main():
    tokenizer = gptlite.CharTokenizer("".join(chr(32 + i) for i in range(65)))
    model = gptlite.GPT(vocab_size=65, tokenizer=tokenizer, n_layer=4, n_head=4, n_embd=128, block_size=64)
    model.build((None, 64))
    seed_generator = keras.random.SeedGenerator(0)
    settings = np.array([1.0, 65, 1.0], "float32")
    logits = np.random.default_rng(0).normal(size=(1, 65)).astype("float32")
    cache = model.empty_cache(1)
    token, position = np.zeros((1, 1), "int32"), np.array([10], "int32")

    def sixteen_steps(cache):
        def body(step, cache):
            _, cache = model.call_with_cache(token, cache, keras.ops.reshape(step, (1,)))
            return step + 1, cache

        return keras.ops.while_loop(lambda step, _: step < 16, body, (keras.ops.convert_to_tensor(0), cache),
                                    maximum_iterations=16)[1]

    compiled = lambda f: tf.function(f, jit_compile=True)
    print(f"sampler: {milliseconds_per_call(compiled(lambda l: sample_next_token(l, settings, seed_generator)), logits):.2f} ms")
    print(f"one cached step: {milliseconds_per_call(compiled(model.call_with_cache), token, cache, position):.2f} ms")
    print(f"whole 64-token window: {milliseconds_per_call(compiled(model), np.zeros((1, 64), 'int32')):.2f} ms")
    print(f"16 cached steps in one loop: {milliseconds_per_call(compiled(sixteen_steps), cache, calls=50):.2f} ms")


if __name__ == "__main__":
    main()
