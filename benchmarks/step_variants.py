"""gptlite's training step with one setting changed at a time, beside the PyTorch reference.

    python benchmarks/step_variants.py [TEXT] [--preset cpu] [--batch-size N] [--block-size T] [--steps 200]
        [--warmup 40] [--rounds 2] [--variants reference xla no-xla ...]

Each variant is a child process with its own environment (XLA reads its flags
once per process); the rounds take them in turn so that machine noise hits
all alike. A variant's figure is ms per optimizer step under `model.fit`
after `--warmup` steps (which take the compile), on random windows of the
text; "reference" is `torch_reference.py`'s step (nanoGPT's). Prints each
child's figure, then the medians and their ratios to the reference. It finds
where a CPU loses time, not the loss: every variant trains the same model.
"""

import argparse
import json
import os
import pathlib
import statistics
import sys
import time

from helpers import in_turns, run_child

HERE = pathlib.Path(__file__).resolve().parent
DEFAULT_TEXT = HERE.parents[1] / "shared" / "data" / "tinyshakespeare.txt"
# name: (backend, XLA on, precision, environment). Each changes one thing from "xla", gptlite's default:
# TensorFlow, XLA, fp32.
VARIANTS = {
    "reference": ("reference", False, "fp32", {}),
    "reference-bf16": ("reference", False, "bf16", {}),
    "xla": ("tensorflow", True, "fp32", {}),
    "no-xla": ("tensorflow", False, "fp32", {}),
    "fast-math": ("tensorflow", True, "fp32", {"XLA_FLAGS": "--xla_cpu_enable_fast_math=true"}),
    "vector-512": ("tensorflow", True, "fp32", {"XLA_FLAGS": "--xla_cpu_prefer_vector_width=512"}),
    "onednn-dots": ("tensorflow", True, "fp32",
                    {"XLA_FLAGS": "--xla_cpu_use_onednn=true --xla_cpu_experimental_onednn_fusion_type=dot"}),
    "xnn-dots": ("tensorflow", True, "fp32",
                 {"XLA_FLAGS": "--xla_cpu_use_xnnpack=true --xla_cpu_experimental_xnn_fusion_type=dot"}),
    "xnn-graph": ("tensorflow", True, "fp32",
                  {"XLA_FLAGS": "--xla_cpu_use_xnnpack=true "
                                "--xla_cpu_experimental_xnn_graph_fusion_mode=XNN_GRAPH_FUSION_MODE_GREEDY"}),
    "one-thread-eigen": ("tensorflow", True, "fp32", {"XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false"}),
    "inter-op-1": ("tensorflow", True, "fp32", {"TF_NUM_INTEROP_THREADS": "1"}),
    "bf16": ("tensorflow", True, "bf16", {}),
    "jax": ("jax", True, "fp32", {}),
    "jax-bf16": ("jax", True, "bf16", {}),
    "torch": ("torch", False, "fp32", {}),
    "torch-bf16": ("torch", False, "bf16", {}),
}


def windows(ids, length, batch_size, rng):
    import numpy as np

    starts = rng.integers(0, len(ids) - length - 1, batch_size)
    rows = np.stack([ids[s: s + length + 1] for s in starts]).astype(np.int32)
    return rows[:, :-1], rows[:, 1:]


def reference_ms(ids, vocabulary_size, settings, steps, warmup, precision):
    from helpers.torch_reference import ReferenceTrainer

    trainer = ReferenceTrainer(ids, ids[:10_000], vocabulary_size, {**settings, "lr": 1e-3}, precision)
    for _ in range(warmup):
        trainer.step()
    start = time.perf_counter()
    for _ in range(steps):
        trainer.step()
    return 1000 * (time.perf_counter() - start) / steps


def gptlite_ms(ids, vocabulary_size, settings, steps, warmup, xla, precision):
    import keras
    import numpy as np

    import gptlite
    from gptlite.training import fit
    from gptlite.training.settings import dtype_policy, split_settings

    model_settings, training_settings = split_settings({**settings, "precision": precision})
    config = gptlite.TrainingConfig(**training_settings)
    keras.utils.set_random_seed(0)
    model = gptlite.GPT(vocab_size=vocabulary_size, dtype=dtype_policy(precision), **model_settings)
    model.build((None, model.config.block_size))
    fit.compile_for_training(model, config)
    # compile_for_training picks XLA where the backend has it; a variant may turn it off.
    model.jit_compile = xla and keras.backend.backend() != "torch"
    rng = np.random.default_rng(0)
    batches = [windows(ids, model.config.block_size, config.batch_size, rng) for _ in range(16)]

    def dataset():
        for index in range(warmup + steps):
            yield batches[index % len(batches)]

    marks = []

    class Clock(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch in (warmup - 1, warmup + steps - 1):
                marks.append(time.perf_counter())

    model.fit(dataset(), steps_per_epoch=warmup + steps, epochs=1, verbose=0, callbacks=[Clock()])
    return 1000 * (marks[1] - marks[0]) / steps


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("text", nargs="?", type=pathlib.Path, default=DEFAULT_TEXT)
    parser.add_argument("--preset", default="cpu")
    parser.add_argument("--batch-size", type=int)
    parser.add_argument("--block-size", type=int)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--variants", nargs="+", default=["reference", "xla", "no-xla"], choices=list(VARIANTS))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    text_path = args.text.resolve()

    if args.child:
        import numpy as np

        from gptlite.training.settings import PRESETS

        settings = dict(PRESETS[args.preset])
        if args.batch_size:
            settings["batch_size"] = args.batch_size
        if args.block_size:
            settings["block_size"] = args.block_size
        text = text_path.read_text(encoding="utf-8")
        vocabulary = sorted(set(text))
        index = {c: i for i, c in enumerate(vocabulary)}
        ids = np.array([index[c] for c in text], dtype=np.int64)
        backend, xla, precision, _ = VARIANTS[args.child]
        if backend == "reference":
            ms = reference_ms(ids, len(vocabulary), settings, args.steps, args.warmup, precision)
        else:
            ms = gptlite_ms(ids, len(vocabulary), settings, args.steps, args.warmup, xla, precision)
        print(json.dumps({"ms_per_step": ms}))
        return

    def run(name, round_index):
        backend, _, _, variables = VARIANTS[name]
        env = dict(os.environ, **({} if backend == "reference" else {"KERAS_BACKEND": backend}))
        for variable, value in variables.items():
            env[variable] = f"{env[variable]} {value}" if variable == "XLA_FLAGS" and env.get(variable) else value
        command = [__file__, str(text_path), "--child", name, "--preset", args.preset, "--steps", str(args.steps),
                   "--warmup", str(args.warmup)]
        if args.batch_size:
            command += ["--batch-size", str(args.batch_size)]
        if args.block_size:
            command += ["--block-size", str(args.block_size)]
        return run_child(name, command, env)

    results = in_turns(args.variants, args.rounds, run)
    medians = {name: statistics.median(r["ms_per_step"] for r in runs) for name, runs in results.items()}
    base = medians.get("reference")
    print(f"\n{args.preset} preset, medians of {args.rounds} rounds of {args.steps} steps"
          + (f", batch {args.batch_size}" if args.batch_size else "")
          + (f", context {args.block_size}" if args.block_size else ""), file=sys.stdout)
    print("| variant | ms/step | to reference |\n|---|---:|---:|")
    for name, ms in medians.items():
        print(f"| {name} | {ms:.1f} | {f'{ms / base:.2f}x' if base else ''} |")


if __name__ == "__main__":
    main()
