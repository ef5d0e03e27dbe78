"""A kind of run (`Task`), and which one a run's settings or a model is.

    task = tasks.task.named("chat")             # the `task` setting, and `synthetic`
    task = tasks.task.of_model(model)           # what a saved model does: lm, chat or seq2seq
    tasks.task.write(model, asked, settings)    # what the commands do with a model, its task's way

The kinds differ in their data, their new model, their batches and loss mask, their scores and what a run
samples; each `Task` holds its own of these, and recognises its own models and synthetic tasks, so that nothing
else asks which kind it has: the functions here ask each task of the registry in turn.
"""

import dataclasses
import pathlib

from gptlite.data import chat_tasks
from gptlite.decode.generation import prompt_ids
from gptlite.errors import ConfigError, InputError
from gptlite.evaluation import scores
from gptlite.model.gpt import check_use
from gptlite.tasks import every_task, task_named, TASKS


VAL_FILE_REFUSAL = ("`val_file` holds conversations to validate a chat run on: it goes with task='chat' and a file "
                    "of conversations")


@dataclasses.dataclass(frozen=True)
class Sizing:
    """Settings a task sized from a new run's data (a chat run's context and steps, a seq2seq run's longest pair),
    laid over `preset`'s settings (None: the task's `default_preset`) and under the run's own; `line` says how
    they were chosen, or is None."""

    settings: dict
    preset: str = None
    line: str = None


@dataclasses.dataclass
class Training:
    """What a task hands the training loop: its train and validation data (the kind `batches` reads), the line
    that says what it trains on, the fractions each evaluation records (a name for each function of the model),
    what a run samples (a function of the model that returns text), and what it held out to check on."""

    train: object
    validation: object
    line: str
    metrics: dict
    sample: object
    # What the task held out to check the model on, its own kind of record: a seq2seq run's pairs
    # (`data.pairs.Pairs`), a chat run's questions ([(messages, answer)]); None where it held out nothing.
    held_out: object = None


class Task:
    """What a kind of run does its own way. `name` is the `task` setting's value for it.

    A run asks its task, in order: `check` (refuse what the task cannot take, before anything is read),
    `read` (the data a new model is sized from, and the settings sized from it), `model` (a new model, or the
    checkpoint's), `adapted` (the model as the task trains it), `training` (its data encoded and described),
    `describe` and, at its end, `closing_words`, and `check_checkpoint` of a run it resumes; the training loop asks
    `batches`, `ignored_class` and `characters_per_token`; `evaluate` scores a model on files; the commands ask
    for the text a model reads (`given_text`), what it writes (`write`) and its attention (`draw_attention`); the
    server asks `request_refusal`, `cuts_long_texts`, `bounded`, `decoding_rows` and `warm_rows`.
    """

    name = None
    called = "a language model"  # what a model of this task is, in words
    reads = "prompt"  # what it is given to write from: a "prompt" it continues, or a "source" it writes a target for
    measures_mfu = False  # whether its FLOPs per token are known, for model FLOPs utilisation
    synthetic = {}  # the built-in tasks (the `synthetic` setting) it trains on instead of files, by name
    films = False  # whether a run keeps a film (`training.film`): `film_probe` gives the text it looks at

    @property
    def default_preset(self):
        """The preset a run takes where it names none: the task's own where TASKS declares one, named as the task,
        else a language model's (`training.settings.DEFAULT_PRESET`)."""
        return self.name if TASKS[self.name].preset else "laptop"

    def owns(self, model):
        """Whether `model` (a GPT or Seq2Seq) is one this task trains: exactly one task of TASKS owns a model."""
        raise NotImplementedError

    def check(self, asked):
        """Refuse what the run was `asked` (a `training.plan.RunArguments`) where this task cannot take it."""
        if asked.val_file is not None:
            raise ConfigError(VAL_FILE_REFUSAL)

    def read(self, asked, seed, new_model, say):
        """What the run reads before its settings are resolved, from what it was `asked` (a
        `training.plan.RunArguments`) and its `seed`: (its data or None, a `Sizing` or None, where a `new_model`'s
        settings are sized from the data)."""
        return None, None

    def adapted(self, model, plan, say):
        """The model as this task trains it (a chat run gives a model without a chat template one)."""
        return model

    def model(self, plan, data, say):
        """The model to train: the plan's checkpoint's, or a new one of the plan's shape."""
        raise NotImplementedError

    def training(self, plan, model, data, say, make_folder):
        """A `Training`: the data encoded for the model; `make_folder()` is called before the run's folder is
        written to, once whatever could refuse the data has passed."""
        raise NotImplementedError

    def film_probe(self, model, training, text=None):
        """The token ids a run's film looks inside the model at: `text`'s (its last context), or a slice of the
        validation data of `training` (a `Training`)."""
        raise NotImplementedError

    def describe(self, model):
        """The model, in a line: its shape and parameters."""
        raise NotImplementedError

    def closing_words(self, run):
        """What a run says of its final model at its end (`training.run.TrainedRun`), in pieces as they come."""
        raise NotImplementedError

    def check_checkpoint(self, checkpoint, out_dir):
        """Refuse to resume the run in `out_dir` whose `checkpoint` (a checkpoint document) trained a model of
        another task than this one. A checkpoint names its task; one written before it did names its model's class,
        which tells a seq2seq run from the others."""
        if "task" in checkpoint:
            if checkpoint["task"] not in TASKS:
                raise InputError(f"the checkpoint in {out_dir} is of a task this version does not know "
                                 f"({checkpoint['task']!r}); start the run again, or resume it with the version "
                                 f"that wrote it")
            task = task_named(checkpoint["task"])
            refused = task.name != self.name
        else:
            saved = checkpoint.get("model_class", "GPT")
            task = next(task for task in every_task() if task.model_class.__name__ == saved)
            refused = saved != self.model_class.__name__
        if refused:
            raise ConfigError(f"the run in {out_dir} trains {task.called}; resume it with `task='{task.name}'`")

    # --- the commands: what a model is given, and what they make of it

    def given_text(self, prompt=None, source=None, model_name="the model"):
        """The text of `prompt` and `source` that a model of this task reads (a language model's prompt, a
        Seq2Seq's source), None where it is not given; the other one given is an InputError naming the model
        (`model_name`: its file)."""
        given = {"prompt": prompt, "source": source}
        text = given.pop(self.reads)
        (unread, value), = given.items()
        if value is not None:
            raise InputError(f"{model_name} is {self.called}: give it `{self.reads}` TEXT, not `{unread}`")
        return text

    def write(self, model, asked, settings, model_name="the model"):
        """The text that `generate.py` prints for what it was `asked` (a `Writing`), in pieces as they come, ending
        with a line break; `settings`: the sampling settings given (SamplingConfig's fields), the rest its
        defaults."""
        raise NotImplementedError

    def draw_attention(self, model, path, asked, part=None, layer=None, head=None, model_name="the model"):
        """Draw the model's attention over what it was `asked` (a `Writing`: its prompt or source) to `path`, as
        `generate.py --attention` does; what was drawn, in words."""
        raise NotImplementedError

    # --- the server: what a request may hold

    def request_refusal(self, field):
        """Why a request to the server may not hold `field` for a model of this task, or None where it may:
        "messages" (a conversation, for /v1/chat/completions), "echo" and "logprobs" (of a completion), "attention"
        (/v1/attention's maps), "trace" (/v1/trace, the page's Inside view)."""
        if field == "messages":
            return ("this model has no chat template: it continues text and cannot hold a conversation; use "
                    "/v1/completions, or fine-tune it on conversations")
        return None

    def traced(self, model, text, target=None, **options):
        """Every step of `model` reading `text` (`gptlite.trace`, with its `options`: heads to ablate, layers to
        keep), for the server's Inside view; a model that writes targets reads `text` as a source and writes
        `target` (its own greedy one where None)."""
        from gptlite.inside.trace import trace

        if target is not None:
            raise InputError("a target goes with a source; this model continues a text")
        return trace(model, text, **options)

    def cuts_long_texts(self, truncate):
        """Whether a text longer than the model's context is read as its last tokens, where the server's
        `truncate` setting allows it (rather than refused)."""
        return truncate != "none"

    # --- decoding, as the server does it

    def decoding_rows(self, tokenizer, block_size, texts, texts_ids=None):
        """What the decode engine reads for each text (`decode.rows.TextRows.admit`): (each row's token ids, the
        sources (N, block_size) or None, each text's length in tokens). A language model continues each text
        (or its ids, where given: a rendered conversation's)."""
        rows_ids = [list(ids) for ids in texts_ids] if texts_ids is not None else \
            [prompt_ids(tokenizer, text) for text in texts]
        return rows_ids, None, [len(ids) for ids in rows_ids]

    def warm_rows(self, tokenizer, block_size, length, count):
        """`count` rows of `length` tokens to build the decode programs with, as `decoding_rows` gives them."""
        return [[0] * length] * count, None

    def bounded(self, sampling, block_size):
        """`sampling` (a SamplingConfig) asking for no more tokens than a row of this task can write."""
        return sampling

    def batches(self, data, block_size, batch_size, count, **kwargs):
        """A `data.lm.DrawnBatches` of `count` batches of this task's training data."""
        raise NotImplementedError

    def ignored_class(self, model):
        """The target id the loss leaves out, or None where every position counts."""
        return None

    def characters_per_token(self, tokenizer, validation):
        """How many characters a predicted token of `validation` stands for, on average, or None."""
        raise NotImplementedError

    def evaluate(self, model, sources, encoding, errors, unknown, verbose):
        """An `evaluation.scores.Evaluation` of the model on files of this task's data."""
        raise NotImplementedError


def evaluate(model, sources=(), encoding="utf-8", errors="strict", unknown="error", verbose=0, synthetic=None):
    """Score a model on `sources`, each scored on its own; an `evaluation.scores.Evaluation`.

    A GPT reads text files, or folders of them; a chat model, conversations
    files (.jsonl), or with `synthetic` (a `chat_tasks` task) that task's held-out
    questions instead; a Seq2Seq reads files of source<TAB>target lines. encoding, errors: how the files are decoded;
    unknown: characters a char vocabulary lacks are an error ("error"), left
    out ("skip") or spaces ("replace"). verbose=1 shows a progress bar.
    """
    check_use(model, "be scored", ConfigError(f"evaluate scores a GPT or a Seq2Seq, not a {type(model).__name__}"))
    sources = [sources] if isinstance(sources, (str, pathlib.Path)) else list(sources)
    if synthetic is not None:
        if sources:
            raise ConfigError("give files to score, or `synthetic`, not both")
        questions = chat_tasks.synthetic(synthetic).held_out
        chats = [messages + [{"role": "assistant", "content": answer}] for messages, answer in questions]
        return scores.evaluate_conversations(model, [(f"held-out {synthetic} questions", chats)], verbose)
    if not sources:
        raise ConfigError("give at least one file to evaluate on, or `synthetic`")
    return of_model(model).evaluate(model, sources, encoding, errors, unknown, verbose)


def named(task=None, synthetic=None):
    """The task a run trains, from its `task` and `synthetic` settings, checked (`task=None`: the one whose
    synthetic tasks `synthetic` is one of, else a language model)."""
    if task not in (None, *TASKS):
        raise ConfigError(f"task must be one of {', '.join(TASKS)}, got {task!r}")
    if synthetic is None:
        return task_named(task or "lm")
    offering = [offered for offered in every_task() if synthetic in offered.synthetic]
    if not offering:
        raise ConfigError(f"synthetic must be one of "
                          f"{', '.join(name for offered in every_task() for name in offered.synthetic)}, "
                          f"got {synthetic!r}")
    if task not in (None, *(offered.name for offered in offering)):
        raise ConfigError(f"the synthetic {synthetic} task trains {offering[0].called}; leave out `task={task!r}`")
    return task_named(task or offering[0].name)


def of_model(model):
    """The task of TASKS that trains a model such as `model` (a GPT or a Seq2Seq): lm, chat or seq2seq."""
    return next(task for task in every_task() if task.owns(model))


# What the commands do with a model, each its task's way (`Task`'s methods of the same names).

def describe(model):
    """The model, in a line: its shape and parameters."""
    return of_model(model).describe(model)


def given_text(model, prompt=None, source=None, model_name="the model"):
    """The one of `prompt` and `source` that the model reads (see `Task.given_text`)."""
    return of_model(model).given_text(prompt, source, model_name)


def write(model, asked, settings, model_name="the model"):
    """The text that `generate.py` prints for what it was `asked` (a `Writing`), in pieces (see `Task.write`)."""
    return of_model(model).write(model, asked, settings, model_name)


def draw_attention(model, path, asked, part=None, layer=None, head=None, model_name="the model"):
    """Draw the model's attention over what it was `asked` to `path`; what was drawn, in words."""
    return of_model(model).draw_attention(model, path, asked, part, layer, head, model_name)


# What the server asks of a model, each its task's way (`Task`'s methods of the same names).

def request_refusal(model, field):
    """Why a request to the server may not hold `field` for this model, or None where it may."""
    return of_model(model).request_refusal(field)


def traced(model, text, target=None, **options):
    """Every step of the model reading `text` (a Seq2Seq's source, writing `target`), for the Inside view."""
    return of_model(model).traced(model, text, target, **options)


def reads(model):
    """What the model reads, in a word: "prompt", or a Seq2Seq's "source"."""
    return of_model(model).reads


def cuts_long_texts(model, truncate):
    """Whether a text longer than the model's context is read as its last tokens (under `truncate`)."""
    return of_model(model).cuts_long_texts(truncate)


def bounded(model, sampling):
    """`sampling` asking for no more tokens than a row of the model can write."""
    return of_model(model).bounded(sampling, model.config.block_size)


def decoding_rows(model, texts, texts_ids=None):
    """What the decode engine reads for each text: (each row's token ids, the sources or None, each length)."""
    return of_model(model).decoding_rows(model.tokenizer, model.config.block_size, texts, texts_ids)


def warm_rows(model, length, count):
    """`count` rows of `length` tokens to build the model's decode programs with, as `decoding_rows` gives them."""
    return of_model(model).warm_rows(model.tokenizer, model.config.block_size, length, count)


@dataclasses.dataclass(frozen=True)
class Writing:
    """What `generate.py` asks a model to write from, and how: a language model's `prompt` (None: from nothing);
    a Seq2Seq's `source`, or `sources` (one target each); `num_samples` of each, or one found by `num_beams`;
    streamed or not; the context window moved `slide` tokens at a time; characters the model lacks an error, left
    out or spaces (`unknown`); with the key/value cache or not."""

    prompt: str = None
    source: str = None
    sources: list = None
    num_samples: int = 1
    num_beams: int = None
    stream: bool = True
    slide: int = 1
    unknown: str = "error"
    use_cache: bool = True
