"""Training and generation speed of the cpu preset under each Keras backend, side by side.

    python benchmarks/probe_backends.py [TEXT] [--backends tensorflow jax torch] [--rounds 3]
        [--steps 200] [--warmup 50]

A backend is fixed for the life of a process, so each measurement runs in a
child process with KERAS_BACKEND set; the rounds alternate the backends
(tensorflow, jax, torch, tensorflow, ...) so that machine noise hits them
alike. Each child measures:
- training: ms per `model.fit` step of the cpu preset on TEXT (Tiny
  Shakespeare by default), compiled as `train.py` compiles it, after
  --warmup steps that include compiling;
- generation, batch 1, random weights of the cpu preset's shape: tokens/s for
  63 tokens from a one-token prompt (within the 64-token window) and for 500
  tokens with `slide=32`, each the median of 3 runs after a warm-up run, and
  the first token's delay in that warm-up run (cold: compiling included).
Prints each round, then medians over the rounds and each backend's ratio to
TensorFlow.
"""

import argparse
import json
import os
import pathlib
import statistics
import time

from helpers import in_turns, medians, run_child

HERE = pathlib.Path(__file__).resolve().parent
DEFAULT_TEXT = HERE.parents[1] / "shared" / "data" / "tinyshakespeare.txt"
MEASURES = {
    "train_ms_per_step": "training, ms/step",
    "tokens_per_s_window": "generation within the window, tokens/s",
    "tokens_per_s_slide32": "generation, 500 tokens, slide 32, tokens/s",
    "first_token_cold_s": "first token, cold (s)",
}


def measure(text_path, steps, warmup):
    """Run in the child: every measure for the backend in KERAS_BACKEND, as a dict."""
    import keras

    import gptlite
    from gptlite import files
    from gptlite.data import lm
    from gptlite.training import fit
    from gptlite.training.settings import PRESETS, split_settings
    from helpers.models import random_model

    class StepTimer(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == warmup - 1:
                self.start = time.perf_counter()

        def on_train_end(self, logs=None):
            self.ms_per_step = (time.perf_counter() - self.start) / (steps - warmup) * 1000

    text = files.read_text(text_path)
    tokenizer = gptlite.CharTokenizer.from_text(text)
    train_ids, _ = lm.split(tokenizer.encode(text))
    model_settings, training_settings = split_settings(PRESETS["cpu"])
    keras.utils.set_random_seed(0)
    model = gptlite.GPT(vocab_size=tokenizer.vocabulary_size, tokenizer=tokenizer, **model_settings)
    model.build((None, model.config.block_size))
    config = gptlite.TrainingConfig(**training_settings)
    fit.compile_for_training(model, config)
    timer = StepTimer()
    batches = lm.RandomWindows(train_ids, model.config.block_size, config.batch_size, steps)
    model.fit(batches, epochs=1, shuffle=False, verbose=0, callbacks=[timer])

    model = random_model("cpu")
    results = {"train_ms_per_step": timer.ms_per_step}
    for key, new_tokens, slide in (("tokens_per_s_window", 63, 1), ("tokens_per_s_slide32", 500, 32)):
        rates = []
        for seed in range(4):
            start = time.perf_counter()
            pieces = gptlite.stream(model, "A", max_new_tokens=new_tokens, temperature=1.0, seed=seed, slide=slide)
            next(pieces)
            if seed == 0 and key == "tokens_per_s_window":
                results["first_token_cold_s"] = time.perf_counter() - start
            for _ in pieces:
                pass
            if seed:  # the first run warms up
                rates.append(new_tokens / (time.perf_counter() - start))
        results[key] = statistics.median(rates)
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("text", nargs="?", type=pathlib.Path, default=DEFAULT_TEXT)
    parser.add_argument("--backends", nargs="+", default=["tensorflow", "jax", "torch"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=50, help="training steps left out of the timing")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.text, args.steps, args.warmup)))
        return

    command = [__file__, str(args.text.resolve()), "--child", "--steps", str(args.steps), "--warmup", str(args.warmup)]
    results = in_turns(args.backends, args.rounds,
                       lambda backend, _: run_child(backend, command, dict(os.environ, KERAS_BACKEND=backend)))
    figures = medians(results, MEASURES)
    reference = figures.get("tensorflow")
    print(f"\n| measure (median of {args.rounds}) | " + " | ".join(args.backends) + " |")
    print("|---|" + "---:|" * len(args.backends))
    for key, label in MEASURES.items():
        cells = []
        for backend in args.backends:
            value = figures[backend][key]
            ratio = f" ({value / reference[key]:.2f}x)" if reference and backend != "tensorflow" else ""
            cells.append(f"{value:,.3g}{ratio}" if value < 100 else f"{value:,.0f}{ratio}")
        print(f"| {label} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
