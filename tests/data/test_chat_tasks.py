import re

import pytest

import gptlite
from gptlite.data import CHAT_SYNTHETIC_TASKS, chat_tasks

pytestmark = pytest.mark.once("the tasks' conversations are plain Python")

COUNT = 3000  # training conversations drawn here: enough to meet most items, quick to make


def _sum_of(question):
    """(a, op, b) of a sum's question, in any of its phrasings."""
    a, b = (int(number) for number in re.findall(r"\d+", question)[:2])
    if question.startswith("Subtract"):  # "Subtract b from a."
        a, b = b, a
    subtracts = any(words in question for words in (" - ", "minus", "take away", "Subtract"))
    return a, "-" if subtracts else "+", b


def _item(task, messages, answer):
    """What a question is about, the thing held out: a sum, a code, a word."""
    if task in ("arithmetic", "direct"):
        return _sum_of(messages[-1]["content"])
    return answer[::-1] if task == "backwards" else answer


def _asked(task, conversation):
    """Each (messages up to a question, its answer) of a training conversation."""
    for index, message in enumerate(conversation):
        if message["role"] == "assistant" and conversation[index - 1]["role"] == "user":
            if task != "recall" or conversation[index - 1]["content"] in chat_tasks._RECALL:
                yield conversation[:index], message["content"]


@pytest.mark.parametrize("task", CHAT_SYNTHETIC_TASKS)
def test_held_out_questions_are_never_asked_in_training_and_are_the_same_for_every_seed(task):
    made, other = chat_tasks.synthetic(task, seed=1, count=COUNT), chat_tasks.synthetic(task, seed=2, count=COUNT)
    assert made.held_out == other.held_out and len(made.held_out) == chat_tasks.HELD_OUT_QUESTIONS
    assert made.conversations != other.conversations
    held = {_item(task, messages, answer) for messages, answer in made.held_out}
    assert len(held) == chat_tasks.HELD_OUT_QUESTIONS  # every held-out question is about an item of its own
    trained = {_item(task, messages, answer) for conversation in made.conversations + other.conversations
               for messages, answer in _asked(task, conversation)}
    assert len(trained) > 1000 and not held & trained


@pytest.mark.parametrize("task", CHAT_SYNTHETIC_TASKS)
def test_every_answer_is_right(task):
    made = chat_tasks.synthetic(task, seed=3, count=300)
    asked = [pair for conversation in made.conversations for pair in _asked(task, conversation)] + made.held_out
    for messages, answer in asked:
        question = messages[-1]["content"]
        if task in ("arithmetic", "direct"):
            a, op, b = _sum_of(question)
            result = a - b if op == "-" else a + b
            assert answer == (str(result) if task == "direct" else f"{a} {op} {b} = {result}"), (question, answer)
        elif task == "recall":
            given = next(message["content"] for message in messages if message["role"] == "user")
            assert re.search(r"\d{4}", given).group() == answer
        else:
            # The made-up word, where a phrasing puts it ("Spell {word} in reverse.").
            phrasings = chat_tasks._REVERSE if task == "backwards" else chat_tasks._COPY
            word = next(found.group(1) for found in (re.fullmatch(re.escape(phrasing).replace(
                re.escape("{word}"), "([a-z]+)"), question) for phrasing in phrasings) if found)
            assert answer == (word[::-1] if task == "backwards" else word), (question, answer)


def test_an_unknown_task_is_refused():
    with pytest.raises(gptlite.ConfigError, match="arithmetic, direct, recall, copy, backwards"):
        chat_tasks.synthetic("poetry")
