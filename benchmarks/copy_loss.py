"""Whether a model can copy what it has never read: its loss on made-up words, first seen and then repeated.

    python benchmarks/copy_loss.py MODEL.keras [MODEL.keras ...] [--rows 64] [--letters 30]

Each row is " w w": a word `w` of random lowercase letters, said twice. The
loss (nats per token, the model's own tokens) on the first copy says what
the model expects of letters; on the second, whether it finds the first
copy and says it again (what transformers learn with "induction heads").
A model that copies has a far lower loss on the second copy than the
first; one that does not, about the same. The copy and backwards chat tasks
ask exactly this of made-up words (benchmarks/journal.md, "Chat tasks").
"""

import argparse
import pathlib

import numpy as np

REPO = pathlib.Path(__file__).resolve().parent.parent


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+")
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--letters", type=int, default=30)
    args = parser.parse_args()
    import keras

    import gptlite

    random = np.random.default_rng(0)
    # The same words for every model, so that their figures compare.
    words = [" " + "".join(random.choice(list("abcdefghijklmnopqrstuvwxyz"), args.letters)) for _ in range(args.rows)]
    for path in args.models:
        model = gptlite.load(path)
        first, second = [], []
        for word in words:
            copy = model.tokenizer.encode(word)  # a word after a space is split the same wherever it stands
            ids = np.asarray([*copy, *copy], np.int32)[None]
            log_probs = keras.ops.convert_to_numpy(keras.ops.log_softmax(model(ids)[0, :-1], axis=-1))
            losses = -log_probs[np.arange(len(log_probs)), ids[0, 1:]]  # losses[i]: of token i + 1
            first.append(losses[:len(copy) - 1].mean())  # the first copy's tokens but its first
            second.append(losses[len(copy):].mean())  # the second copy's but its first (which follows anything)
        print(f"{path}: first copy {np.mean(first):.2f}, second copy {np.mean(second):.2f} nats per token "
              f"({args.rows} words of {args.letters} letters)", flush=True)


if __name__ == "__main__":
    main()
