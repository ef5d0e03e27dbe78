"""A Llama shape (SmolLM2-135M's) in gptlite beside transformers: generation and fine-tuning steps, one run.

    python benchmarks/llama.py [--new-tokens 200] [--repeats 3] [--block-size 256] [--steps 5] [--rounds 3]
                               [--rank 8] [--backend tensorflow] [--parts generate finetune]

The shape is SmolLM2-135M's: 30 layers, width 576, 9 heads sharing 3
key/value heads, SwiGLU of 1536, a 49,152-token vocabulary, a tied head,
rotary positions (theta 100,000), RMSNorm; random weights (speed only),
built in gptlite and exported with `gptlite export --format hf`, which
transformers loads as a `LlamaForCausalLM`.

generate: each library decodes --new-tokens greedily after a 5-token prompt
at batch 1 (transformers: eager torch, its key/value cache on); "cold" is
the first call, compiling included, the rate the median of --repeats calls
after it; the two continuations are compared. The end token's embedding is
zeroed so that no run ends early.

finetune: one training step at context --block-size and batch 1: gptlite in
full and with LoRA adapters of --rank on every projection, through
`gptlite.training.fit.train`, and transformers' model with torch's AdamW,
eager, in full. Each runs in a process of its own, in turns, --rounds
times; ms per step in steady state (--steps steps after two warm-up steps)
and the process's peak resident memory, medians over the rounds.
"""

import argparse
import json
import os
import pathlib
import sys
import tempfile

from helpers import in_turns, medians, run_child, time_calls, time_steps, time_training

SMOLLM2_135M = dict(n_layer=30, n_head=9, n_kv_head=3, n_embd=576, mlp_hidden_size=1536, position="rotary",
                    rope_theta=100000.0, norm="rms", mlp="swiglu", tie_weights=True, bias=False)
VOCABULARY_SIZE = 49152
CONTEXT = 2048
WARMUP_STEPS = 2


def tokenizer_of_the_size():
    """A byte-level BPE tokenizer with 49,152 ids: the 256 bytes, one merge, placeholders, the end token."""
    import gptlite
    from tokenizers import pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocabulary = {symbol: index for index, symbol in enumerate(alphabet)}
    vocabulary[alphabet[0] + alphabet[1]] = len(alphabet)
    vocabulary.update({f"<unused{index}>": index for index in range(len(alphabet) + 1, VOCABULARY_SIZE - 1)})
    vocabulary[gptlite.BPETokenizer.END_TOKEN] = VOCABULARY_SIZE - 1
    return gptlite.BPETokenizer.from_vocabulary_and_merges(vocabulary, [(alphabet[0], alphabet[1])])


def llama_model(block_size=CONTEXT, dtype=None):
    import keras

    import gptlite

    keras.utils.set_random_seed(0)
    tokenizer = tokenizer_of_the_size()
    model = gptlite.GPT(vocab_size=VOCABULARY_SIZE, block_size=block_size, tokenizer=tokenizer, dtype=dtype,
                        **SMOLLM2_135M)
    model.build((None, block_size))
    table = model.embedding.token_embedding.embeddings
    table.assign(keras.ops.where(keras.ops.arange(VOCABULARY_SIZE)[:, None] == tokenizer.end_token_id, 0.0, table))
    return model


def generate(args):
    import torch
    import transformers

    import gptlite

    model = llama_model()
    tokenizer = model.tokenizer
    prompt = "Hello"
    prompt_ids = tokenizer.encode(prompt).astype("int64")
    new = args.new_tokens
    with tempfile.TemporaryDirectory() as folder:
        gptlite.export_hugging_face(model, pathlib.Path(folder) / "hf")
        hf_model = transformers.AutoModelForCausalLM.from_pretrained(pathlib.Path(folder) / "hf").eval()

    def ours():
        return gptlite.generate(model, prompt, max_new_tokens=new, temperature=0.0)[len(prompt):]

    def theirs():
        with torch.no_grad():
            out = hf_model.generate(torch.tensor(prompt_ids[None]), max_new_tokens=new, min_new_tokens=new,
                                    do_sample=False, use_cache=True, pad_token_id=0)
        return tokenizer.decode(out[0, len(prompt_ids):].tolist())

    results = {name: time_calls(run, args.repeats) for name, run in (("gptlite", ours), ("transformers", theirs))}
    same = results["gptlite"][2] == results["transformers"][2]
    print(f"SmolLM2-135M shape, batch 1, {new} new tokens after a {len(prompt_ids)}-token prompt, greedy; "
          f"gptlite on {os.environ.get('KERAS_BACKEND', 'tensorflow')}; the continuations "
          f"{'are the same' if same else 'differ'}")
    print("| library | tokens/s (median) | cold, s |")
    print("|---|---:|---:|")
    rates = {name: new / seconds for name, (_, seconds, _) in results.items()}
    for name, (cold, _, _) in results.items():
        print(f"| {name} | {rates[name]:,.1f} | {cold:.1f} |")
    print(f"gptlite against transformers: {rates['gptlite'] / rates['transformers']:.2f}x the tokens/s")


def measure_transformers(args):
    import numpy as np
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=VOCABULARY_SIZE, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
        num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=CONTEXT, rope_theta=100000.0,
        rms_norm_eps=1e-5, tie_word_embeddings=True)
    model = transformers.LlamaForCausalLM(config).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.99), weight_decay=0.1)
    ids = np.random.default_rng(0).integers(0, VOCABULARY_SIZE, 200_000)
    rng = np.random.default_rng(1)

    def step():
        start = rng.integers(0, len(ids) - args.block_size - 1, args.batch_size)
        batch = torch.tensor(np.stack([ids[s:s + args.block_size] for s in start]))
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return time_steps(step, args.steps, WARMUP_STEPS)


def measure_gptlite(args, rank):
    from gptlite.training.settings import TrainingConfig

    config = TrainingConfig(batch_size=args.batch_size, max_iters=WARMUP_STEPS + args.steps, lr=1e-4, min_lr=1e-5,
                            warmup_iters=1, eval_interval=10_000, checkpoint_interval=10_000, eval_iters=1,
                            lora_rank=rank)
    model = llama_model(args.block_size)
    if rank:
        model.enable_lora(rank)
    return time_training(model, config, VOCABULARY_SIZE, WARMUP_STEPS)


def finetune(args):
    env = dict(os.environ, KERAS_BACKEND=args.backend)
    flags = [f"--batch-size={args.batch_size}", f"--block-size={args.block_size}", f"--steps={args.steps}",
             f"--rank={args.rank}"]
    results = in_turns(["transformers", "full", "lora"], args.rounds,
                       lambda kind, _: run_child(kind, [__file__, f"--child={kind}", *flags], env), sys.stderr)
    figures = medians(results, ("ms_per_step", "peak_rss_mb"))
    reference_ms = figures["transformers"]["ms_per_step"]
    print(f"SmolLM2-135M shape, one training step at context {args.block_size}, batch {args.batch_size}, "
          f"{args.rounds} rounds; gptlite on {args.backend} fp32, transformers eager fp32 with torch's AdamW")
    print("| run | ms/step (median) | vs transformers | peak RSS, MB |")
    print("|---|---:|---:|---:|")
    for kind, figure in figures.items():
        ms, rss = figure["ms_per_step"], figure["peak_rss_mb"]
        label = {"full": "gptlite, full", "lora": f"gptlite, LoRA rank {args.rank}"}.get(kind, kind)
        print(f"| {label} | {ms:,.0f} | {ms / reference_ms:.2f}x | {rss:,.0f} |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--new-tokens", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--block-size", type=int, default=256)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--backend", default="tensorflow")
    parser.add_argument("--parts", nargs="+", default=["generate", "finetune"], choices=["generate", "finetune"])
    parser.add_argument("--child", choices=["transformers", "full", "lora", "generate"], default=None)
    args = parser.parse_args()
    if args.child == "generate":
        generate(args)
        return
    if args.child:
        result = (measure_transformers(args) if args.child == "transformers"
                  else measure_gptlite(args, args.rank if args.child == "lora" else 0))
        print(json.dumps(result))
        return
    if "generate" in args.parts:  # in a child, so that the backend is the one asked for
        import subprocess

        env = dict(os.environ, KERAS_BACKEND=args.backend)
        subprocess.run([sys.executable, __file__, "--child=generate", f"--new-tokens={args.new_tokens}",
                        f"--repeats={args.repeats}"], env=env, check=True)
    if "finetune" in args.parts:
        finetune(args)


if __name__ == "__main__":
    main()
