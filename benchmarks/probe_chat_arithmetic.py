"""The synthetic arithmetic chat task from scratch: training time, exact answers through the server, first chunk.

    python benchmarks/probe_chat_arithmetic.py [--out runs/arithmetic] [--max-iters N] [--turns 20]

Trains a new model with `python -m gptlite train --synthetic arithmetic`
(its default settings unless --max-iters says) and reports the wall time of
the whole command. Then serves the model with `gptlite serve` in a process
of its own and, once it has compiled, asks each of the task's 300 held-out
questions through /v1/chat/completions with greedy decoding (temperature 0),
eight at a time, counting the answers that are exactly right. Last, on that
warm server, --turns streamed chat turns of 50 new tokens one after another
(a conversation of a system message and a question; the answer may end at
its end of turn first): the seconds from sending each request to its first
chunk with text, median and worst.
"""

import argparse
import json
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

from helpers import free_port, in_threads, start_server

REPO = pathlib.Path(__file__).resolve().parent.parent


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path, default=None)
    parser.add_argument("--max-iters", type=int, default=None)
    parser.add_argument("--turns", type=int, default=20)
    args = parser.parse_args()
    import httpx

    from gptlite.data import chat_tasks

    with tempfile.TemporaryDirectory() as folder:
        out = args.out or pathlib.Path(folder) / "arithmetic"
        command = [sys.executable, "-m", "gptlite", "train", "--synthetic", "arithmetic", "--out", str(out),
                   "--overwrite"] + (["--max-iters", str(args.max_iters)] if args.max_iters else [])
        started = time.perf_counter()
        subprocess.run(command, check=True, cwd=REPO)
        trained_s = time.perf_counter() - started
        port = free_port()
        process, ready_s, compiled_s = start_server(out / "model.keras", port, 8, 64, pathlib.Path(folder) / "cache")
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        try:
            questions = chat_tasks.synthetic("arithmetic").held_out  # the same for every run
            right = [0]

            def ask(number):
                with httpx.Client(timeout=120) as http:
                    for messages, answer in questions[number::8]:
                        response = http.post(url, json={"messages": messages, "temperature": 0, "max_tokens": 16})
                        response.raise_for_status()
                        right[0] += response.json()["choices"][0]["message"]["content"].strip() == answer

            asked_s = in_threads(ask, 8)
            first_chunks = []
            with httpx.Client(timeout=120) as http:
                for turn in range(args.turns):
                    body = {"messages": [{"role": "system", "content": "Be brief."},
                                         {"role": "user", "content": f"What is {turn} plus {2 * turn}?"}],
                            "max_tokens": 50, "temperature": 1.0, "stream": True}
                    sent = time.perf_counter()
                    with http.stream("POST", url, json=body) as response:
                        lines = response.iter_lines()
                        for line in lines:
                            if line.startswith("data: {") and json.loads(line[6:])["choices"][0]["delta"].get(
                                    "content"):
                                first_chunks.append(time.perf_counter() - sent)
                                break
                        for _ in lines:  # the rest of the answer
                            pass
        finally:
            process.terminate()
            process.wait(timeout=60)
    print(json.dumps({"train_s": round(trained_s, 1), "exact_answers": right[0], "questions": len(questions),
                      "asking_s": round(asked_s, 1), "server_ready_s": round(ready_s, 1),
                      "server_compiled_s": round(compiled_s, 1),
                      "first_chunk_s": {"median": round(statistics.median(first_chunks), 3),
                                        "max": round(max(first_chunks), 3), "turns": len(first_chunks)}}, indent=1))


if __name__ == "__main__":
    main()
