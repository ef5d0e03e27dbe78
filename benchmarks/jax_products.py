"""Under JAX, at GPT-2 small's shape, batch 1: gptlite's whole decoding step against its matrix products alone.

    KERAS_BACKEND=jax python benchmarks/jax_products.py [--tokens 60]

The products alone: one token through every weight matrix of GPT-2 small in the order a step reads them (12
blocks of 768x2304, 768x768, 768x3072 with GELU, 3072x768, then the tied 50,257-token head), 32 tokens inside one
compiled loop, as gptlite's decoding loop runs them; the step: `gptlite.generate`, greedy, on a random-weight
model of that shape. Each the median of 5 (the step: of 4 calls after one). The difference is what the step does
besides reading its weights: norms, attention over the cache, the cache's update, choosing the token.
"""

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

import gptlite
from helpers.models import model_of

BLOCK = [(768, 2304), (768, 768), (768, 3072), (3072, 768)]
TOKENS_A_CALL = 32


def products_alone():
    rng = np.random.default_rng(0)
    weights = [jnp.asarray(rng.standard_normal(shape).astype(np.float32) * 0.02) for shape in BLOCK * 12]
    table = jnp.asarray(rng.standard_normal((50257, 768)).astype(np.float32) * 0.02)

    @jax.jit
    def run(x, weights, table):
        def token(_, x):
            h = x
            for block in range(12):
                qkv, out, up, down = weights[4 * block:4 * block + 4]
                h = h + ((h @ qkv)[:, :768] @ out) * 1e-3
                h = h + (jax.nn.gelu(h @ up) @ down) * 1e-3
            # The whole head, as a step needs it: the next token is the likeliest, read back from the table. (A
            # slice of the logits would let XLA compute only the columns kept.)
            logits = jnp.einsum("bc,vc->bv", h, table)
            return x + jnp.take(table, jnp.argmax(logits, axis=-1), axis=0) * 1e-3
        return jax.lax.fori_loop(0, TOKENS_A_CALL, token, x)

    x = jnp.ones((1, 768), jnp.float32)
    run(x, weights, table).block_until_ready()
    times = []
    for _ in range(5):
        started = time.perf_counter()
        run(x, weights, table).block_until_ready()
        times.append((time.perf_counter() - started) / TOKENS_A_CALL)
    return statistics.median(times)


def whole_step(tokens):
    model = model_of("gpt2")
    gptlite.generate(model, "HELLO", tokens, temperature=0)
    times = []
    for _ in range(4):
        started = time.perf_counter()
        gptlite.generate(model, "HELLO", tokens, temperature=0)
        times.append((time.perf_counter() - started) / tokens)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=60)
    args = parser.parse_args()
    alone, step = products_alone(), whole_step(args.tokens)
    print(f"GPT-2 small, batch 1, JAX {jax.__version__}: products alone {alone * 1e3:.2f} ms a token "
          f"({1 / alone:.1f} tokens/s); gptlite's step {step * 1e3:.2f} ms ({1 / step:.1f} tokens/s); the rest of "
          f"the step {(step - alone) * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
