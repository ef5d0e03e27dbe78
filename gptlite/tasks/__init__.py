"""The kinds of run, one `Task` each: a language model on text (`language`), a GPT on conversations (`chat`), an
encoder-decoder on source/target pairs (`pairs`). A task owns what differs between them: reading its data, its
new model, its batches and loss mask, its scores, what a run samples, what the commands and the server may be
given for its models; `task.py` says which task a run or a model is.

Nothing here imports Keras: the command line reads the choices below before it starts a backend.
"""

import importlib

# What a run trains, by the value of its `task` setting: (the module of tasks/, the `Task` class, what it trains,
# for the commands' help). A new kind of run is one class in tasks/ and one line here.
TASKS = {
    "lm": ("language", "LanguageModel", "a GPT that continues text (the default)"),
    "seq2seq": ("pairs", "Pairs", "an encoder-decoder that learns to write each line's target from its source"),
    "chat": ("chat", "Chat", "a GPT that answers, trained on a JSON Lines file of conversations (see docs/chat.md)"),
}


def task_named(name):
    """The `Task` that the `task` setting `name` names (one of TASKS)."""
    module, class_name, _ = TASKS[name]
    return getattr(importlib.import_module(f"gptlite.tasks.{module}"), class_name)()


def every_task():
    """One of each `Task`, in TASKS's order."""
    return [task_named(name) for name in TASKS]
