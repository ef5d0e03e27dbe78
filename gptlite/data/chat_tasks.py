"""Synthetic conversation tasks: chats to learn from scratch on a laptop, and a family of shapes on which to
measure what a recipe learns (`python train.py --synthetic NAME`).

    made = chat_tasks.synthetic("backwards", seed=1)
    made.conversations      # the training conversations: [[{"role": ..., "content": ...}, ...], ...]
    made.held_out           # [(messages, answer)]: questions never asked in training, the same for every seed

The family (each question is answered in one message):

- arithmetic: add or subtract whole numbers from 0 to 99, in six phrasings
  each; the answer restates the question before its result ("12 + 34 = 46"),
  so the model works beside its operands.
- direct: the same questions, answered with the result alone ("46"): the
  model must carry the operands in its head.
- recall: the first turn gives a four-digit code, another question may come
  between, and the last asks for the code back: the answer depends on an
  earlier turn of the conversation.
- copy: a made-up word of 3 to 8 letters, to be written back.
- backwards: a made-up word, to be written back reversed (the seq2seq
  tasks have a `reverse` of their own).

Every task holds out HELD_OUT_QUESTIONS items (number pairs, codes or words)
drawn with HELD_OUT_SEED, whatever a run's seed, so that every run and
`gptlite eval` hold out the same, and none of them is ever asked in
training; `seed` draws the training conversations. Some conversations open
with a system message, and some (but recall's) ask twice.
"""

import dataclasses
import string

import numpy as np

from gptlite.data import CHAT_SYNTHETIC_TASKS
from gptlite.errors import ConfigError

HELD_OUT_QUESTIONS = 300
HELD_OUT_SEED = 0
SYNTHETIC_CONVERSATIONS = 20_000
_SYSTEM = ("You are a calculator.", "Answer exactly.", "Be brief.")
_SUMS = {
    "+": ("What is {a} plus {b}?", "What's {a} + {b}?", "Add {a} and {b}.", "Compute {a} + {b}.",
          "How much is {a} and {b} together?", "{a} + {b} = ?"),
    "-": ("What is {a} minus {b}?", "What's {a} - {b}?", "Subtract {b} from {a}.", "Compute {a} - {b}.",
          "How much is {a} take away {b}?", "{a} - {b} = ?"),
}
_REMEMBER = ("Remember this code: {code}.", "My code is {code}; keep it in mind.", "Please note the code {code}.",
             "The code for today is {code}.")
_NOTED = ("Noted.", "Got it.", "I will remember it.", "OK.")
_RECALL = ("What was the code?", "Which code did I give you?", "Tell me the code again.", "What is my code?")
_COPY = ("Repeat after me: {word}", "Say {word}.", "Write the word {word}.", "Copy this: {word}")
_REVERSE = ("Reverse {word}.", "Write {word} backwards.", "Spell {word} in reverse.", "What is {word} reversed?")


@dataclasses.dataclass
class SyntheticChats:
    """A task's training conversations and held-out questions with their exact answers."""

    conversations: list
    held_out: list  # [(messages, answer)]


def _sums():
    return [(a, op, b) for op in "+-" for a in range(100) for b in range(100) if op == "+" or a >= b]


def _codes():
    return [f"{code:04d}" for code in range(10_000)]


def _words():
    # Made-up words: lowercase letters, 3 to 8 of them, drawn once (the same list for every run).
    random = np.random.default_rng(12_345)
    letters = np.array(list(string.ascii_lowercase))
    words = {"".join(random.choice(letters, size=random.integers(3, 9))) for _ in range(30_000)}
    return sorted(words)


def _sum_question(random, problem, restated):
    a, op, b = problem
    phrasing = _SUMS[op][random.integers(len(_SUMS[op]))]
    result = a + b if op == "+" else a - b
    return [{"role": "user", "content": phrasing.format(a=a, b=b)}], (f"{a} {op} {b} = {result}" if restated
                                                                        else str(result))


def _recall_question(random, code, filler):
    """The code given, maybe a sum asked between, then the code asked for."""
    messages = [{"role": "user", "content": _REMEMBER[random.integers(len(_REMEMBER))].format(code=code)},
                {"role": "assistant", "content": _NOTED[random.integers(len(_NOTED))]}]
    if random.random() < 0.5:
        asked, answer = _sum_question(random, filler[random.integers(len(filler))], restated=False)
        messages += [*asked, {"role": "assistant", "content": answer}]
    return messages + [{"role": "user", "content": _RECALL[random.integers(len(_RECALL))]}], code


def _word_question(phrasings, reverse):
    def ask(random, word, filler=None):
        asked = phrasings[random.integers(len(phrasings))].format(word=word)
        return [{"role": "user", "content": asked}], word[::-1] if reverse else word

    return ask


# Each task: its items, how a question about an item is asked -> (messages up to the question, its answer),
# and whether a conversation may ask twice (recall's already has two or three turns).
_TASKS = {
    "arithmetic": (_sums, lambda random, item, filler=None: _sum_question(random, item, restated=True), True),
    "direct": (_sums, lambda random, item, filler=None: _sum_question(random, item, restated=False), True),
    "recall": (_codes, _recall_question, False),
    "copy": (_words, _word_question(_COPY, reverse=False), True),
    "backwards": (_words, _word_question(_REVERSE, reverse=True), True),
}
assert tuple(_TASKS) == tuple(CHAT_SYNTHETIC_TASKS), "the tasks are named in gptlite.data too"


def synthetic(task, seed=0, count=SYNTHETIC_CONVERSATIONS, held_out=HELD_OUT_QUESTIONS):
    """The task's training conversations (`count`, drawn with `seed`) and its held-out questions (see the
    module's docstring)."""
    if task not in _TASKS:
        raise ConfigError(f"the synthetic conversation tasks are {', '.join(CHAT_SYNTHETIC_TASKS)}; got {task!r}")
    items, ask, twice = _TASKS[task]
    items = items()
    random = np.random.default_rng(HELD_OUT_SEED)
    order = random.permutation(len(items))
    held = [items[i] for i in order[:held_out]]
    kept = [items[i] for i in order[held_out:]]
    filler = _sums()  # recall's questions between: any sum (the code is what is held out)
    held_out_questions = [ask(random, item, filler) for item in held]
    random = np.random.default_rng(seed)
    conversations = []
    for _ in range(count):
        messages = [{"role": "system", "content": _SYSTEM[random.integers(len(_SYSTEM))]}] \
            if random.random() < 0.3 else []
        for _ in range(1 if random.random() < 0.7 or not twice else 2):
            asked, answer = ask(random, kept[random.integers(len(kept))], filler)
            messages += [*asked, {"role": "assistant", "content": answer}]
        conversations.append(messages)
    return SyntheticChats(conversations, held_out_questions)
