"""A LoRA step on TensorFlow with XLA and without, at model sizes from the chat base's to GPT-2 small's.

    python benchmarks/probe_lora_xla.py [--rounds 2] [--shapes small,wide,gpu,gpt2]

`gptlite.training.fit.compile_for_training` runs a LoRA step under XLA on
TensorFlow only for models of at most `LORA_XLA_MAX_PARAMETERS`; this
measures both ways for each shape, each in a process of its own, in turns,
with random weights and token ids (speed and memory only): ms per step in
steady state (after two warm-up steps, which include compiling) and the
process's peak resident memory by the last timed step, the medians over
--rounds. Every shape adapts every projection and trains the token
embedding whole, as the chat recipes in docs/chat.md do, but GPT-2's, whose
LoRA adapts the projections only (docs/pretrained.md).

- small: the chat base of benchmarks/journal.md (the `modern` preset's 4 x 128,
  4,100 BPE tokens), context 128, batch 8, rank 32;
- wide: the same with 6 blocks of width 256;
- gpu: the `gpu` preset's 6 x 384 with GELU, context 256, batch 8, rank 16;
- gpt2: GPT-2 small's shape, context 256, batch 1, rank 8.
"""

import argparse
import json
import os
import statistics
import sys

from helpers import in_turns, run_child, time_training
from helpers.runs import GPT2_SMALL

MODERN = dict(position="rotary", norm="rms", mlp="swiglu", n_kv_head=2, qk_norm=True, bias=False)
SHAPES = {  # name: (model settings, batch size, rank, targets)
    "small": (dict(n_layer=4, n_head=4, n_embd=128, vocab_size=4100, block_size=128, **MODERN), 8, 32, True),
    "wide": (dict(n_layer=6, n_head=4, n_embd=256, vocab_size=4100, block_size=128, **MODERN), 8, 32, True),
    "gpu": (dict(n_layer=6, n_head=6, n_embd=384, vocab_size=4100, block_size=256, bias=False), 8, 16, True),
    "gpt2": (dict(GPT2_SMALL, block_size=256, bias=True), 1, 8, False),
}
STEPS = {"small": 100, "wide": 40, "gpu": 30, "gpt2": 6}
WARMUP_STEPS = 2


def measure(shape, xla):
    import keras

    import gptlite
    from gptlite.model.config import LORA_TARGETS
    from gptlite.training import fit
    from gptlite.training.settings import TrainingConfig

    fit.LORA_XLA_MAX_PARAMETERS = 10**12 if xla else 0
    settings, batch_size, rank, embedding = SHAPES[shape]
    targets = (*LORA_TARGETS, "embedding") if embedding else LORA_TARGETS
    config = TrainingConfig(batch_size=batch_size, max_iters=WARMUP_STEPS + STEPS[shape], lr=1e-4, min_lr=1e-5,
                            warmup_iters=1, eval_interval=10_000, checkpoint_interval=10_000, eval_iters=1,
                            lora_rank=rank)
    keras.utils.set_random_seed(0)
    model = gptlite.GPT(**settings)
    model.build((None, settings["block_size"]))
    model.enable_lora(rank, targets=targets)
    result = time_training(model, config, settings["vocab_size"], WARMUP_STEPS)
    return dict(result, parameters=model.count_params(), xla=int(model.jit_compile))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--child", nargs=2, metavar=("SHAPE", "XLA"), default=None)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.child[0], args.child[1] == "1")))
        return

    env = dict(os.environ, KERAS_BACKEND="tensorflow")
    runs = [(shape, xla) for shape in args.shapes.split(",") for xla in ("0", "1")]
    results = in_turns(runs, args.rounds,
                       lambda run, _: run_child(" ".join(run), [__file__, "--child", *run], env), sys.stderr)
    print("| shape | parameters | without XLA: ms/step | with XLA: ms/step | faster | peak RSS without, MB "
          "| with, MB |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for shape in args.shapes.split(","):
        plain, fused = results[(shape, "0")], results[(shape, "1")]
        ms = [statistics.median(r["ms_per_step"] for r in runs) for runs in (plain, fused)]
        rss = [statistics.median(r["peak_rss_mb"] for r in runs) for runs in (plain, fused)]
        print(f"| {shape} | {plain[0]['parameters']:,} | {ms[0]:,.0f} | {ms[1]:,.0f} | {ms[0] / ms[1]:.2f}x "
              f"| {rss[0]:,.0f} | {rss[1]:,.0f} |")


if __name__ == "__main__":
    main()
