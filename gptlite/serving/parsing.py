"""A request's body, checked: what a completions or chat completions request asks for (`Completion`), or an
OpenAI-style refusal (`RequestError`)."""

import dataclasses
import json
import math

import numpy as np

from gptlite.decode.settings import is_whole_number_setting, SAMPLING_FIELDS, SamplingConfig, TOP_LOGPROBS
from gptlite.errors import ConfigError, first_line, InputError
from gptlite.inside import ABLATIONS
from gptlite.tasks import task as tasks
from gptlite.text import templates

# OpenAI's default max_tokens; every sampling setting left out takes SamplingConfig's default.
DEFAULTS = dict(max_tokens=16, n=1)
MAX_BODY_BYTES = 1 << 20
# A request's sampling settings, each by the name it has there (max_new_tokens is OpenAI's max_tokens): every field
# of SamplingConfig.
REQUEST_NAMES = {field.metadata["request"] or name: name for name, field in SAMPLING_FIELDS.items()}
FIELDS = {"model", "prompt", "n", "stream", "user", "echo", "logprobs", "presence_penalty", "frequency_penalty",
          "best_of", "logit_bias", "suffix", "stream_options", *REQUEST_NAMES}
# Fields of OpenAI's request that are accepted only at the value that changes nothing.
NEUTRAL = {"presence_penalty": (0, None), "frequency_penalty": (0, None), "best_of": (1, None), "logit_bias": (None,),
           "suffix": (None,)}


class RequestError(Exception):
    """A request the server refuses: its HTTP status and an OpenAI-style error body."""

    def __init__(self, status, message, param=None, kind="invalid_request_error", headers=None):
        super().__init__(message)
        self.status, self.param, self.kind, self.headers = status, param, kind, headers or {}

    def body(self):
        return {"error": {"message": str(self), "type": self.kind, "param": self.param, "code": None}}


@dataclasses.dataclass
class Completion:
    """A checked completions request: `prompts`, each wanting `n` choices sampled by `sampling`."""

    prompts: list
    sampling: object  # a SamplingConfig: max_new_tokens is the request's max_tokens
    n: int
    stream: bool
    logprobs: int = None  # how many likeliest tokens' log-probabilities come with each token; None: none
    echo: bool = False  # the prompt comes back before its completion
    chat: bool = False  # a chat completion: its one prompt is a rendered conversation, its answers messages
    prompts_ids: list = None  # each prompt's ids, where they are not its text's (a conversation's)

    @property
    def rows(self):
        """Each choice's prompt, in OpenAI's order: prompt 0's n choices first."""
        return [prompt for prompt in self.prompts for _ in range(self.n)]

    def decoding_rows(self, model):
        """Each choice's row as the decode engine reads it (`tasks.task.decoding_rows`: its token ids, a
        Seq2Seq's source ids or None, its prompt's length in tokens), in OpenAI's order."""
        rows_ids, sources, lengths = tasks.decoding_rows(model, self.prompts, self.prompts_ids)
        return ([list(ids) for ids in rows_ids for _ in range(self.n)],
                None if sources is None else np.repeat(sources, self.n, axis=0),
                [length for length in lengths for _ in range(self.n)])


def parse_completion(body, model, model_name, settings):
    """The `Completion` a request body asks for, or a `RequestError` (400, 404) saying what is wrong; what a
    request to the model may hold, its task says (`tasks.task.request_refusal`)."""
    if not isinstance(body, dict):
        raise RequestError(400, "the request body must be a JSON object")
    unknown = sorted(set(body) - FIELDS)
    if unknown:
        raise RequestError(400, f"unknown field {unknown[0]!r}", unknown[0])
    for name, allowed in NEUTRAL.items():
        if name in body and body[name] not in allowed:
            raise RequestError(400, f"{name} is not supported (leave it out)", name)
    if body.get("model") not in (None, model_name):
        raise RequestError(404, f"the model {body['model']!r} does not exist; this server has {model_name!r}", "model",
                           kind="not_found_error")
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        prompts = [prompt]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        prompts = prompt
    else:
        raise RequestError(400, "prompt must be a string or a non-empty list of strings", "prompt")
    sampling = tasks.bounded(model, _sampling(body, settings))
    n = _number(body, "n", int, 1, settings.max_n)
    logprobs = _number(body, "logprobs", int, 0, TOP_LOGPROBS, default=None)
    echo = body.get("echo") or False
    stream = body.get("stream", False)
    for name, value in (("stream", stream), ("echo", echo)):
        if not isinstance(value, bool):
            raise RequestError(400, f"{name} must be true or false", name)
    if len(prompts) * n > settings.max_batch * 4:
        raise RequestError(400, f"{len(prompts)} prompts x n={n} is more than {settings.max_batch * 4} choices", "n")
    for name, asked in (("echo", echo), ("logprobs", logprobs is not None)):
        refusal = tasks.request_refusal(model, name) if asked else None
        if refusal is not None:
            raise RequestError(400, refusal, name)
    tokenizer = model.tokenizer
    for prompt_text in prompts:
        unknown_characters = tokenizer.unknown_characters(prompt_text)
        if unknown_characters:
            raise RequestError(400, f"the prompt has characters the model never saw: {''.join(unknown_characters)!r}",
                               "prompt")
        # A prompt longer than the context is read as its last tokens, unless `truncate` says no; a source never.
        too_long = len(tokenizer.encode(prompt_text)) > model.config.block_size
        if too_long and not tasks.cuts_long_texts(model, settings.truncate):
            raise RequestError(400, f"a {tasks.reads(model)} is longer than the model's context of "
                                    f"{model.config.block_size} tokens", "prompt")
    return Completion(prompts, sampling, n, stream, logprobs, echo)


def _sampling(body, settings):
    """The request's SamplingConfig, which checks its settings' kinds and ranges; here, only the API's own
    limits (each field's `limits` and `most`, the server's for max_tokens), and JSON's one kind of number: a
    whole float (16.0) counts as a whole number."""
    max_tokens = _number(body, "max_tokens", int, 0, settings.max_tokens_limit)
    asked = {name: body[request] for request, name in REQUEST_NAMES.items()
             if name != "max_new_tokens" and body.get(request) is not None}
    for name, value in asked.items():
        if is_whole_number_setting(name) and isinstance(value, float) and value.is_integer():
            asked[name] = int(value)
        low, high = SAMPLING_FIELDS[name].metadata["limits"] or (None, None)
        if high is not None and _is_number(value) and (value > high or low is not None and value < low):
            limits = f"at most {high}" if low is None else f"from {low} to {high}"
            raise RequestError(400, f"{name} must be {limits}, got {_shown(value)}", name)
        most = SAMPLING_FIELDS[name].metadata["most"]
        if most is not None and not (isinstance(value, str) or isinstance(value, list) and len(value) <= most):
            raise RequestError(400, f"{name} must be a string or a list of up to {most} strings", name)
    try:
        return SamplingConfig(max_new_tokens=max_tokens, **asked)
    except ConfigError as error:
        raise RequestError(400, first_line(error), error.setting) from None


def _is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


CHAT_FIELDS = (FIELDS - {"prompt", "echo", "suffix", "best_of"}) | {"messages", "top_logprobs",
                                                                   "max_completion_tokens"}


def parse_chat_completion(body, model, model_name, settings):
    """The `Completion` a chat completions request asks for: its conversation rendered with the model's
    chat template, its answers ending at the template's end of turn; or a `RequestError`."""
    if not isinstance(body, dict):
        raise RequestError(400, "the request body must be a JSON object")
    unknown = sorted(set(body) - CHAT_FIELDS)
    if unknown:
        raise RequestError(400, f"unknown field {unknown[0]!r}", unknown[0])
    refusal = tasks.request_refusal(model, "messages")
    if refusal is not None:
        raise RequestError(400, refusal, "messages")
    if not isinstance(body.get("logprobs", False), bool):
        raise RequestError(400, "logprobs must be true or false", "logprobs")
    top = _number(body, "top_logprobs", int, 0, TOP_LOGPROBS, default=None)
    if top is not None and not body.get("logprobs"):
        raise RequestError(400, "top_logprobs needs logprobs set to true", "top_logprobs")
    if "max_tokens" in body and "max_completion_tokens" in body:
        raise RequestError(400, "give max_tokens or max_completion_tokens, not both", "max_completion_tokens")
    try:
        messages = templates.check_messages(body.get("messages"), "messages")
        prompt = templates.render_for(model.tokenizer, messages, add_generation_prompt=True)
        ids = templates.rendered_ids(model.tokenizer, prompt)
    except InputError as error:
        raise RequestError(400, str(error), "messages") from None
    asked = {name: value for name, value in body.items()
             if name not in ("messages", "logprobs", "top_logprobs", "max_completion_tokens")}
    asked["prompt"] = prompt
    if "max_completion_tokens" in body:
        asked["max_tokens"] = body["max_completion_tokens"]
    if body.get("logprobs"):
        asked["logprobs"] = top or 0
    # The answer ends at the template's end of turn too: the worker's rows see to it (decoding.TextRows).
    return dataclasses.replace(parse_completion(asked, model, model_name, settings), chat=True, prompts_ids=[ids])


def _number(body, name, kind, low, high, default=dataclasses.MISSING):
    value = body.get(name, DEFAULTS.get(name) if default is dataclasses.MISSING else default)
    if value is None and default is None:
        return None
    is_number = _is_number(value)
    if kind is int and is_number and not isinstance(value, int):
        is_number = float(value).is_integer()
    try:
        in_range = is_number and math.isfinite(value) and low <= value <= high
    except OverflowError:  # a whole number too large for a float
        in_range = False
    if not in_range:
        description = "a whole number" if kind is int else "a number"
        raise RequestError(400, f"{name} must be {description} from {low} to {high}, got {_shown(value)}", name)
    return kind(value)


def _shown(value, limit=40):
    """A request's value as an error message quotes it: a long one cut short."""
    try:
        text = json.dumps(value)
    except ValueError:  # a whole number with more digits than Python converts to text
        return "a number too large"
    return text if len(text) <= limit else text[:limit] + "..."


def trace_options(body):
    """A trace request's options, checked for their form (the model checks their values): heads to `ablate`, each
    [layer, head] or [layer, head, part], the `ablation` ("zero" or "mean"), the `layers` whose steps to keep, and
    the `position` of a long text to read in the window the writer read it in."""
    options = {}
    ablate = body.get("ablate", [])
    if not isinstance(ablate, list) or not all(
            isinstance(head, list) and len(head) in (2, 3) and all(_is_whole(i) for i in head[:2])
            and (len(head) == 2 or isinstance(head[2], str)) for head in ablate):
        raise RequestError(400, "ablate must be a list of heads, each [layer, head] (or [layer, head, part])",
                           "ablate")
    if ablate:
        options["ablate"] = [tuple(head) for head in ablate]
    ablation = body.get("ablation", "zero")
    if ablation not in ABLATIONS:
        raise RequestError(400, f"ablation must be one of {', '.join(ABLATIONS)}", "ablation")
    options["ablation"] = ablation
    layers = body.get("layers")
    if layers is not None:
        if not isinstance(layers, list) or not all(_is_whole(layer) for layer in layers):
            raise RequestError(400, "layers must be a list of layer numbers", "layers")
        options["layers"] = layers
    position = body.get("position")
    if position is not None:
        if not _is_whole(position) or position < 0:
            raise RequestError(400, "position must be a whole number, a token of the text", "position")
        options["position"] = position
    return options


def film_frame(body, film):
    """A request's `frame`: the index of a frame of the served run's `film` (a `gptlite.film`), checked; None where
    it gives none."""
    frame = body.get("frame") if isinstance(body, dict) else None
    if frame is None:
        return None
    if film is None:
        raise RequestError(400, "this server shows no film: leave out frame", "frame")
    if not _is_whole(frame) or not 0 <= frame < len(film):
        raise RequestError(400, f"frame must be a frame's index, from 0 to {len(film) - 1}", "frame")
    return frame


def token_ids(body):
    """A request's `ids`, checked for their form (the model checks their range): a non-empty list of whole numbers;
    None where it gives none."""
    ids = body.get("ids") if isinstance(body, dict) else None
    if ids is None:
        return None
    if not isinstance(ids, list) or not ids or not all(_is_whole(i) for i in ids):
        raise RequestError(400, "ids must be a non-empty list of token ids", "ids")
    return ids


def _is_whole(value):
    return isinstance(value, int) and not isinstance(value, bool)
