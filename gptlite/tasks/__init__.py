"""The kinds of run, one `Task` each: a language model on text (`language`), a GPT on conversations (`chat`), an
encoder-decoder on source/target pairs (`pairs`). A task owns what differs between them: reading its data, its
new model, its batches and loss mask, its scores, what a run samples, what the commands and the server may be
given for its models; `task.py` says which task a run or a model is.

Nothing here imports Keras: the command line reads the choices below before it starts a backend.
"""

import importlib
import typing


class Declared(typing.NamedTuple):
    """A kind of run as TASKS declares it: the module of tasks/ and its `Task` class; what it trains, for the
    commands' help; the settings of a preset of its own, named as the task (`training.settings.PRESETS` holds it),
    where its models train with other settings than a language model's; the settings each of the task's synthetic
    tasks trains with over its default preset, where one takes other than the preset's."""

    module: str
    class_name: str
    trains: str
    preset: dict = None
    synthetic_settings: dict = None


# What a run trains, by the value of its `task` setting. A new kind of run is one class in tasks/ and one line here.
TASKS = {
    "lm": Declared("language", "LanguageModel", "a GPT that continues text (the default)",
                   # TransformerLens's induction-head demo's shape (2 layers of 2 heads, width 64, no dropout) on
                   # rows that end with 8 to 16 symbols and them again; its induction heads form at about a third of
                   # these steps (docs/inspection.md, "A film of a run").
                   synthetic_settings={"induction": dict(
                       n_layer=2, n_head=2, n_kv_head=None, n_embd=64, block_size=32, dropout=0.0, batch_size=32,
                       max_iters=1000, lr=3e-3, min_lr=1e-4, warmup_iters=50, eval_interval=250, eval_iters=8,
                       checkpoint_interval=250)}),
    "seq2seq": Declared(
        "pairs", "Pairs", "an encoder-decoder that learns to write each line's target from its source",
        # An encoder and a decoder of 2 blocks each; its block size, unless given, is the longest pair's.
        preset=dict(n_layer=2, n_head=4, n_embd=128, dropout=0.0,
                    batch_size=128, max_iters=6000, lr=3e-3, min_lr=3e-4, warmup_iters=200,
                    beta2=0.99, weight_decay=0.1, eval_interval=500, eval_iters=10, checkpoint_interval=500),
        # About what each synthetic task takes to decode 99% of its held-out pairs exactly (benchmarks/journal.md).
        synthetic_settings={"addition": dict(max_iters=8000), "reverse": dict(max_iters=1500),
                            "sort": dict(max_iters=6000)}),
    "chat": Declared("chat", "Chat", "a GPT that answers, trained on a JSON Lines file of conversations (see "
                                     "docs/chat.md)"),
}


def task_named(name):
    """The `Task` that the `task` setting `name` names (one of TASKS)."""
    declared = TASKS[name]
    return getattr(importlib.import_module(f"gptlite.tasks.{declared.module}"), declared.class_name)()


def every_task():
    """One of each `Task`, in TASKS's order."""
    return [task_named(name) for name in TASKS]
