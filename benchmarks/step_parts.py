"""Where a training step's time goes: the model's arithmetic, the optimizer's, and the loop around them.

    python benchmarks/step_parts.py [TEXT] [--preset cpu] [--rounds 3] [--steps 200] [--calls 1 10]

One process, TensorFlow (the backend `train.py` chooses for float32), the preset's model and optimizer built and
compiled as a run builds them, on the preset's random batches of TEXT. Each round measures, in turns, after a
compiling warm-up:
- gradients: a `tf.function(jit_compile=True)` of the forward and backward passes alone (the model's arithmetic;
  it returns the gradients' global norm, so that none is left out);
- bare step: the same with the optimizer's update (no `fit`);
- bare, 10 a call: ten bare steps inside one compiled call (a loop in the function): the step with no host work
  between steps at all;
- train_on_batch: Keras's own compiled step, one Python call a step;
- loop, N a call: `gptlite.training.fit.train` (the whole run's loop: `fit` calls between evaluations, gptlite's
  data pipeline, callbacks, evaluations and checkpoint writes beside the steps) for --steps steps with
  `steps_per_call` N for each of --calls; its history's steps' own tokens/s, the first interval (compiling) left
  out.
Prints each measurement's ms/step per round, then medians and each over the bare step.
"""

import argparse
import itertools
import pathlib
import statistics
import tempfile

import keras
import numpy as np
import tensorflow as tf

import gptlite
from gptlite import files
from gptlite.data import lm
from gptlite.training import fit
from gptlite.training.settings import PRESETS, split_settings

from helpers import time_steps

DEFAULT_TEXT = pathlib.Path(__file__).resolve().parents[2] / "shared" / "data" / "tinyshakespeare.txt"
BATCHES = 40  # distinct batches the bare steps cycle through


def build(preset, tokenizer, **training):
    model_settings, training_settings = split_settings(PRESETS[preset])
    config = gptlite.TrainingConfig(**{**training_settings, **training})
    keras.utils.set_random_seed(0)
    model = gptlite.GPT(vocab_size=tokenizer.vocabulary_size, tokenizer=tokenizer, **model_settings)
    model.build((None, model.config.block_size))
    fit.compile_for_training(model, config)
    model.optimizer.build(model.trainable_variables)
    return model, config


def bare_functions(model):
    loss_fn, optimizer, variables = model.loss, model.optimizer, model.trainable_variables

    def gradients(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        return loss, tape.gradient(loss, variables)

    @tf.function(jit_compile=True)
    def gradients_only(x, y):
        loss, grads = gradients(x, y)
        return loss, tf.linalg.global_norm(grads)  # an output that needs them, or XLA leaves the backward pass out

    @tf.function(jit_compile=True)
    def step(x, y):
        loss, grads = gradients(x, y)
        optimizer.apply(grads, variables)
        return loss

    @tf.function(jit_compile=True)
    def ten_steps(xs, ys):
        loss = tf.constant(0.0)
        for index in tf.range(10):
            loss, grads = gradients(xs[index], ys[index])
            optimizer.apply(grads, variables)
        return loss

    return gradients_only, step, ten_steps


def time_bare(function, xs, ys, per_call=1, repeats=4):
    """ms per step of `function` called on one batch at a time, or on stacks of `per_call`, cycling through the
    BATCHES `repeats` times (TensorFlow runs each call to its end before it returns)."""
    if per_call == 1:
        calls = [(xs[index], ys[index]) for index in range(BATCHES)]
    else:
        calls = [(xs[index:index + per_call], ys[index:index + per_call]) for index in range(0, BATCHES, per_call)]
    cycle = itertools.cycle(calls)
    return time_steps(lambda: function(*next(cycle)), repeats * len(calls))["ms_per_step"] / per_call


def time_loop(preset, tokenizer, train_ids, validation_ids, steps, steps_per_call):
    interval = steps // 4
    model, config = build(preset, tokenizer, max_iters=steps, eval_interval=interval, checkpoint_interval=interval,
                          warmup_iters=min(100, steps // 5), steps_per_call=steps_per_call)
    rows = fit.train(model, train_ids, validation_ids, config, tempfile.mkdtemp(), "lm", verbose=0)
    tokens_per_step = config.batch_size * model.config.block_size
    return statistics.median(tokens_per_step / row["tokens_per_s"] * 1000 for row in rows[1:])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("text", nargs="?", type=pathlib.Path, default=DEFAULT_TEXT)
    parser.add_argument("--preset", default="cpu", choices=sorted(PRESETS))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=400, help="steps of each loop run (4 intervals)")
    parser.add_argument("--calls", type=int, nargs="+", default=[1, 10], help="steps_per_call of the loop runs")
    args = parser.parse_args()
    if keras.backend.backend() != "tensorflow":
        parser.error("this measures TensorFlow's step: run it with KERAS_BACKEND=tensorflow")

    text = files.read_text(args.text)
    tokenizer = gptlite.CharTokenizer.from_text(text)
    train_ids, validation_ids = lm.split(tokenizer.encode(text))
    model, config = build(args.preset, tokenizer)
    drawn = lm.RandomWindows(train_ids, model.config.block_size, config.batch_size, BATCHES, seed=1)
    xs = np.stack([drawn[index][0] for index in range(BATCHES)])
    ys = np.stack([drawn[index][1] for index in range(BATCHES)])
    gradients_only, step, ten_steps = bare_functions(model)
    measures = {
        "gradients": lambda: time_bare(gradients_only, xs, ys),
        "bare step": lambda: time_bare(step, xs, ys),
        "bare, 10 a call": lambda: time_bare(ten_steps, xs, ys, per_call=10),
        "train_on_batch": lambda: time_bare(lambda x, y: model.train_on_batch(x, y, return_dict=True)["loss"],
                                            xs, ys),
        **{f"loop, {n} a call": (lambda n=n: time_loop(args.preset, tokenizer, train_ids, validation_ids,
                                                       args.steps, n)) for n in args.calls},
    }
    results = {name: [] for name in measures}
    for round_index in range(args.rounds):
        for name, measure in measures.items():
            results[name].append(measure())
            print(f"round {round_index + 1}: {name}: {results[name][-1]:.1f} ms/step", flush=True)
    bare = statistics.median(results["bare step"])
    print(f"\npreset {args.preset}, medians of {args.rounds} rounds:")
    for name, values in results.items():
        median = statistics.median(values)
        print(f"| {name} | {median:.1f} | {median / bare:.2f}x |")


if __name__ == "__main__":
    main()
