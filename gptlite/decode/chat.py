"""Talking with a model that has a chat template: its answer to a conversation, whole or streamed.

    import gptlite
    messages = [{"role": "user", "content": "What is 2 plus 3?"}]
    print(gptlite.reply(model, messages, temperature=0))
    for piece in gptlite.stream_reply(model, messages):
        print(piece, end="", flush=True)

The conversation is rendered with the model's template, followed by what
opens an answer; the answer ends at the template's end of turn (or at a
stop string, or its max_new_tokens). `Conversation` keeps a history for a
terminal or a page: the oldest turns are dropped when it outgrows the
model's context.
"""

from gptlite.decode.generation import RowsStream, sampling_config
from gptlite.decode.settings import SamplingConfig
from gptlite.errors import ConfigError, GPTLiteError
from gptlite.text import templates
from gptlite.text.templates import answer_prompt_ids

# The share of the context a conversation's history leaves free for the answer.
ANSWER_SHARE = 4
# Held-out questions a training run answers at each evaluation (all of them at its end).
EVALUATED_QUESTIONS = 100
# Questions `greedy_answers` decodes in one batch.
ANSWERED_TOGETHER = 256


def answer_rows(model, conversations, sampling=None, streaming=True):
    """A `RowsStream` of the answers to several conversations at once (one SamplingConfig or one each)."""
    tokenizer = model.tokenizer
    if tokenizer is None:
        raise ConfigError("the model has no tokenizer")
    rows_ids = [answer_prompt_ids(tokenizer, messages) for messages in conversations]
    # One config for every row: its seed makes each row's, as generate does.
    configs = list(sampling) if isinstance(sampling, (list, tuple)) else sampling_config(sampling)
    return RowsStream(model, [""] * len(rows_ids), configs, streaming=streaming, rows_ids=rows_ids, answers=True)


def answers(model, conversations, sampling=None):
    """The answers to several conversations, decoded together: a list of texts."""
    rows = answer_rows(model, conversations, sampling, streaming=False)
    texts = [""] * len(conversations)
    for pieces in rows:
        texts = [text + piece for text, piece in zip(texts, pieces)]
    return texts


def greedy_answers(model, questions, max_new_tokens=None):
    """The greedy answers to `questions`, [(messages, answer)], and whether each is exactly the answer (spaces
    around it aside): (texts, [bool]). An answer may take `max_new_tokens` tokens (None: as many as the longest
    expected answer and its end of turn); questions are answered ANSWERED_TOGETHER at a time."""
    if max_new_tokens is None:
        max_new_tokens = 1 + max(len(model.tokenizer.encode(answer)) for _, answer in questions)
    got = []
    for start in range(0, len(questions), ANSWERED_TOGETHER):
        part = questions[start:start + ANSWERED_TOGETHER]
        got += answers(model, [messages for messages, _ in part],
                       SamplingConfig(max_new_tokens=max_new_tokens, temperature=0.0))
    return got, [text.strip() == want.strip() for text, (_, want) in zip(got, questions)]


def exact_answers(model, questions, max_new_tokens=None):
    """The fraction of `questions`, [(messages, answer)], whose greedy answer is exact (see greedy_answers)."""
    return sum(greedy_answers(model, questions, max_new_tokens)[1]) / len(questions)


def stream_reply(model, messages, max_new_tokens=None, sampling=None, **settings):
    """The model's answer to `messages`, a piece at a time. Settings as for `gptlite.generate`."""
    rows = answer_rows(model, [messages], sampling_config(sampling, max_new_tokens, settings))
    return (pieces[0] for pieces in rows if pieces[0])


def reply(model, messages, max_new_tokens=None, sampling=None, **settings):
    """The model's answer to `messages`, as text. Settings as for `gptlite.generate`."""
    return "".join(stream_reply(model, messages, max_new_tokens, sampling, **settings))


class Conversation:
    """A conversation's history, kept within the model's context.

    `ask(text)` adds the user's message and streams the answer, which joins
    the history once it has ended (a stopped answer joins as far as it came).
    Before each answer, the oldest turns (a user's message and its answer)
    are dropped until the history leaves a quarter of the context for the
    answer; `dropped` counts them. The system message, if any, stays.
    """

    def __init__(self, model, system=None, sampling=None):
        if templates.template_of(model.tokenizer) is None:
            templates.render_for(model.tokenizer, [{"role": "user", "content": ""}])  # the clear error
        self.model = model
        self.system = system
        self.sampling = sampling_config(sampling)
        self.turns = []  # the messages after the system one
        self.dropped = 0

    @property
    def messages(self):
        return ([{"role": "system", "content": self.system}] if self.system else []) + self.turns

    def reset(self):
        self.turns, self.dropped = [], 0

    def ask(self, text):
        """An iterator over the answer to `text`, streamed; the answer is kept in the history as it comes. A message
        the model cannot read (characters its vocabulary lacks) raises an InputError here, before any answer, and
        leaves the history as it was."""
        before = list(self.turns), self.dropped
        try:
            self.turns.append({"role": "user", "content": text})
            self.dropped += self._fit()
            rows = answer_rows(self.model, [self.messages], self.sampling)
        except GPTLiteError:
            self.turns, self.dropped = before
            raise
        answer = {"role": "assistant", "content": ""}
        self.turns.append(answer)
        return _kept_as_it_comes(rows, answer)

    def _fit(self):
        """Drop the oldest turns until the history leaves room for an answer; how many messages went."""
        room = self.model.config.block_size - self.model.config.block_size // ANSWER_SHARE
        dropped = 0
        while len(self.turns) > 1 and len(answer_prompt_ids(self.model.tokenizer, self.messages)) > room:
            cut = 2 if len(self.turns) > 2 and self.turns[1]["role"] == "assistant" else 1
            self.turns = self.turns[cut:]
            dropped += cut
        return dropped


def _kept_as_it_comes(rows, answer):
    """The pieces of the one row of `rows`, each added to the `answer` message as it comes."""
    for pieces in rows:
        if pieces[0]:
            answer["content"] += pieces[0]
            yield pieces[0]
