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

from helpers import in_turns, medians, run_child
from helpers.runs import DEFAULT_TEXT, run_gptlite, run_reference, settings_for

HERE = pathlib.Path(__file__).resolve().parent
DEFAULT_RUNS = ["reference:fp32", "tensorflow:fp32", "jax:fp32", "torch:fp32"]
MEASURES = {
    "ms_per_iter": "ms/iter",
    "tokens_per_s": "tokens/s",
    "compile_s": "compile s",
    "peak_rss_mb": "peak RSS MB",
    "val_loss": "val loss",
    "mfu": "MFU",
}
# What limits each library to AVX2 and FMA, as on a CPU without AVX-512: XLA (TensorFlow's and JAX's
# compiled steps), oneDNN (TensorFlow's and torch's kernels outside XLA), MKL and ATen (torch's matmuls
# and vectorised ops).
ISA_ENVIRONMENTS = {
    "native": {},
    "avx2": {"XLA_FLAGS": "--xla_cpu_max_isa=AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2",
             "ATEN_CPU_CAPABILITY": "avx2"},
}


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
