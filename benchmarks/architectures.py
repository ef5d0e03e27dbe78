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


from helpers import in_turns, medians, run_child
from helpers.runs import DEFAULT_TEXT, run_gptlite, settings_for, VARIANTS


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
