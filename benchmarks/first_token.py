"""A fresh process's first answer: load a model.keras, stream 10 new tokens, on a cold and a warm compile cache.

    python benchmarks/first_token.py [--shape cpu|smallest|deeper|gpt2] [--rounds 3] [--tokens 10] [--code DIR]
                                     [--parts]

Each round runs two fresh processes as a new user's program would run on a
new machine: HOME and XDG_CACHE_HOME point into a new empty folder of the
round's, no compile cache is named (no GPTLITE_COMPILE_CACHE, TF_XLA_FLAGS
or JAX cache setting) and the program calls nothing but what README's "Use
it from Python" shows: Keras imported, then gptlite, `keras.saving.load_model`
and `gptlite.stream`. The first process finds the home folder empty (cold),
the second what the first left (warm). Each times its imports,
`load_model`, the first streamed piece and the whole generation of
--tokens tokens from "ROMEO:"; medians over the rounds.
The model has random weights: the `cpu` preset's shape (4 layers, width
128, context 64, 65 characters), 1 layer of width 8 (`smallest`), 8 layers
of width 128 (`deeper`) or GPT-2 small's (12 layers, width 768,
context 1024, 50,257 tokens: benchmarks/gpt2_generate.py's model). `--code
DIR` runs the gptlite found in DIR (a checkout of other code, to compare
side by side). `--parts`: where those seconds go, each decode program's
first run timed alone (the prefill's, then the decode loop's; gptlite
otherwise runs the loop's first run beside the prefill, see
`Compiled.prepare`), beside its second run. The report says what share of
the machine's CPU time was stolen meanwhile (see `helpers.stolen_share`).
"""

import argparse
import json
import pathlib
import statistics
import subprocess
import sys
import tempfile

from helpers import cpu_ticks, new_machine, stolen_share, with_code

REPO = pathlib.Path(__file__).resolve().parent.parent
CHARACTERS = "\n !$&',-.3:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
# The `cpu` preset's shape; one as small as a model gets and one twice as deep (what a program's first run costs
# besides its size, and for each layer); GPT-2 small's.
SHAPES = {"cpu": dict(n_layer=4, n_head=4, n_embd=128, block_size=64),
          "smallest": dict(n_layer=1, n_head=1, n_embd=8, block_size=64),
          "deeper": dict(n_layer=8, n_head=4, n_embd=128, block_size=64), "gpt2": None}

CHILD = """
import json, sys, time
started = time.perf_counter()
import keras
import gptlite
imported = time.perf_counter()
model = keras.saving.load_model(sys.argv[1])
loaded = time.perf_counter()
pieces = gptlite.stream(model, "ROMEO:", int(sys.argv[2]), temperature=1.0, seed=1)
next(pieces)
first = time.perf_counter()
for _ in pieces:
    pass
done = time.perf_counter()
print(json.dumps(dict(import_s=imported - started, load_s=loaded - imported, first_piece_s=first - loaded,
                      generate_s=done - loaded)))
"""


# The same, with each decode program's calls timed, and the loop's first run not started beside the prefill (it
# patches gptlite's own `Compiled`): also "<program>_first_s" and "<program>_second_s", its first two runs.
PARTS = CHILD.replace("import gptlite\n", """import gptlite
from gptlite.decode import compiled
compiled.Compiled.prepare = lambda self, *args: None
runs, call = {}, compiled.Compiled.__call__
def timed(self, *args):
    start = time.perf_counter()
    outputs = call(self, *args)
    runs.setdefault(self.name[0], []).append(time.perf_counter() - start)
    return outputs
compiled.Compiled.__call__ = timed
def parts():
    return {f"{name}_{which}_s": seconds for name, times in runs.items()
            for which, seconds in zip(["first", "second"], times)}
""").replace("generate_s=done - loaded)", "generate_s=done - loaded, **parts())")


def make_model(shape, folder):
    import gptlite

    if shape == "gpt2":
        from helpers.models import gpt2_sized_model

        model = gpt2_sized_model()
    else:
        model = gptlite.GPT(vocab_size=len(CHARACTERS), tokenizer=gptlite.CharTokenizer(CHARACTERS), **SHAPES[shape])
        model.build((None, model.config.block_size))
    path = pathlib.Path(folder) / f"{shape}.keras"
    gptlite.save(model, path)
    return path


def run(code, model, tokens, home, child=CHILD):
    """One fresh process with `home` for its home and cache folders; what it reports."""
    environment = with_code(dict(new_machine(home), TF_CPP_MIN_LOG_LEVEL="2"), code)
    result = subprocess.run([sys.executable, "-c", child, str(model), str(tokens)], env=environment,
                            capture_output=True, text=True, cwd=tempfile.gettempdir())
    if result.returncode:
        sys.exit(result.stderr[-3000:])
    return json.loads(result.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="cpu")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=10)
    parser.add_argument("--code", type=pathlib.Path, default=REPO)
    parser.add_argument("--parts", action="store_true", help="time each decode program's first run alone")
    args = parser.parse_args()
    child = PARTS if args.parts else CHILD
    started = cpu_ticks()
    with tempfile.TemporaryDirectory() as folder:
        model = make_model(args.shape, folder)
        results = {"cold": [], "warm": []}
        for round_index in range(args.rounds):
            home = pathlib.Path(folder) / f"home{round_index}"
            results["cold"].append(run(args.code, model, args.tokens, home, child))
            results["warm"].append(run(args.code, model, args.tokens, home, child))
    report = {"shape": args.shape, "tokens": args.tokens, "code": str(args.code), "parts": args.parts}
    for kind, runs in results.items():
        report[kind] = {name: round(statistics.median(run[name] for run in runs), 3) for name in runs[0]}
    report["stolen_share"] = stolen_share(started)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
