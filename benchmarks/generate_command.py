"""`python generate.py` as a user runs it, launch to exit: 20 tokens from a `cpu`-preset model (random weights),
beside nanoGPT's `sample.py` on a checkpoint of the same shape. Each process starts with HOME and XDG_CACHE_HOME in
a folder of its variant's: new and empty for a first run, the one that first run filled for later runs (a
command's compiled programs kept there). gptlite with no backend named (the backend the command chooses) and with
`--backend tensorflow`; rounds in turns, medians.

    python benchmarks/generate_command.py --nanogpt CHECKOUT [--rounds 3] [--later 2]

CHECKOUT is a checkout of karpathy/nanoGPT (its sample.py imports torch and tiktoken); it is copied, never written.
"""

import argparse
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import gptlite
from helpers import new_machine
from helpers.models import random_model

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent
PROMPT, NEW_TOKENS = "ROMEO:", 20

# nanoGPT's checkpoint of the cpu preset's shape (4 x 4 x 128, context 64, 65 characters), random weights, and the
# character table its sample.py reads for a `shakespeare_char` run.
NANOGPT_CHECKPOINT = r"""
import os, pickle, string, sys, torch
from model import GPT, GPTConfig
args = dict(n_layer=4, n_head=4, n_embd=128, block_size=64, bias=False, vocab_size=65, dropout=0.0)
torch.manual_seed(0)
model = GPT(GPTConfig(**args))
os.makedirs("out", exist_ok=True)
torch.save({"model": model.state_dict(), "model_args": args, "config": {"dataset": "shakespeare_char"}},
           "out/ckpt.pt")
characters = sorted(set(string.printable[:94] + " \n"))[:65]
os.makedirs("data/shakespeare_char", exist_ok=True)
with open("data/shakespeare_char/meta.pkl", "wb") as file:
    pickle.dump({"vocab_size": 65, "stoi": {c: i for i, c in enumerate(characters)},
                 "itos": {i: c for i, c in enumerate(characters)}}, file)
"""


def variants(model_path, nanogpt):
    """Each command: (name, argv, working folder, KERAS_BACKEND or None)."""
    generate = [sys.executable, str(REPO / "generate.py"), "--model", str(model_path), "--prompt", PROMPT,
                "--max-new-tokens", str(NEW_TOKENS)]
    sample = [sys.executable, "sample.py", "--out_dir=out", "--device=cpu", "--dtype=float32", "--compile=False",
              "--num_samples=1", f"--max_new_tokens={NEW_TOKENS}", f"--start={PROMPT}"]
    return [("gptlite, no backend named", generate, REPO), ("gptlite, --backend tensorflow",
            generate + ["--backend", "tensorflow"], REPO), ("nanoGPT sample.py", sample, nanogpt)]


def timed(argv, folder, home):
    environment = new_machine(home)
    environment.pop("KERAS_BACKEND", None)  # the command chooses, or its flag does
    started = time.perf_counter()
    done = subprocess.run(argv, cwd=folder, env=environment, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed:\n{done.stderr[-2000:]}")
    said = [line for line in done.stderr.splitlines() if line.startswith("backend:")]
    return seconds, said[0] if said else None


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nanogpt", type=pathlib.Path, required=True, help="a checkout of karpathy/nanoGPT")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--later", type=int, default=2, help="later runs after each first run")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        root = pathlib.Path(folder)
        gptlite.save(random_model("cpu"), root / "model.keras")
        nanogpt = root / "nanogpt"
        shutil.copytree(args.nanogpt, nanogpt, ignore=shutil.ignore_patterns(".git"))
        subprocess.run([sys.executable, "-c", NANOGPT_CHECKPOINT], cwd=nanogpt, check=True)
        commands = variants(root / "model.keras", nanogpt)
        first, later, said = {name: [] for name, *_ in commands}, {name: [] for name, *_ in commands}, {}
        for round_ in range(args.rounds):
            for index, (name, argv, working) in enumerate(commands):
                home = root / f"home-{round_}-{index}"
                seconds, said[name] = timed(argv, working, home)
                first[name].append(seconds)
                later[name].append(statistics.median(timed(argv, working, home)[0] for _ in range(args.later)))
            print(f"round {round_ + 1}: " + "; ".join(f"{name} {first[name][-1]:.2f} s first, {later[name][-1]:.2f} "
                                                      f"later" for name, *_ in commands), flush=True)
    print(f"# {NEW_TOKENS} tokens, launch to exit, medians of {args.rounds} rounds (later: each round's median of "
          f"{args.later})")
    nanogpt_later = statistics.median(later["nanoGPT sample.py"])
    for name, *_ in commands:
        print(f"{name}: first run {statistics.median(first[name]):.2f} s, later runs "
              f"{statistics.median(later[name]):.2f} s ({statistics.median(later[name]) / nanogpt_later:.2f}x "
              f"nanoGPT's){'; said: ' + said[name] if said.get(name) else ''}")


if __name__ == "__main__":
    main()
