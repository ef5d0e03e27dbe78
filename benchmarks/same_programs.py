"""Whether a change left the compiled programs of training and decoding as they were: each lowered by JAX to its
program's text (StableHLO, source locations left out), for this checkout and for another, and compared.

    python benchmarks/same_programs.py --code DIR [--shapes cpu laptop]

For each shape (random weights, benchmarks/helpers/models.py): a training step's gradient (`stateless_call` with
`training=True`, batch 12 of the shape's context) and a decoding step (`call_with_cache`, 8 rows, one token each).
Each side runs in a child process of its own with its checkout first on the path; prints each program's length and
digest, and whether the two sides' texts are the same.
"""

import argparse
import json
import pathlib

from helpers import run_child, with_code

CHILD = """
import hashlib, json, os, re, sys
os.environ["KERAS_BACKEND"] = "jax"
import jax, keras, numpy as np
import gptlite
from keras import StatelessScope
from helpers.models import model_of

def text_of(lowered):
    return re.sub(r"#loc\\d*( = .*)?", "", re.sub(r"loc\\(.*?\\)", "", lowered.as_text()))

found = {}
for shape in sys.argv[1:]:
    model = model_of(shape)
    trainable = [v.value for v in model.trainable_variables]
    others = [v.value for v in model.non_trainable_variables]
    context = model.config.block_size

    def loss(trainable, others, ids):
        logits, _ = model.stateless_call(trainable, others, ids[:, :-1], training=True)
        return keras.ops.mean(keras.losses.sparse_categorical_crossentropy(ids[:, 1:], logits, from_logits=True))

    def step(trainable, others, tokens, cache, positions):
        mapping = list(zip(model.trainable_variables, trainable)) + list(zip(model.non_trainable_variables, others))
        with StatelessScope(state_mapping=mapping):
            return model.call_with_cache(tokens, cache, positions)

    programs = {"training": jax.jit(jax.grad(loss)).lower(trainable, others, np.zeros((12, context + 1), "int32")),
                "decoding": jax.jit(step).lower(trainable, others, np.zeros((8, 1), "int32"), model.empty_cache(8),
                                                np.zeros(8, "int32"))}
    for kind, lowered in programs.items():
        text = text_of(lowered)
        found[f"{shape} {kind}"] = [len(text), hashlib.sha256(text.encode()).hexdigest()]
print(json.dumps(found))
"""


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--code", type=pathlib.Path, required=True, help="the other checkout")
    parser.add_argument("--shapes", nargs="+", default=["cpu", "laptop"])
    args = parser.parse_args()
    import os

    environment = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    here = run_child("this checkout", ["-c", CHILD, *args.shapes], environment)
    there = run_child(str(args.code), ["-c", CHILD, *args.shapes], with_code(environment, args.code))
    for name, (length, digest) in here.items():
        other = there[name]
        print(f"{name}: {length:,} characters, {digest[:16]}; {args.code}: {other[0]:,}, {other[1][:16]}; "
              f"{'the same' if other[1] == digest else 'DIFFERENT'}")
    print(json.dumps({name: here[name][1] == there[name][1] for name in here}))


if __name__ == "__main__":
    main()
