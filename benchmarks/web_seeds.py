"""How often the web page's seeded sample is Python's text: a small character model trained for a few seconds on
Tiny Shakespeare, exported as a page, 20 seeds each written by the page in headless Chromium and by
`gptlite.generate`, 200 tokens at temperature 0.8 (and at top_p 0.9), the texts compared whole.

    python benchmarks/web_seeds.py [--seeds 20]

A sample parts from Python's only where two tokens' noisy scores lie within float rounding of each other: the
page's arithmetic is float64 in JavaScript where Keras's is float32, and ONNX Runtime's logits differ from Keras's
in the last bits.
"""

import argparse
import pathlib
import tempfile

import keras
import numpy as np

import gptlite
from helpers.browser import in_browser_text, serve

DATA = pathlib.Path(__file__).resolve().parents[2] / "shared" / "data" / "tinyshakespeare.txt"


def trained_model(text):
    tokenizer = gptlite.CharTokenizer.from_text(text)
    keras.utils.set_random_seed(0)
    model = gptlite.GPT(vocab_size=tokenizer.vocabulary_size, tokenizer=tokenizer, n_layer=2, n_head=4, n_embd=64,
                        block_size=64)
    ids = tokenizer.encode(text).astype("int32")
    starts = np.random.default_rng(0).integers(0, len(ids) - 65, size=400 * 32)
    windows = ids[starts[:, None] + np.arange(65)]
    model.compile(optimizer=keras.optimizers.Adam(3e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(windows[:, :-1], windows[:, 1:], batch_size=32, epochs=1, verbose=0)
    return model


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=20)
    args = parser.parse_args()
    model = trained_model(DATA.read_text())
    with tempfile.TemporaryDirectory() as folder:
        gptlite.export_web(model, pathlib.Path(folder) / "page")
        server, address = serve(folder)
        url = f"{address}/page"
        for settings in (dict(temperature=0.8), dict(temperature=0.8, top_p=0.9)):
            same = sum(in_browser_text(url, "ROMEO:", 200, seed=seed, **settings)
                       == gptlite.generate(model, "ROMEO:", 200, seed=seed, **settings) for seed in range(args.seeds))
            print(f"{settings}: the page wrote Python's text for {same} of {args.seeds} seeds")
        greedy = [in_browser_text(url, prompt, 200, temperature=0) == gptlite.generate(model, prompt, 200,
                                                                                           temperature=0)
                  for prompt in ("ROMEO:", "First Citizen:\n", "")]
        print(f"greedy: the page wrote Python's text for {sum(greedy)} of 3 prompts")
        server.shutdown()


if __name__ == "__main__":
    main()
