"""Time gptlite's training step under `model.fit`, with `jit_compile` off and on, side by side.

    python benchmarks/probe_train_step.py [TEXT] [--preset cpu] [--steps 300] [--warmup 100] [--rounds 2]

Runs alternate (off, on, off, on, ...) in one process so that machine noise
hits both alike; prints ms/step per run and the median of each setting.
`jit_compile=True` is XLA on TensorFlow and JAX, `torch.compile` on torch.
"""

import argparse
import pathlib
import statistics
import time

import keras

import gptlite
from gptlite import files
from gptlite.data import lm
from gptlite.training import fit
from gptlite.training.settings import PRESETS, split_settings

DEFAULT_TEXT = pathlib.Path(__file__).resolve().parents[2] / "shared" / "data" / "tinyshakespeare.txt"


class StepTimer(keras.callbacks.Callback):
    def __init__(self, warmup):
        super().__init__()
        self.warmup = warmup

    def on_train_batch_end(self, batch, logs=None):
        if batch == self.warmup - 1:
            self.start = time.perf_counter()

    def on_train_end(self, logs=None):
        self.ms_per_step = (time.perf_counter() - self.start) / (self.steps - self.warmup) * 1000


def time_run(preset, train_ids, tokenizer, jit_compile, steps, warmup):
    model_settings, training_settings = split_settings(PRESETS[preset])
    keras.utils.set_random_seed(0)
    model = gptlite.GPT(vocab_size=tokenizer.vocabulary_size, tokenizer=tokenizer, **model_settings)
    model.build((None, model.config.block_size))
    config = gptlite.TrainingConfig(**training_settings)
    model.compile(
        optimizer=fit.make_optimizer(model, config),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=jit_compile,
    )
    batches = lm.RandomWindows(train_ids, model.config.block_size, config.batch_size, steps)
    timer = StepTimer(warmup)
    timer.steps = steps
    model.fit(batches, epochs=1, steps_per_epoch=steps, shuffle=False, verbose=0, callbacks=[timer])
    return timer.ms_per_step


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("text", nargs="?", type=pathlib.Path, default=DEFAULT_TEXT)
    parser.add_argument("--preset", default="cpu", choices=sorted(PRESETS))
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=100, help="steps left out of the timing (compile)")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()

    text = files.read_text(args.text)
    tokenizer = gptlite.CharTokenizer.from_text(text)
    train_ids, _ = lm.split(tokenizer.encode(text))
    results = {False: [], True: []}
    for round_index in range(args.rounds):
        for jit_compile in (False, True):
            ms = time_run(args.preset, train_ids, tokenizer, jit_compile, args.steps, args.warmup)
            results[jit_compile].append(ms)
            print(f"round {round_index + 1}: jit_compile={jit_compile}: {ms:.1f} ms/step", flush=True)
    off, on = statistics.median(results[False]), statistics.median(results[True])
    print(f"median ms/step: jit_compile off {off:.1f}, on {on:.1f}; on is {off / on:.2f}x faster")


if __name__ == "__main__":
    main()
