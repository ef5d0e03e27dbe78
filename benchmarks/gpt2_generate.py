"""Generation with a GPT-2 small (124M) shape: gptlite beside transformers' and KerasHub's `generate`, same weights.

    python benchmarks/gpt2_generate.py [--new-tokens 200] [--repeats 3]

One set of random weights (speed only) in GPT-2 small's shape (12 layers, 12
heads, width 768, context 1024, 50,257 tokens) is built in gptlite, exported
with `gptlite export --format hf` and `--format kerashub`, and loaded by
transformers (`GPT2LMHeadModel`, eager torch, its key/value cache on) and by
keras-hub (`GPT2CausalLM`, XLA on). Each decodes --new-tokens greedily after a
5-token prompt, at batch 1. The end token's embedding is zeroed so that no
run ends early. "cold" is the first call (compiling included); the rate is
the median of --repeats calls after it. The three continuations are checked
to be the same text.
"""

import argparse
import json
import pathlib
import tempfile

import numpy as np

import gptlite
from gptlite.weights import gpt2, pretrained

from helpers import time_calls
from helpers.models import gpt2_sized_model



def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--new-tokens", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    import keras_hub
    import torch
    import transformers

    model = gpt2_sized_model()
    tokenizer = model.tokenizer
    prompt = "Hello"
    prompt_ids = tokenizer.encode(prompt).astype("int64")
    new = args.new_tokens

    with tempfile.TemporaryDirectory() as folder:
        folder = pathlib.Path(folder)
        pretrained.export_hugging_face(model, folder / "hf")
        gpt2.export_kerashub(model, folder / "hub")
        hf_model = transformers.GPT2LMHeadModel.from_pretrained(folder / "hf").eval()
        hub_model = keras_hub.models.GPT2CausalLM.from_preset(str(folder / "hub"), preprocessor=None)
    hub_model.compile(sampler="greedy", jit_compile=True)
    torch.set_num_threads(torch.get_num_threads())

    def ours():
        return gptlite.generate(model, prompt, max_new_tokens=new, temperature=0.0)[len(prompt):]

    def theirs_transformers():
        with torch.no_grad():
            out = hf_model.generate(torch.tensor(prompt_ids[None]), max_new_tokens=new, min_new_tokens=new,
                                    do_sample=False, use_cache=True, pad_token_id=0)
        return tokenizer.decode(out[0, len(prompt_ids):].tolist())

    token_ids = np.zeros((1, len(prompt_ids) + new), "int32")
    padding_mask = np.zeros_like(token_ids, dtype=bool)
    token_ids[0, :len(prompt_ids)], padding_mask[0, :len(prompt_ids)] = prompt_ids, True

    def theirs_kerashub():
        out = hub_model.generate({"token_ids": token_ids, "padding_mask": padding_mask}, stop_token_ids=None)
        return tokenizer.decode(out["token_ids"][0, len(prompt_ids):])

    results = {name: time_calls(run, args.repeats) for name, run in
               (("gptlite", ours), ("transformers", theirs_transformers), ("KerasHub", theirs_kerashub))}
    same = len({text for _, _, text in results.values()}) == 1
    print(f"GPT-2 124M shape, batch 1, {new} new tokens after a {len(prompt_ids)}-token prompt, greedy; "
          f"the three continuations {'are the same' if same else 'DIFFER'}")
    print("| library | tokens/s (median) | cold, s |")
    print("|---|---:|---:|")
    for name, (cold, seconds, _) in results.items():
        print(f"| {name} | {new / seconds:,.1f} | {cold:.1f} |")
    print(json.dumps({name: new / seconds for name, (_, seconds, _) in results.items()}))


if __name__ == "__main__":
    main()
