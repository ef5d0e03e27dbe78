"""Training speed, memory and loss: gptlite on each backend and precision, and the PyTorch reference, side by side.

    python benchmarks/train.py [TEXT] [--preset cpu] [--runs reference:fp32 tensorflow:fp32 ...]
        [--rounds 3] [--max-iters N] [--batch-size N] [--eval-interval N] [--isa native|avx2]

Each run is a whole training run in a child process of its own (a Keras
backend is fixed for the life of a process): gptlite through
`gptlite.training.fit.train`, exactly as `train.py` trains, or the PyTorch
re-implementation of nanoGPT in `torch_reference.py` ("reference", at
nanoGPT's learning rate for Tiny Shakespeare, 1e-3). Runs are
named BACKEND:PRECISION; the rounds take them in turn so that machine noise
hits all alike, and round r uses seed 1337 + r, so the losses' median is a
median over seeds. Each run reports:
- ms/iter: the median time from one optimizer step's end to the next's
  (evaluations fall between `fit` calls, and the step after each is left out);
- tokens/s: batch_size * block_size tokens per iteration at that median;
- compile s: the first step's time less the median (tracing and compiling);
- peak RSS: the child's peak resident memory;
- val loss: the validation loss after the last step (train.py's evaluation);
- MFU: model FLOPs per second (nanoGPT's count: 6 N + 12 L T C per token,
  N without the position table) over the FLOP/s of a 2048 x 2048 matmul
  the child measures with its own backend and precision.
Prints each run as it ends, then medians, and ratios to the first run named.
`--isa avx2` limits XLA, oneDNN, MKL and ATen to AVX2 and FMA in every
child (ISA_ENVIRONMENTS), to measure on an AVX-512 machine what a CPU
without AVX-512 would do.
"""

import argparse
import json
import os
import pathlib
import resource
import statistics
import tempfile
import time

from children import in_turns, medians, run_child

HERE = pathlib.Path(__file__).resolve().parent
DEFAULT_TEXT = HERE.parents[1] / "shared" / "data" / "tinyshakespeare.txt"
DEFAULT_RUNS = ["reference:fp32", "tensorflow:fp32", "jax:fp32", "torch:fp32"]
MEASURES = {
    "ms_per_iter": "ms/iter",
    "tokens_per_s": "tokens/s",
    "compile_s": "compile s",
    "peak_rss_mb": "peak RSS MB",
    "val_loss": "val loss",
    "mfu": "MFU",
}
MATMUL_SIZE = 2048
REFERENCE_LR = 1e-3
# What limits each library to AVX2 and FMA, as on a CPU without AVX-512: XLA (TensorFlow's and JAX's
# compiled steps), oneDNN (TensorFlow's and torch's kernels outside XLA), MKL and ATen (torch's matmuls
# and vectorised ops).
ISA_ENVIRONMENTS = {
    "native": {},
    "avx2": {"XLA_FLAGS": "--xla_cpu_max_isa=AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2",
             "ATEN_CPU_CAPABILITY": "avx2"},
}


def settings_for(preset, overrides):
    """The preset's settings with the command line's overrides, as one flat dict."""
    from gptlite.training.settings import PRESETS

    settings = dict(PRESETS[preset])
    settings.update({name: value for name, value in overrides.items() if value is not None})
    return settings


def flops_per_iteration(settings, parameters):
    layers, width, length = settings["n_layer"], settings["n_embd"], settings["block_size"]
    per_token = 6 * parameters + 12 * layers * length * width
    return per_token * length * settings["batch_size"]


def peak_rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def summarise(step_times, settings, parameters, matmul_flops_per_s):
    median = statistics.median(step_times[1:])
    return {
        "ms_per_iter": median * 1000,
        "tokens_per_s": settings["batch_size"] * settings["block_size"] / median,
        "compile_s": max(step_times[0] - median, 0.0),
        "peak_rss_mb": peak_rss_mb(),
        "mfu": flops_per_iteration(settings, parameters) / median / matmul_flops_per_s,
    }


def time_matmul(multiply, make_operand, repeats=5):
    a, b = make_operand(), make_operand()
    multiply(a, b)
    best = min(_timed(multiply, a, b) for _ in range(repeats))
    return 2 * MATMUL_SIZE**3 / best


def _timed(function, *args):
    start = time.perf_counter()
    function(*args)
    return time.perf_counter() - start


def run_reference(text_path, settings, precision, seed):
    import torch

    from torch_reference import ReferenceTrainer, character_splits

    train_ids, validation_ids, vocabulary_size = character_splits(text_path.read_text(encoding="utf-8"))
    # nanoGPT's own learning rate for Tiny Shakespeare, whatever gptlite's preset uses.
    settings = {**settings, "lr": REFERENCE_LR}
    trainer = ReferenceTrainer(train_ids, validation_ids, vocabulary_size, settings, precision, seed)
    step_times = []
    for _ in range(settings["max_iters"]):
        start = time.perf_counter()
        trainer.step()
        step_times.append(time.perf_counter() - start)
    val_loss = trainer.validation_loss(settings["eval_iters"])
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    ceiling = time_matmul(torch.matmul, lambda: torch.randn(MATMUL_SIZE, MATMUL_SIZE, dtype=dtype))
    return {**summarise(step_times, settings, trainer.parameter_count(), ceiling), "val_loss": val_loss}


def run_gptlite(text_path, settings, precision, seed, vocab_size=None):
    """One training run as train.py trains; with `vocab_size`, on a byte-level BPE vocabulary of that many tokens
    learned from the text as train.py learns it (otherwise on its characters)."""
    import keras
    import numpy as np

    import gptlite
    from gptlite import files
    from gptlite.data import lm
    from gptlite.training import fit
    from gptlite.training.settings import dtype_policy, split_settings

    class StepClock(keras.callbacks.Callback):
        """Step times within each fit call, the first of each call (the one after an evaluation) left out."""

        def __init__(self):
            super().__init__()
            self.times, self.first = [], None

        def on_train_begin(self, logs=None):
            self.last = None

        def on_train_batch_end(self, batch, logs=None):
            now = time.perf_counter()
            if self.first is None:
                self.first = now - self.started
            elif self.last is not None:
                self.times.append(now - self.last)
            self.last = now

    text = files.read_text(text_path)
    if vocab_size:
        tokenizer = gptlite.BPETokenizer.train(lm.Corpus.from_text(text).sample(lm.BPE_SAMPLE_BYTES), vocab_size)
    else:
        tokenizer = gptlite.CharTokenizer.from_text(text)
    train_ids, validation_ids = lm.split(tokenizer.encode(text))
    model_settings, training_settings = split_settings(
        {**settings, "seed": seed, "precision": precision}
    )
    config = gptlite.TrainingConfig(**training_settings)
    keras.utils.set_random_seed(seed)
    model = gptlite.GPT(vocab_size=tokenizer.vocabulary_size, tokenizer=tokenizer,
                        dtype=dtype_policy(config.precision), **model_settings)
    model.build((None, model.config.block_size))
    clock = StepClock()
    clock.started = time.perf_counter()
    with tempfile.TemporaryDirectory() as out_dir:
        rows = fit.train(model, train_ids, validation_ids, config, out_dir, verbose=0, callbacks=[clock])
        # The whole validation split, as `gptlite eval` scores a text (windows of the context overlapping by
        # half): the run's own validation loss is a mean over a few random windows, every position of each
        # counted, so it reads lower for a longer context whatever the model, and ranks close recipes by chance.
        validation_text = pathlib.Path(out_dir) / "validation.txt"
        validation_text.write_text(tokenizer.decode(list(validation_ids)), encoding="utf-8")
        held_out = gptlite.evaluate(model, validation_text).total
    # Without a position table, which is looked up rather than multiplied.
    table = model.config.block_size * model.config.n_embd if model.config.position != "rotary" else 0
    parameters = model.count_params() - table
    compute_dtype = "bfloat16" if precision == "bf16" else "float16" if precision == "fp16" else "float32"
    ceiling = time_matmul(
        lambda a, b: keras.ops.convert_to_numpy(keras.ops.cast(keras.ops.matmul(a, b)[0, 0], "float32")),
        lambda: keras.ops.cast(np.random.default_rng(0).normal(size=(MATMUL_SIZE, MATMUL_SIZE)), compute_dtype),
    )
    return {**summarise([clock.first, *clock.times], settings, parameters, ceiling),
            "val_loss": rows[-1]["val_loss"], "held_out_loss": held_out.loss,
            "held_out_bits_per_byte": held_out.bits_per_byte, "parameters": parameters,
            "train_s": rows[-1]["elapsed_s"]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("text", nargs="?", type=pathlib.Path, default=DEFAULT_TEXT)
    parser.add_argument("--preset", default="cpu")
    parser.add_argument("--runs", nargs="+", default=DEFAULT_RUNS, metavar="BACKEND:PRECISION",
                        help="reference or tensorflow/jax/torch, then fp32, bf16 or fp16")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-iters", type=int)
    parser.add_argument("--batch-size", type=int)
    parser.add_argument("--eval-interval", type=int)
    parser.add_argument("--isa", choices=sorted(ISA_ENVIRONMENTS), default="native",
                        help="avx2: limit every library to AVX2 and FMA in the children, as on a CPU without AVX-512")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=1337, help=argparse.SUPPRESS)
    args = parser.parse_args()
    overrides = {"max_iters": args.max_iters, "batch_size": args.batch_size, "eval_interval": args.eval_interval}
    settings = settings_for(args.preset, overrides)
    if args.max_iters and not args.eval_interval:
        settings["eval_interval"] = settings["checkpoint_interval"] = args.max_iters
    settings["checkpoint_interval"] = max(settings["checkpoint_interval"], settings["eval_interval"])
    if settings["warmup_iters"] >= settings["max_iters"]:
        settings["warmup_iters"] = settings["max_iters"] // 10

    if args.child:
        backend, precision = args.child.split(":")
        run = run_reference if backend == "reference" else run_gptlite
        print(json.dumps(run(args.text, settings, precision, args.seed)))
        return

    def run(name, round_index):
        backend = name.split(":")[0]
        env = dict(os.environ, **({} if backend == "reference" else {"KERAS_BACKEND": backend}))
        for variable, value in ISA_ENVIRONMENTS[args.isa].items():
            env[variable] = f"{env[variable]} {value}" if variable == "XLA_FLAGS" and env.get(variable) else value
        command = [__file__, str(args.text.resolve()), "--child", name, "--preset", args.preset,
                   "--seed", str(1337 + round_index)]
        for flag, value in overrides.items():
            if value is not None:
                command += [f"--{flag.replace('_', '-')}", str(value)]
        return run_child(name, command, env)

    first = args.runs[0]
    figures = medians(in_turns(args.runs, args.rounds, run), MEASURES)
    print(f"\n{args.preset} preset, batch {settings['batch_size']}, {settings['max_iters']} iterations, "
          f"{args.isa} instruction set; "
          f"medians of {args.rounds} (seeds 1337..{1336 + args.rounds}); ratios to {first}\n")
    print("| run | " + " | ".join(MEASURES.values()) + " |")
    print("|---|" + "---:|" * len(MEASURES))
    for name in args.runs:
        cells = []
        for key in MEASURES:
            value = figures[name][key]
            text = f"{value:.1%}" if key == "mfu" else f"{value:,.4g}" if value < 1000 else f"{value:,.0f}"
            if name != first and key in ("ms_per_iter", "tokens_per_s"):
                text += f" ({value / figures[first][key]:.2f}x)"
            cells.append(text)
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
