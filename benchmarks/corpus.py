"""Large-corpus handling: tokenization throughput and the training process's peak memory.

    python benchmarks/corpus.py [--size-mb 1024 | --code-mb 200 | --text FILE] [--work DIR] [--vocab-size 4096]
                                [--steps 100] [--bpe-only] [--library]

Builds a text of about --size-mb MB by repeating Tiny Shakespeare with its
lines in a different random order each time, or of --code-mb MB of the
Python sources installed with this Python (each file once, in path order;
text that repeats itself far less), both kept in DIR for reuse; or takes
--text. Then:
1. in this process, times learning a byte-level BPE vocabulary from the
   sample gptlite takes, and encoding the whole text with it into the token
   cache, and the same encoding with the character tokenizer (MB of text per
   second); with --library, also the BPE encoding by the tokenizers library
   alone (its parallel batch encoding of whole pieces, which gptlite's
   encoding must equal: the script checks);
2. runs `train.py BIG --tokenizer bpe` for --steps steps in a child process,
   from scratch (vocabulary, encoding, training, saving), and reports its
   wall time and peak resident memory (the child's maximum RSS).
"""

import argparse
import hashlib
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


def code_text(path, size_mb):
    """Write about size_mb MB of the Python files under this Python's prefix to `path`, unless it is there already."""
    if path.exists() and path.stat().st_size >= size_mb * 2**20:
        return path
    seen = set()
    written = 0
    with open(path, "w", encoding="utf-8") as file:
        for source in sorted((pathlib.Path(sys.prefix) / "lib").rglob("*.py")):
            try:
                text = source.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                continue
            digest = hashlib.sha256(text.encode()).digest()
            if digest in seen:
                continue
            seen.add(digest)
            file.write(text)
            written += len(text.encode())
            if written >= size_mb * 2**20:
                return path
    sys.exit(f"only {written / 2**20:.0f} MB of Python files under {sys.prefix}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=1024)
    parser.add_argument("--work", type=pathlib.Path, default=pathlib.Path(tempfile.gettempdir()) / "gptlite-corpus")
    parser.add_argument("--vocab-size", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--code-mb", type=int, help="measure on this many MB of Python sources instead")
    parser.add_argument("--text", type=pathlib.Path, help="measure on this file instead")
    parser.add_argument("--bpe-only", action="store_true", help="measure the BPE vocabulary and encoding only")
    parser.add_argument("--library", action="store_true",
                        help="also time BPE encoding by the tokenizers library alone, and compare the ids")
    args = parser.parse_args()

    from gptlite.data import lm
    from gptlite.text.bpe import BPETokenizer
    from gptlite.text.tokenizers import CharTokenizer

    args.work.mkdir(parents=True, exist_ok=True)
    if args.text:
        path = args.text
    elif args.code_mb:
        path = code_text(args.work / f"python-{args.code_mb}mb.txt", args.code_mb)
    else:
        path = big_text(args.work / f"shakespeare-{args.size_mb}mb.txt", args.size_mb)
    megabytes = path.stat().st_size / 2**20
    print(f"text: {path} ({megabytes:,.0f} MB)", flush=True)
    corpus = lm.Corpus.from_files([path])

    start = time.perf_counter()
    bpe = BPETokenizer.train(corpus.sample(lm.BPE_SAMPLE_BYTES), args.vocab_size)
    print(f"BPE vocabulary ({bpe.vocabulary_size} tokens) from a {lm.BPE_SAMPLE_BYTES // 2**20} MB sample: "
          f"{time.perf_counter() - start:.1f} s", flush=True)
    tokenizers = [("BPE", bpe)]
    if args.library:
        library = BPETokenizer(bpe.definition)
        library._known_ids = None  # what the tokenizer does with a definition it cannot cut into parts
        tokenizers.append(("BPE, the library alone", library))
    if not args.bpe_only:
        tokenizers.append(("char", CharTokenizer.from_texts(corpus.pieces())))
    first_ids = None
    for index, (name, tokenizer) in enumerate(tokenizers):
        cache = args.work / f"cache-{index}"
        shutil.rmtree(cache, ignore_errors=True)
        start = time.perf_counter()
        ids = lm.encode_corpus(corpus, tokenizer, cache)
        seconds = time.perf_counter() - start
        print(f"{name} encoding: {megabytes / seconds:.1f} MB/s ({seconds:.1f} s, {len(ids):,} tokens, "
              f"{ids.dtype})", flush=True)
        if first_ids is None:
            first_ids = ids
        elif name.startswith("BPE"):
            if not np.array_equal(first_ids, ids):
                sys.exit("the library's ids differ from gptlite's")
            print("  the same ids as gptlite's", flush=True)
        del ids
        shutil.rmtree(cache)
    # Unmapped before the child starts: it begins as a copy of this process, and its peak would count them.
    del first_ids

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
