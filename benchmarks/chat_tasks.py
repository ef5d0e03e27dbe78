"""The synthetic chat tasks, each learned from scratch with `--task chat`'s defaults: training time and exact
answers to its held-out questions through the server.

    python benchmarks/chat_tasks.py [--tasks arithmetic direct recall copy backwards] [--out runs/tasks]
                                    [--init-from MODEL | --pretrain STEPS [--pretrain-tokenizer bpe]
                                                          [--pretrain-dropout X]]
                                    [-- TRAIN FLAGS ...]

For each task, `python -m gptlite train --synthetic TASK` trains a new model
with no other flag but those after `--` (so: the settings sized from the
task's conversations), or fine-tunes MODEL with `--init-from` (LoRA where the
flags after `--` say `--lora-rank`); the wall time of the whole command is
reported (its output is kept in the task's folder, `train.log`), with the
settings it chose and the share of held-out questions
answered exactly at each evaluation (its history). `--pretrain STEPS`
first trains the base to fine-tune: a GPT of the chat defaults' shape (the
`modern` preset, context 128) trained for STEPS steps on Tiny Shakespeare
(`../shared/data/tinyshakespeare.txt`), one character a token unless
`--pretrain-tokenizer bpe` (the digit tasks need it: the play has no digits
but 3), with dropout X (`--pretrain-dropout`, default 0); the model kept is
the one of its best validation loss. Its time is reported apart. Then
`gptlite serve` serves the model in a process of its own and, once it says
it is ready, each of the task's 300 held-out questions is asked through
/v1/chat/completions with greedy decoding (temperature 0), eight at a time:
the answers exactly right (spaces around them aside) are counted.
"""

import argparse
import csv
import json
import pathlib
import re
import sys
import tempfile

from helpers import free_port, in_threads, run_training, start_server

REPO = pathlib.Path(__file__).resolve().parent.parent


def main():
    arguments = sys.argv[1:]
    extra = arguments[arguments.index("--") + 1:] if "--" in arguments else []
    arguments = arguments[:arguments.index("--")] if "--" in arguments else arguments
    from gptlite.data import CHAT_SYNTHETIC_TASKS, chat_tasks

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", nargs="+", choices=CHAT_SYNTHETIC_TASKS, default=list(CHAT_SYNTHETIC_TASKS))
    parser.add_argument("--out", type=pathlib.Path, default=None)
    parser.add_argument("--init-from", default=None)
    parser.add_argument("--pretrain", type=int, default=None, metavar="STEPS")
    parser.add_argument("--pretrain-tokenizer", choices=("char", "bpe"), default="char")
    parser.add_argument("--pretrain-dropout", type=float, default=0.0, metavar="X")
    args = parser.parse_args(arguments)
    if args.pretrain and args.init_from:
        parser.error("--pretrain trains the model to start from: leave out --init-from")
    import httpx

    report = {}
    with tempfile.TemporaryDirectory() as folder:
        if args.pretrain:
            base = (args.out or pathlib.Path(folder)) / "pretrained"
            text = REPO.parent / "shared" / "data" / "tinyshakespeare.txt"
            command = [sys.executable, "-m", "gptlite", "train", str(text), "--preset", "modern", "--block-size",
                       "128", "--max-iters", str(args.pretrain), "--tokenizer", args.pretrain_tokenizer,
                       "--dropout", str(args.pretrain_dropout), "--out", str(base), "--overwrite"]
            result, trained_s = run_training(command)
            report["pretrained"] = {"trained_s": round(trained_s, 1),
                                    "command": " ".join(command[1:]),
                                    "last_line": result.stdout.strip().splitlines()[-1]}
            print(json.dumps(report), flush=True)
            args.init_from = str(base / "model.keras")
        for task in args.tasks:
            out = (args.out or pathlib.Path(folder)) / task
            command = [sys.executable, "-m", "gptlite", "train", "--synthetic", task, "--out", str(out),
                       "--overwrite", *(["--init-from", args.init_from] if args.init_from else []), *extra]
            result, trained_s = run_training(command)
            (out / "train.log").write_text(result.stdout)  # what the command said, kept beside its model
            chosen = next((line for line in result.stdout.splitlines() if line.startswith("chat settings")), None)
            final = re.search(r"answers ([\d,]+) of ([\d,]+) held-out", result.stdout)
            port = free_port()
            process, ready_s, _ = start_server(out / "model.keras", port, 8, 64, pathlib.Path(folder) / "cache")
            url = f"http://127.0.0.1:{port}/v1/chat/completions"
            try:
                questions = chat_tasks.synthetic(task).held_out  # the same for every run
                right = [0]

                def ask(number):
                    with httpx.Client(timeout=120) as http:
                        for messages, answer in questions[number::8]:
                            response = http.post(url, json={"messages": messages, "temperature": 0,
                                                            "max_tokens": 24})
                            response.raise_for_status()
                            right[0] += response.json()["choices"][0]["message"]["content"].strip() == answer

                in_threads(ask, 8)
            finally:
                process.terminate()
                process.wait(timeout=60)
            report[task] = {"trained_s": round(trained_s, 1), "chosen": chosen,
                            "exact_through_server": f"{right[0]} of {len(questions)}",
                            "exact_share": round(right[0] / len(questions), 4),
                            "train_py_said": final and final.group(0),
                            "exact_by_step": _exact_by_step(out / "history.csv")}
            print(json.dumps({task: report[task]}), flush=True)
    print(json.dumps(report, indent=1))


def _exact_by_step(path):
    """{step: the share of held-out questions exact at that evaluation}, from a run's history."""
    with open(path, newline="") as file:
        return {int(row["step"]): float(row["exact_answers"]) for row in csv.DictReader(file)
                if row.get("exact_answers")}


if __name__ == "__main__":
    main()
