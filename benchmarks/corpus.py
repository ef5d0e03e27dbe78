"""Large-corpus handling: tokenization throughput and the training process's peak memory.

    python benchmarks/corpus.py [--size-mb 1024] [--work DIR] [--vocab-size 4096] [--steps 100] [--bpe-only]

Builds a text of about --size-mb MB by repeating Tiny Shakespeare with its
lines in a different random order each time (kept in DIR for reuse), then:
1. in this process, times learning a byte-level BPE vocabulary from the
   sample gptlite takes, and encoding the whole text with it into the token
   cache, and the same encoding with the character tokenizer (MB of text per
   second);
2. runs `train.py BIG --tokenizer bpe` for --steps steps in a child process,
   from scratch (vocabulary, encoding, training, saving), and reports its
   wall time and peak resident memory (the child's maximum RSS).
"""

import argparse
import pathlib
import resource
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
SHAKESPEARE = HERE.parents[1] / "shared" / "data" / "tinyshakespeare.txt"


def big_text(path, size_mb, seed=0):
    """Write about size_mb MB of shuffled Tiny Shakespeare to `path`, unless it is there already."""
    if path.exists() and path.stat().st_size >= size_mb * 2**20 * 0.99:
        return path
    lines = SHAKESPEARE.read_text().splitlines(keepends=True)
    rng = np.random.default_rng(seed)
    written = 0
    with open(path, "w") as file:
        while written < size_mb * 2**20:
            chunk = "".join(lines[i] for i in rng.permutation(len(lines)))
            file.write(chunk)
            written += len(chunk)
    return path


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=1024)
    parser.add_argument("--work", type=pathlib.Path, default=pathlib.Path(tempfile.gettempdir()) / "gptlite-corpus")
    parser.add_argument("--vocab-size", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--bpe-only", action="store_true", help="measure the BPE vocabulary and encoding only")
    args = parser.parse_args()

    from gptlite import data
    from gptlite.tokenizers import BPETokenizer, CharTokenizer

    args.work.mkdir(parents=True, exist_ok=True)
    path = big_text(args.work / f"shakespeare-{args.size_mb}mb.txt", args.size_mb)
    megabytes = path.stat().st_size / 2**20
    print(f"text: {path} ({megabytes:,.0f} MB)", flush=True)
    corpus = data.Corpus.from_files([path])

    start = time.perf_counter()
    bpe = BPETokenizer.train(corpus.sample(data.BPE_SAMPLE_BYTES), args.vocab_size)
    print(f"BPE vocabulary ({bpe.vocabulary_size} tokens) from a {data.BPE_SAMPLE_BYTES // 2**20} MB sample: "
          f"{time.perf_counter() - start:.1f} s", flush=True)
    tokenizers = [("BPE", bpe)] + ([] if args.bpe_only else [("char", CharTokenizer.from_text(SHAKESPEARE.read_text()))])
    for name, tokenizer in tokenizers:
        cache = args.work / f"cache-{name}"
        shutil.rmtree(cache, ignore_errors=True)
        start = time.perf_counter()
        ids = data.encode_corpus(corpus, tokenizer, cache)
        seconds = time.perf_counter() - start
        print(f"{name} encoding: {megabytes / seconds:.1f} MB/s ({seconds:.1f} s, {len(ids):,} tokens, "
              f"{ids.dtype})", flush=True)
        del ids
        shutil.rmtree(cache)

    if args.bpe_only:
        return
    out = args.work / "run"
    shutil.rmtree(out, ignore_errors=True)
    command = [sys.executable, str(HERE.parent / "train.py"), str(path), "--tokenizer", "bpe",
               "--vocab-size", str(args.vocab_size), "--max-iters", str(args.steps), "--warmup-iters", "10",
               "--eval-interval", str(args.steps), "--checkpoint-interval", str(args.steps), "--out", str(out)]
    start = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if result.returncode:
        sys.exit(f"train.py failed:\n{result.stderr[-3000:]}")
    peak_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(f"train.py on it, from scratch, {args.steps} steps: {seconds:.0f} s, peak resident memory "
          f"{peak_mb:,.0f} MB", flush=True)
    shutil.rmtree(out)


if __name__ == "__main__":
    main()
