"""gptlite beside litgpt on a GPT-2 small (124M) shape: generation, and a fine-tuning step in full and with LoRA.

    python benchmarks/vs_litgpt.py --litgpt-python PATH [--rounds 3] [--steps 8] [--new-tokens 200]

litgpt pins versions of shared packages (huggingface_hub) that differ from
gptlite's, so it lives in a virtual environment of its own, whose Python is
--litgpt-python:

    python3 -m venv litgpt-env && litgpt-env/bin/pip install torch==2.13.0 litgpt

litgpt has no GPT-2: its model is built from a `Config` of the same size
(12 layers, 12 heads, width 768, 50,257 tokens, LayerNorm, a GELU (tanh)
feed-forward of 3,072, biases), which differs where litgpt has no choice:
rotary position encoding in place of a learned table, an output head of
its own rather than tied to the token embedding. The matrix work per token
is the same. Random weights on both sides (speed only).

- Generation: batch 1, a 5-token prompt, --new-tokens greedy tokens, with
  each library's key/value cache (litgpt's sized to prompt plus new tokens,
  as its own generate script does; gptlite's context is 1024); the median of
  3 calls after a first, cold one.
- Fine-tuning step: context 256, batch 1, AdamW, ms per step over --steps
  steps after two warm-up steps, in full and with rank-8 LoRA on the
  attention and feed-forward projections; litgpt eager, as its fine-tuning
  scripts run it (only its pretraining compiles the model); gptlite as
  `train.py` runs (TensorFlow, fp32).
  Peak RSS by the last step.

Every measurement runs in a process of its own, the two libraries in turns,
--rounds rounds; the table gives medians.
"""

import argparse
import json
import os
import statistics
import sys

from helpers import in_turns, run_child, time_calls, time_steps

VOCABULARY_SIZE = 50257
SHAPE = dict(n_layer=12, n_head=12, n_embd=768)
CONTEXT = 1024
PROMPT_LENGTH = 5
GENERATION_REPEATS = 3
RANK = 8
LEARNING_RATE = 1e-4


# --- litgpt (run with --litgpt-python) ---------------------------------------

def _litgpt_config(rank):
    from litgpt.lora import Config

    adapters = dict(lora_r=rank, lora_alpha=rank, lora_query=True, lora_key=True, lora_value=True,
                    lora_projection=True, lora_mlp=True) if rank else {}
    return Config(block_size=CONTEXT, vocab_size=VOCABULARY_SIZE, padded_vocab_size=VOCABULARY_SIZE,
                  intermediate_size=4 * SHAPE["n_embd"], bias=True, norm_class_name="LayerNorm", norm_eps=1e-5,
                  mlp_class_name="GptNeoxMLP", gelu_approximate="tanh", parallel_residual=False,
                  rotary_percentage=1.0, **SHAPE, **adapters)


def litgpt_generation(new_tokens):
    import torch
    from litgpt.generate.base import generate
    from litgpt.model import GPT

    torch.manual_seed(0)
    model = GPT(_litgpt_config(0)).eval()
    prompt = torch.randint(0, VOCABULARY_SIZE, (PROMPT_LENGTH,))
    model.max_seq_length = PROMPT_LENGTH + new_tokens
    model.set_kv_cache(batch_size=1)

    def call():
        with torch.inference_mode():
            out = generate(model, prompt, PROMPT_LENGTH + new_tokens, temperature=0.0, include_prompt=False)
        assert len(out) == new_tokens, len(out)

    cold, seconds, _ = time_calls(call, GENERATION_REPEATS)
    return {"tokens_per_s": new_tokens / seconds, "cold_s": cold}


def litgpt_step(steps, rank):
    import torch
    from litgpt.lora import GPT, mark_only_lora_as_trainable

    torch.manual_seed(0)
    model = GPT(_litgpt_config(rank)).train()
    model.max_seq_length = 256
    if rank:
        mark_only_lora_as_trainable(model)
    trainable = [parameter for parameter in model.parameters() if parameter.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=LEARNING_RATE, weight_decay=0.1, betas=(0.9, 0.99))
    ids = torch.randint(0, VOCABULARY_SIZE, (1, 257))

    def step():
        logits = model(ids[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCABULARY_SIZE), ids[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return dict(time_steps(step, steps), trainable=sum(parameter.numel() for parameter in trainable))


# --- gptlite ------------------------------------------------------------------

def gptlite_generation(new_tokens):
    import gptlite
    from helpers.models import gpt2_sized_model

    model = gpt2_sized_model()  # context 1024, as CONTEXT
    prompt = "Hello"
    assert len(model.tokenizer.encode(prompt)) == PROMPT_LENGTH

    def call():
        gptlite.generate(model, prompt, max_new_tokens=new_tokens, temperature=0.0)  # all of them: no end token

    cold, seconds, _ = time_calls(call, GENERATION_REPEATS)
    return {"tokens_per_s": new_tokens / seconds, "cold_s": cold}


def gptlite_step(steps, rank):
    from helpers.runs import measure_gptlite

    settings = argparse.Namespace(batch_size=1, block_size=256, steps=steps, precision="fp32")
    return measure_gptlite(settings, rank)


# --- driver -------------------------------------------------------------------

MEASUREMENTS = {"generation": (gptlite_generation, litgpt_generation),
                "full": (lambda steps: gptlite_step(steps, 0), lambda steps: litgpt_step(steps, 0)),
                "lora": (lambda steps: gptlite_step(steps, RANK), lambda steps: litgpt_step(steps, RANK))}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--litgpt-python", help="a Python interpreter with litgpt installed")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=200)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        library, kind = args.child.split(":")
        ours, theirs = MEASUREMENTS[kind]
        measure = ours if library == "gptlite" else theirs
        print(json.dumps(measure(args.new_tokens if kind == "generation" else args.steps)))
        return
    if not args.litgpt_python:
        parser.error("give --litgpt-python, the Python of an environment with litgpt installed")

    def run(name, _):
        library, kind = name
        python = sys.executable if library == "gptlite" else args.litgpt_python
        command = [__file__, f"--child={library}:{kind}", f"--steps={args.steps}", f"--new-tokens={args.new_tokens}"]
        return run_child(f"{library} {kind}", command, dict(os.environ, KERAS_BACKEND="tensorflow"), python)

    runs = [(library, kind) for kind in MEASUREMENTS for library in ("gptlite", "litgpt")]
    results = in_turns(runs, args.rounds, run, sys.stderr)

    def median(library, kind, field):
        return statistics.median(row[field] for row in results[library, kind])

    print(f"GPT-2 124M shape, {args.rounds} rounds (medians); gptlite on TensorFlow fp32, litgpt on torch eager")
    print("| measurement | gptlite | litgpt | gptlite against litgpt |")
    print("|---|---:|---:|---:|")
    ours, theirs = median("gptlite", "generation", "tokens_per_s"), median("litgpt", "generation", "tokens_per_s")
    print(f"| generation, batch 1, {args.new_tokens} new tokens: tokens/s | {ours:,.1f} | {theirs:,.1f} | "
          f"{ours / theirs:.2f}x the speed |")
    for kind, label in (("full", "full fine-tuning"), ("lora", f"LoRA rank {RANK}")):
        ours, theirs = median("gptlite", kind, "ms_per_step"), median("litgpt", kind, "ms_per_step")
        print(f"| {label} step, context 256, batch 1: ms | {ours:,.0f} | {theirs:,.0f} | "
              f"{theirs / ours:.2f}x the speed |")
        ours, theirs = median("gptlite", kind, "peak_rss_mb"), median("litgpt", kind, "peak_rss_mb")
        print(f"| {label}: peak RSS, MB | {ours:,.0f} | {theirs:,.0f} | {ours / theirs:.2f}x the memory |")


if __name__ == "__main__":
    main()
