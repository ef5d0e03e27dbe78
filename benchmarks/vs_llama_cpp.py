"""gptlite's generation beside llama.cpp's on the same model, exported with `gptlite export --format gguf`.

    python benchmarks/vs_llama_cpp.py [--shapes cpu gpt2 smollm2] [--new-tokens 200] [--repeats 3]

Needs llama-cpp-python (pip install -e ".[llama]"; it builds llama.cpp from
source). Random weights (speed only) in three shapes: the cpu preset's (4
layers, width 128, context 64, a 65-character vocabulary), GPT-2 small's (12
layers, width 768, 50,257 tokens) and SmolLM2-135M's (30 layers, width 576,
9 heads sharing 3 key/value heads, SwiGLU 1536, 49,152 tokens, written as
llama.cpp's `llama`). Each writes --new-tokens greedily at batch 1 after a
short prompt, within the context window (the cpu shape's 64 tokens hold 59
new ones). gptlite runs `gptlite.generate`; llama.cpp runs the f32, f16 and
q8_0 files through llama-cpp-python on 2 threads, each in a process of its
own; one that crashes is reported so, and run again without llama.cpp's
weight repacking (`llama-cli --no-repack`). "cold" is the first call (gptlite's
compiling, llama.cpp's loading included); the rate is the median of
--repeats calls after it.
"""

import argparse
import itertools
import json
import pathlib
import subprocess
import sys
import tempfile
import time

import keras

import gptlite

from children import time_calls
from gpt2_generate import gpt2_sized_tokenizer
from shapes import random_model

SHAPES = {
    "gpt2": dict(n_layer=12, n_head=12, n_embd=768, block_size=1024, bias=True),
    "smollm2": dict(n_layer=30, n_head=9, n_kv_head=3, n_embd=576, mlp_hidden_size=1536, block_size=2048,
                    position="rotary", norm="rms", mlp="swiglu", rope_theta=100000.0),
}
VOCABULARY_SIZES = {"gpt2": 50257, "smollm2": 49152}
OUTTYPES = ("f32", "f16", "q8_0")
PROMPT = "HELLO"  # in the cpu shape's 65 characters too


def model_of(shape):
    """A random-weight GPT of the shape; a large vocabulary's end token is never the likeliest (its row is zero)."""
    if shape == "cpu":
        return random_model("cpu")
    keras.utils.set_random_seed(0)
    size = VOCABULARY_SIZES[shape]
    tokenizer = gpt2_sized_tokenizer(size)
    model = gptlite.GPT(vocab_size=size, tokenizer=tokenizer, **SHAPES[shape])
    model.build((None, SHAPES[shape]["block_size"]))
    table = model.embedding.token_embedding.embeddings
    table.assign(keras.ops.where(keras.ops.arange(size)[:, None] == tokenizer.end_token_id, 0.0, table))
    return model


def open_llama_cpp(path, context, repack=True):
    """llama-cpp-python's Llama on 2 threads; `repack=False` keeps the weights as the file has them, as
    `llama-cli --no-repack` does (on machine D, llama.cpp 0.3.36 crashes on q8_0 weights it repacks)."""
    import llama_cpp

    defaults = llama_cpp.llama_cpp.llama_model_default_params

    def params():
        chosen = defaults()
        chosen.use_extra_bufts = repack
        return chosen

    llama_cpp.llama.llama_cpp.llama_model_default_params = params
    try:
        return llama_cpp.Llama(model_path=str(path), n_ctx=context, n_threads=2, verbose=False)
    finally:
        llama_cpp.llama.llama_cpp.llama_model_default_params = defaults


def llama_cpp_rate(path, prompt_ids, new_tokens, repeats, repack=True):
    """(cold seconds, median seconds) of llama.cpp writing `new_tokens` greedily, in this process."""
    start = time.perf_counter()
    llm = open_llama_cpp(path, len(prompt_ids) + new_tokens, repack)

    def run():
        return list(itertools.islice(llm.generate(prompt_ids, temp=0.0, top_k=1, reset=True), new_tokens))

    run()
    cold = time.perf_counter() - start
    _, seconds, _ = time_calls(run, repeats)
    return cold, seconds


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=["cpu", "gpt2", "smollm2"], choices=["cpu", *SHAPES])
    parser.add_argument("--new-tokens", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--child", nargs=4, metavar=("FILE", "PROMPT_IDS", "NEW", "REPACK"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        path, prompt_ids, new, repack = args.child
        print(json.dumps(llama_cpp_rate(path, json.loads(prompt_ids), int(new), args.repeats, repack == "repack")))
        return

    rows = []
    for shape in args.shapes:
        model = model_of(shape)
        prompt_ids = model.tokenizer.encode(PROMPT).tolist()
        new = min(args.new_tokens, model.config.block_size - len(prompt_ids))

        def ours():
            return gptlite.generate(model, PROMPT, max_new_tokens=new, temperature=0.0)

        cold, seconds, _ = time_calls(ours, args.repeats)
        rows.append((shape, "gptlite", "f32", new / seconds, cold, None))
        with tempfile.TemporaryDirectory() as folder:
            for outtype in OUTTYPES:
                path = pathlib.Path(folder) / f"{shape}-{outtype}.gguf"
                gptlite.export_gguf(model, path, outtype)
                for repack in ("repack", "no-repack"):
                    child = subprocess.run([sys.executable, __file__, "--repeats", str(args.repeats), "--child",
                                            str(path), json.dumps(prompt_ids), str(new), repack],
                                           capture_output=True, text=True, cwd=pathlib.Path(__file__).parent)
                    weights = outtype if repack == "repack" else f"{outtype}, no repack"
                    if child.returncode:
                        rows.append((shape, "llama.cpp", weights, None, None, path.stat().st_size))
                        continue  # crashed: the same file without repacking next
                    cold, seconds = json.loads(child.stdout.strip().splitlines()[-1])
                    rows.append((shape, "llama.cpp", weights, new / seconds, cold, path.stat().st_size))
                    break
        print(f"{shape}: {new} new tokens after a {len(prompt_ids)}-token prompt", flush=True)

    print("| shape | engine | weights | tokens/s (median) | cold, s | file, MiB |")
    print("|---|---|---|---:|---:|---:|")
    for shape, engine, weights, rate, cold, size in rows:
        rate = "crashed" if rate is None else f"{rate:,.1f}"
        cold = "" if cold is None else f"{cold:.1f}"
        size = "" if size is None else f"{size / 2**20:.1f}"
        print(f"| {shape} | {engine} | {weights} | {rate} | {cold} | {size} |")
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
