"""Architectures side by side: GPT-2's layout, each modern switch alone, all of them together, and each
layout with the Muon optimizer.

    python benchmarks/architectures.py [TEXT] [--preset cpu] [--rounds 1] [--max-iters N]
        [--variants gpt2 rotary ...] [--backend tensorflow] [--vocab-size N]

Every variant trains the preset's budget (its steps, batch, context and
width) on TEXT (default: Tiny Shakespeare), in a child process of its own,
through `benchmarks/train.py`'s `run_gptlite`, exactly as train.py trains:
on the text's characters, or with `--vocab-size N` on a byte-level BPE
vocabulary of N tokens learned from it.
The rounds take the variants in turn, so that machine noise hits all alike,
and round r uses seed 1337 + r. Reports, with medians over the rounds:
- parameters (without a position table, which is looked up, not multiplied);
- val loss after the last step (nats per token: the run's own, a mean over
  a few random batches of the validation split), and the held-out loss, the
  last weights scored on the whole validation split as `gptlite eval` scores
  a text (windows of the context overlapping by half), with its bits per
  byte, which compare across vocabularies (on ASCII text, by characters, they
  are bits per character);
- ms/iter, the median step, and its ratio to GPT-2's layout;
- training s: training's own clock at its last step (evaluations included),
  so that variants of unequal steps compare at their wall time;
- KV cache: the key/value cache's bytes at the full context for one row, in
  float32 (n_layer x 2 x key/value heads x head size x context x 4).
"""

import argparse
import json
import os
import pathlib

from gptlite.training.settings import PRESETS

from children import in_turns, medians, run_child
from train import DEFAULT_TEXT, run_gptlite, settings_for


def beyond_cpu(preset):
    """What a preset sets beyond the cpu preset's: the settings that make it a variant of it."""
    return {name: value for name, value in PRESETS[preset].items() if PRESETS["cpu"].get(name) != value}


# Each variant's settings over the preset's. n_kv_head 2 of the cpu preset's 4 heads halves the cache.
# "modern" is what the modern preset sets beyond the cpu preset's: all five switches.
VARIANTS = {
    "gpt2": {},
    "rotary": {"position": "rotary"},
    "rms": {"norm": "rms"},
    "swiglu": {"mlp": "swiglu"},
    "relu2": {"mlp": "relu2"},
    "gqa": {"n_kv_head": 2},
    "qk_norm": {"qk_norm": True},
    "llama": {"position": "rotary", "norm": "rms", "mlp": "swiglu"},
    "modern": beyond_cpu("modern"),
}
# The optimizer beside each layout: Keras's Muon for the blocks' matrices (see docs/training.md), at the
# preset's steps, and at the steps its slower step fits in AdamW's wall time (its step measured at about
# 1.33x AdamW's on 2 cores: benchmarks/journal.md), its schedule over those; modern_muon_1500 was the laptop
# preset until its Newton-Schulz iterations went from 5 to 3 (below).
VARIANTS.update({"muon": {"optimizer": "muon"}, "modern_muon": {**VARIANTS["modern"], "optimizer": "muon"},
                 "muon_1500": {"optimizer": "muon", "max_iters": 1500},
                 "modern_muon_1500": {**VARIANTS["modern"], "optimizer": "muon", "max_iters": 1500}})
# Beside the best of those: ReLU² for SwiGLU, and Muon at twice the peak learning rate.
VARIANTS.update({"modern_relu2": {**VARIANTS["modern"], "mlp": "relu2"},
                 "modern_relu2_muon_1500": {**VARIANTS["modern_muon_1500"], "mlp": "relu2"},
                 "modern_muon_1500_lr6e-3": {**VARIANTS["modern_muon_1500"], "lr": 6e-3}})
# modern_muon_1500 with an output head of its own, and with a smaller or larger batch for the steps its step
# fits in the same time (Muon's share of a step does not change with the batch: about 1,950 steps of 8 rows,
# 840 of 24, 500 of 48).
VARIANTS.update({"laptop_untied": {**VARIANTS["modern_muon_1500"], "tie_weights": False},
                 "laptop_batch8": {**VARIANTS["modern_muon_1500"], "batch_size": 8, "max_iters": 1950},
                 "laptop_batch24": {**VARIANTS["modern_muon_1500"], "batch_size": 24, "max_iters": 840},
                 "laptop_batch48": {**VARIANTS["modern_muon_1500"], "batch_size": 48, "max_iters": 500}})
# The same at longer contexts, its rows fewer so that a step holds as many tokens (12 x 64): each
# position then sees more of the text before it, at a little more attention per token.
VARIANTS.update({"laptop_ctx128": {**VARIANTS["modern_muon_1500"], "block_size": 128, "batch_size": 6},
                 "laptop_ctx256": {**VARIANTS["modern_muon_1500"], "block_size": 256, "batch_size": 3}})
# Muon with 3 Newton-Schulz iterations for Keras's 5 (fewer products a step), at two of those contexts.
VARIANTS.update({f"{name}_ns3": {**VARIANTS[name], "newton_schulz_steps": 3}
                 for name in ("modern_muon_1500", "laptop_ctx128")})
# 3 iterations for the steps their quicker step fits in the time of 5's 1,500 (0.80x-0.91x its step on 2
# cores: benchmarks/journal.md): the laptop preset; and for the steps of the 0.80x.
# 2 iterations for the steps of their step (0.92x of 3's by a 200-step probe).
VARIANTS.update({"laptop": beyond_cpu("laptop"), "laptop_1870": {**beyond_cpu("laptop"), "max_iters": 1870},
                 "laptop_ns2_1840": {**beyond_cpu("laptop"), "newton_schulz_steps": 2, "max_iters": 1840}})
# The longer contexts for the steps their slower steps fit in modern_muon_1500's time (1.05x and 1.27x its
# step on 2 cores: benchmarks/journal.md).
VARIANTS.update({"laptop_ctx128_1400": {**VARIANTS["laptop_ctx128"], "max_iters": 1400},
                 "laptop_ctx256_1200": {**VARIANTS["laptop_ctx256"], "max_iters": 1200}})
# Muon's momentum at 0.9 for Keras's 0.95: the step's cost is the same.
VARIANTS["laptop_momentum09"] = {**beyond_cpu("laptop"), "muon_momentum": 0.9}
# The model's shape, one dimension at a time (4 heads and 2 key/value heads kept), for the steps each one's step
# fits in laptop's 1,700 (its step 0.77x, 1.49x, 0.69x and 1.98x laptop's on 2 cores: `step_times.py`).
VARIANTS.update({"laptop_layers3": {**beyond_cpu("laptop"), "n_layer": 3, "max_iters": 2210},
                 "laptop_layers6": {**beyond_cpu("laptop"), "n_layer": 6, "max_iters": 1145},
                 "laptop_width96": {**beyond_cpu("laptop"), "n_embd": 96, "max_iters": 2460},
                 "laptop_width192": {**beyond_cpu("laptop"), "n_embd": 192, "max_iters": 857}})
# Weight decay at twice the preset's 0.1.
VARIANTS["laptop_decay02"] = {**beyond_cpu("laptop"), "weight_decay": 0.2}
# AdamW's beta2 at 0.95 (nanoGPT's for GPT-2) for the preset's 0.99 (its for Tiny Shakespeare); the floor of the
# schedule at 3e-4 or 1e-5 for 1e-4; 200 warm-up steps for 100.
VARIANTS.update({"laptop_beta2_095": {**beyond_cpu("laptop"), "beta2": 0.95},
                 "laptop_min_lr3e-4": {**beyond_cpu("laptop"), "min_lr": 3e-4},
                 "laptop_min_lr1e-5": {**beyond_cpu("laptop"), "min_lr": 1e-5},
                 "laptop_warmup200": {**beyond_cpu("laptop"), "warmup_iters": 200}})
# Full multi-head attention (4 key/value heads for 2); the steps of 1.15x nanoGPT's wall time on a Zen 4, where
# laptop's 1,700 take 0.85x (the Tiny Shakespeare target's allowance: benchmarks/journal.md).
VARIANTS.update({"laptop_kv4": {**beyond_cpu("laptop"), "n_kv_head": 4},
                 "laptop_2300": {**beyond_cpu("laptop"), "max_iters": 2300}})
# Post-norm blocks (the original Transformer's: each sum normalised, no final norm) in GPT-2's layout, in the
# laptop preset's, and in each of its two halves (the modern switches by AdamW; GPT-2's layout by Muon); with and
# without warm-up, `norm_position.py`.
VARIANTS.update({"post_norm": {"norm_position": "post"},
                 "laptop_post_norm": {**beyond_cpu("laptop"), "norm_position": "post"},
                 "modern_post_norm": {**VARIANTS["modern"], "norm_position": "post"},
                 "muon_1500_post_norm": {**VARIANTS["muon_1500"], "norm_position": "post"}})
MEASURES = {"parameters": "parameters", "val_loss": "val loss", "held_out_loss": "held-out loss",
            "bits_per_byte": "held-out bits/byte",
            "ms_per_iter": "ms/iter", "train_s": "training s", "kv_cache_kb": "KV cache KB"}


def measure(text, settings, seed, vocab_size=None):
    """One variant's run: `run_gptlite`'s figures, with bits per byte and the cache's size."""
    import gptlite
    from gptlite.training.settings import split_settings

    result = run_gptlite(text, settings, "fp32", seed, vocab_size)
    config = gptlite.GPTConfig(**split_settings(settings)[0])
    cache_bytes = config.n_layer * 2 * config.kv_heads * config.head_size * config.block_size * 4
    return {**result, "bits_per_byte": result["held_out_bits_per_byte"], "kv_cache_kb": cache_bytes / 1024}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("text", nargs="?", type=pathlib.Path, default=DEFAULT_TEXT)
    parser.add_argument("--preset", default="cpu")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--max-iters", type=int, help="steps for every variant, over those a variant sets")
    parser.add_argument("--backend", default="tensorflow")
    parser.add_argument("--vocab-size", type=int, help="a byte-level BPE vocabulary of this many tokens")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=1337, help=argparse.SUPPRESS)
    args = parser.parse_args()
    overrides = {"max_iters": args.max_iters}
    if args.max_iters:
        overrides.update(eval_interval=args.max_iters, checkpoint_interval=args.max_iters)
    base = settings_for(args.preset, overrides)
    base["warmup_iters"] = min(base["warmup_iters"], base["max_iters"] // 5)

    def variant(name):
        """A variant's settings; --max-iters wins over its own steps (its evaluations at that interval)."""
        return {**VARIANTS[name], **({"max_iters": args.max_iters} if args.max_iters else {})}

    if args.child:
        print(json.dumps(measure(args.text, {**base, **variant(args.child)}, args.seed, args.vocab_size)))
        return

    env = dict(os.environ, KERAS_BACKEND=args.backend)

    def run(name, round_index):
        command = [__file__, str(args.text.resolve()), "--child", name, "--preset", args.preset,
                   "--seed", str(1337 + round_index)]
        command += ["--max-iters", str(args.max_iters)] if args.max_iters else []
        return run_child(name, command + (["--vocab-size", str(args.vocab_size)] if args.vocab_size else []), env)

    first = args.variants[0]
    figures = medians(in_turns(args.variants, args.rounds, run), MEASURES)
    tokens = f"BPE {args.vocab_size:,}" if args.vocab_size else "characters"
    print(f"\n{args.preset} preset's budget ({base['max_iters']} steps, batch {base['batch_size']}, context "
          f"{base['block_size']}), {args.backend}, fp32, {tokens}; medians of {args.rounds} "
          f"(seeds 1337..{1336 + args.rounds}); ratios to {first}\n")
    print("| variant | settings | " + " | ".join(MEASURES.values()) + " |")
    print("|---|---|" + "---:|" * len(MEASURES))
    for name in args.variants:
        cells = []
        for key in MEASURES:
            value = figures[name][key]
            cell = f"{value:,.0f}" if key in ("parameters", "kv_cache_kb") else f"{value:.4f}" \
                if key in ("val_loss", "held_out_loss", "bits_per_byte") else f"{value:.1f}"
            if name != first and key in ("ms_per_iter", "train_s", "kv_cache_kb", "parameters"):
                cell += f" ({value / figures[first][key]:.2f}x)"
            cells.append(cell)
        settings = ", ".join(f"{k}={v}" for k, v in variant(name).items()) or "GPT-2's layout"
        print(f"| {name} | {settings} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
