"""A conversations file of a shape gptlite's synthetic tasks do not have, trained on as a user would: `python
train.py FILE --task chat` with no other flag, and the end-of-run count of held-out questions answered exactly.

    python benchmarks/chat_file.py [--out runs/sentences] [--conversations 30000] [--seed 0] [-- TRAIN FLAGS ...]

The file (`chats.jsonl` in OUT) holds questions about two whole numbers
from 10 to 99, added or subtracted, in eight phrasings that none of
`gptlite.data.chat_tasks` uses, each answered in one sentence of its own wording
that gives the result alone ("Take 12 away from 57." -> "That leaves 45.");
some conversations open with a system message. `held_out.jsonl` holds 300
more, about number pairs that never appear in the file, given to the run as
`--val-file`, so that the count at the end is of questions never trained
on. The training command's wall time, what it chose and its last lines are
printed; its whole output is kept in OUT/train.log (a failed run ends the
benchmark with its output's end).
"""

import argparse
import json
import pathlib
import sys

import numpy as np

from helpers import run_training

HELD_OUT = 300
# A question and the sentence that answers it, for each way of asking.
ADD = (("Please tell me the sum of {a} and {b}.", "The sum is {r}."),
       ("{a} plus {b} equals what?", "It equals {r}."),
       ("What do you get when you add {b} to {a}?", "You get {r}."),
       ("I had {a} coins and found {b} more. How many do I have now?", "You have {r} coins now."))
SUBTRACT = (("Take {b} away from {a}.", "That leaves {r}."),
            ("What is the difference between {a} and {b}?", "The difference is {r}."),
            ("If I have {a} apples and eat {b}, how many are left?", "{r} apples are left."),
            ("Calculate {a} minus {b}, please.", "The result is {r}."))
SYSTEM = ("You answer arithmetic questions in one sentence.", "Be concise.")


def conversation(random, a, op, b):
    asked, answered = (ADD if op == "+" else SUBTRACT)[random.integers(4)]
    result = a + b if op == "+" else a - b
    messages = [{"role": "system", "content": SYSTEM[random.integers(len(SYSTEM))]}] if random.random() < 0.2 else []
    return messages + [{"role": "user", "content": asked.format(a=a, b=b)},
                       {"role": "assistant", "content": answered.format(r=result)}]


def write_files(out, count, seed):
    problems = [(a, op, b) for op in "+-" for a in range(10, 100) for b in range(10, 100) if op == "+" or a >= b]
    random = np.random.default_rng(seed)
    order = random.permutation(len(problems))
    held, kept = order[:HELD_OUT], order[HELD_OUT:]
    with open(out / "held_out.jsonl", "w") as file:
        for index in held:
            file.write(json.dumps({"messages": conversation(random, *problems[index])}) + "\n")
    with open(out / "chats.jsonl", "w") as file:
        for index in random.choice(kept, size=count):
            file.write(json.dumps({"messages": conversation(random, *problems[index])}) + "\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("runs/sentences"))
    parser.add_argument("--conversations", type=int, default=30_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("train_flags", nargs="*")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    write_files(args.out, args.conversations, args.seed)
    command = [sys.executable, "-m", "gptlite", "train", str(args.out / "chats.jsonl"), "--task", "chat",
               "--val-file", str(args.out / "held_out.jsonl"), "--out", str(args.out / "run"), "--overwrite",
               *args.train_flags]
    result, seconds = run_training(command)
    (args.out / "train.log").write_text(result.stdout + result.stderr)
    lines = result.stdout.splitlines()
    print(" ".join(command[1:]))
    print(f"{seconds:.1f} s launch to exit")
    print("\n".join(line for line in lines if line.startswith("chat settings") or "exact" in line))


if __name__ == "__main__":
    main()
