"""`gptlite serve`: a model behind an HTTP API that speaks OpenAI's completions format,
batching the requests that arrive together, with a page to try it at `/`.

    app = gptlite.serving.create_app(gptlite.load("runs/mine/model.keras"), "mine")
    gptlite.serving.serve("runs/mine/model.keras", port=8000)   # what `gptlite serve` does

Endpoints: `POST /v1/completions` (a prompt or a list of them; `stream: true`
for server-sent events), `POST /v1/chat/completions` (a chat model's answer
to a conversation, rendered with its template), `GET /v1/models`, `GET
/health`, `POST /v1/attention` (the page's attention view) and `GET /` (the
page, with a chat view for a chat model).

One worker thread owns the model and decodes; the event loop only parses,
queues and streams. The worker keeps one `gptlite.engine.Engine` running:
between any two of its calls (`DECODE_STEPS` tokens at most) it admits the
requests that have arrived into the running batch (continuous batching:
nobody waits for somebody else's long answer), each row with its own
sampling settings, seed, length and stop strings, and retires the rows that
have ended, were cancelled or whose client went away. A seeded request's
text is the one `gptlite.generate` writes for that prompt and seed, whatever
shares its batch. Programs compile when first needed, and, after start-up,
while the worker is idle (`Worker.warm_up`); with the on-disk compile cache
(`gptlite.compile_cache`) a second start finds them ready.
"""

import asyncio
import collections
import dataclasses
import importlib.resources
import json
import math
import queue
import signal
import threading
import time
import traceback
import uuid

from gptlite import conversations, templates
from gptlite.engine import SHORTEST_CACHE, Engine
from gptlite.errors import GPTLiteError, InputError
from gptlite.decoding import TextRows
from gptlite.generation import generate_target, prompt_ids
from gptlite.sampling import TOP_LOGPROBS, SamplingConfig
from gptlite.settings import ServeSettings

# OpenAI's default max_tokens; every sampling setting left out takes SamplingConfig's default.
DEFAULTS = dict(max_tokens=16, n=1)
# Tokens per engine call at most: new requests join the batch between calls.
DECODE_STEPS = 32
MAX_BODY_BYTES = 1 << 20
FIELDS = {"model", "prompt", "max_tokens", "temperature", "top_p", "top_k", "min_p", "repetition_penalty", "n", "stop",
          "seed", "stream", "user", "echo", "logprobs", "presence_penalty", "frequency_penalty", "best_of",
          "logit_bias", "suffix", "stream_options"}
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

    def rows_ids(self, tokenizer):
        """Each choice's prompt as the model reads it."""
        prompts_ids = self.prompts_ids or [prompt_ids(tokenizer, prompt) for prompt in self.prompts]
        return [list(ids) for ids in prompts_ids for _ in range(self.n)]


def parse_completion(body, model, model_name, settings):
    """The `Completion` a request body asks for, or a `RequestError` (400, 404) saying what is wrong."""
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
    max_tokens = _number(body, "max_tokens", int, 0, settings.max_tokens_limit)
    sampling = {"max_new_tokens": max_tokens}
    for name, low, high in (("temperature", 0.0, 2.0), ("top_p", 0.0, 1.0), ("min_p", 0.0, 1.0),
                            ("repetition_penalty", 0.01, 100.0)):
        value = _number(body, name, float, low, high, default=None)
        if value is not None:
            sampling[name] = value
    if sampling.get("top_p") == 0:
        raise RequestError(400, "top_p must be above 0", "top_p")
    sampling["top_k"] = _number(body, "top_k", int, 1, 2**31 - 1, default=None)  # above the vocabulary: every token
    n = _number(body, "n", int, 1, settings.max_n)
    sampling["seed"] = _number(body, "seed", int, -2**63, 2**63 - 1, default=None)
    logprobs = _number(body, "logprobs", int, 0, TOP_LOGPROBS, default=None)
    echo = body.get("echo") or False
    stream = body.get("stream", False)
    for name, value in (("stream", stream), ("echo", echo)):
        if not isinstance(value, bool):
            raise RequestError(400, f"{name} must be true or false", name)
    stops = body.get("stop")
    stops = [] if stops is None else [stops] if isinstance(stops, str) else stops
    if not (isinstance(stops, list) and len(stops) <= 4 and all(isinstance(s, str) and s for s in stops)):
        raise RequestError(400, "stop must be a non-empty string or a list of up to 4 of them", "stop")
    sampling["stop"] = tuple(stops)
    if len(prompts) * n > settings.max_batch * 4:
        raise RequestError(400, f"{len(prompts)} prompts x n={n} is more than {settings.max_batch * 4} choices", "n")
    if model.writes_targets and (echo or logprobs is not None):
        name = "echo" if echo else "logprobs"
        raise RequestError(400, f"{name} is for a language model's completions; this model writes targets", name)
    tokenizer = model.tokenizer
    for prompt_text in prompts:
        unknown_characters = tokenizer.unknown_characters(prompt_text)
        if unknown_characters:
            raise RequestError(400, f"the prompt has characters the model never saw: {''.join(unknown_characters)!r}",
                               "prompt")
        if settings.truncate == "none" and len(tokenizer.encode(prompt_text)) > model.config.block_size:
            raise RequestError(400, f"a prompt is longer than the model's context of {model.config.block_size} "
                                    f"tokens", "prompt")
    return Completion(prompts, SamplingConfig(**sampling), n, stream, logprobs, echo)


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
    if not model.chats:
        raise RequestError(400, "this model has no chat template: it continues text and cannot hold a "
                                "conversation; use /v1/completions, or fine-tune it on conversations", "messages")
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
        ids = conversations.rendered_ids(model.tokenizer, prompt)
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
    is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
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


class QueueFull(Exception):
    pass


@dataclasses.dataclass(eq=False)
class _Job:
    """A request waiting for, or being decoded by, the worker; `emit` hands each event to the event loop.

    Events: ("pieces", [(choice index, text, finish reason or None, logprobs or None), ...]) as the
    choices grow (a request that does not stream gets one, whole, at the end), then ("done", prompt
    tokens, completion tokens) for each choice; or ("error", message), ("failure", message).
    """

    rows: list  # each choice's prompt
    completion: Completion
    emit: object
    cancelled: bool = False
    live: int = 0  # choices still decoding
    rows_ids: list = None  # each choice's prompt as the model reads it
    prompt_tokens: list = None
    texts: list = None
    reasons: list = None
    logprobs: list = None
    completion_tokens: list = None


class _Choice:
    """One choice of a job, the key of its row in the worker's TextRows: where its next token's text starts,
    counted as OpenAI counts it for log-probabilities."""

    def __init__(self, job, index, prompt_length):
        self.job, self.index = job, index
        self.offset = prompt_length

    def logprobs(self, tokenizer, drawn):
        """The `_Logprobs` of the tokens a call added to the choice (a Drawn)."""
        new = _Logprobs()
        top = self.job.completion.logprobs
        for position, token_id in enumerate(drawn.ids):
            token = tokenizer.decode([int(token_id)])
            new.add(token, float(drawn.logprobs[position]),
                    {tokenizer.decode([int(i)]): float(value) for i, value in
                     zip(drawn.top_ids[position][:top], drawn.top_logprobs[position][:top])}, self.offset)
            self.offset += len(token)
        return new


@dataclasses.dataclass
class _Logprobs:
    """OpenAI's `logprobs` of a choice: each token, its log-probability, the likeliest tokens', where it starts."""

    tokens: list = dataclasses.field(default_factory=list)
    token_logprobs: list = dataclasses.field(default_factory=list)
    top_logprobs: list = dataclasses.field(default_factory=list)
    text_offset: list = dataclasses.field(default_factory=list)

    def add(self, token, logprob, top, offset):
        self.tokens.append(token)
        self.token_logprobs.append(logprob)
        self.top_logprobs.append(top)
        self.text_offset.append(offset)

    def extend(self, other):
        for name in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
            getattr(self, name).extend(getattr(other, name))


class Worker:
    """The one thread that owns the model: it runs the decode engine over the queued jobs (continuous
    batching), and answers attention requests between its calls."""

    def __init__(self, model, settings):
        self.model, self.settings = model, settings
        self.jobs = queue.Queue()
        self.waiting = 0
        self.compiling = 0  # programs still to compile while idle (see warm_up)
        self._lock = threading.Lock()
        self._admissible = collections.deque()  # jobs taken from the queue, waiting for room in the batch
        self._warm_plans = collections.deque()  # (batch size, prefill width) still to compile while idle
        # A Seq2Seq decodes each request's targets whole (see _write_targets); a language model's rows, keyed by
        # their _Choice, join one running batch.
        self.engine = None if model.writes_targets else Engine(model, resizable=True, short_caches=True,
                                                               mixed_settings=True)
        self.rows = None if self.engine is None else TextRows(self.engine, model.tokenizer)
        self._thread = threading.Thread(target=self._run, name="gptlite-decode", daemon=True)

    def start(self):
        if not self._thread.is_alive():
            self._thread.start()

    def submit(self, job):
        with self._lock:
            if self.waiting >= self.settings.max_queue:
                raise QueueFull
            self.waiting += 1
        self.jobs.put(job)

    def call(self, function):
        """Run `function(model)` on the worker thread; a concurrent.futures.Future of its result."""
        import concurrent.futures

        future = concurrent.futures.Future()
        self.jobs.put((function, future))
        return future

    def warm_up(self):
        """Plan the programs the worker will meet, to compile while it is idle, so that requests seldom wait
        for a compiler: for each batch size it can grow to, the prefill of each width with the cached step
        after it, and a full window's recomputing step. Requests are served meanwhile (one waits for the
        program being compiled at most); `compiling` counts what is left. On the worker's own thread, in
        a fixed order: TensorFlow names what it traces in order, so a start that traces in the same order
        finds its programs in the compile cache."""
        import keras

        if self.engine is None or keras.backend.backend() == "torch":
            return  # a Seq2Seq decodes its targets in batches of one size; torch compiles nothing
        block_size = self.model.config.block_size
        # Prompts of each prefill width (a power of two), whose rows' next steps read a cache of its span; None:
        # full windows, recomputed.
        widths = sorted({min(block_size, SHORTEST_CACHE << k)
                         for k in range(max(1, block_size // SHORTEST_CACHE).bit_length())})
        capacities = [1 << k for k in range(_padded(self.settings.max_batch).bit_length())]
        self._warm_plans.extend((capacity, width) for capacity in capacities for width in widths + [None])
        self.compiling = len(self._warm_plans)

    def _warm_next(self):
        capacity, width = self._warm_plans.popleft()
        block_size = self.model.config.block_size
        length = block_size if width is None else max(1, width - 1)
        try:
            engine = Engine(self.model, capacity, short_caches=True, mixed_settings=True)
            engine.admit([[0] * length] * capacity, [SamplingConfig(seed=0)] * capacity)
            engine.step(1)
        finally:
            self.compiling = len(self._warm_plans)

    def _run(self):
        while True:
            try:
                idle = not self.rows and not self._admissible
                self._take(block=idle and not self._warm_plans)
                self._admit()
                if self.rows:
                    self._step()
                elif self._warm_plans and not self._admissible:
                    self._warm_next()
            except Exception as error:  # the worker must live on: the requests get a 500, the server keeps serving
                traceback.print_exc()
                self._fail_all(f"decoding failed: {type(error).__name__}: {error}")

    def _take(self, block):
        """Move queued jobs to the admissible ones, running calls and a Seq2Seq's jobs at once. An idle worker
        waits for the first job, then `batch_window_ms` for others to prefill with it."""
        deadline = None
        while True:
            try:
                if block and deadline is None:
                    item = self.jobs.get()
                    deadline = time.monotonic() + self.settings.batch_window_ms / 1000
                elif deadline is not None:
                    item = self.jobs.get(timeout=max(0.0, deadline - time.monotonic()))
                else:
                    item = self.jobs.get_nowait()
            except queue.Empty:
                return
            if isinstance(item, tuple):
                function, future = item
                try:
                    future.set_result(function(self.model))
                except Exception as error:  # handed to the waiting request
                    future.set_exception(error)
                continue
            with self._lock:
                self.waiting -= 1
            if self.engine is None:
                self._write_targets(item)
            else:
                self._admissible.append(item)

    def _admit(self):
        """Prefill the admissible jobs that fit into the running batch, in the order they came."""
        jobs = []
        room = self.settings.max_batch - len(self.rows)
        while self._admissible and (len(self._admissible[0].rows) <= room or not self.rows and not jobs):
            job = self._admissible.popleft()
            if job.cancelled:
                continue
            room -= len(job.rows)
            jobs.append(job)
        if not jobs:
            return
        choices, rows_ids, configs = [], [], []
        try:
            for job in jobs:
                self._start(job)
                for index, (prompt, ids) in enumerate(zip(job.rows, job.rows_ids)):
                    choices.append(_Choice(job, index, len(prompt) if job.completion.echo else 0))
                rows_ids += job.rows_ids
                configs += job.completion.sampling.for_rows(len(job.rows))
            written = self.rows.admit(choices, rows_ids, configs, logprobs=any(
                job.completion.logprobs is not None for job in jobs), answers=[
                choice.job.completion.chat for choice in choices], streaming=[
                choice.job.completion.stream for choice in choices])
        except GPTLiteError as error:
            for job in jobs:
                job.emit(("error", str(error)))
            return
        self._deliver(written)

    def _start(self, job):
        count = len(job.rows)
        job.live = count
        job.texts, job.reasons, job.completion_tokens = [""] * count, [None] * count, [0] * count
        job.logprobs = [_Logprobs() if job.completion.logprobs is not None else None for _ in range(count)]
        job.rows_ids = job.completion.rows_ids(self.model.tokenizer)
        job.prompt_tokens = [len(ids) for ids in job.rows_ids]
        if job.completion.echo:
            echoed = [(prompt, _prompt_logprobs(self.model, ids, job.completion.logprobs)
                       if job.completion.logprobs is not None else None)
                      for prompt, ids in zip(job.rows, job.rows_ids)]
            job.texts = [prompt for prompt, _ in echoed]
            job.logprobs = [logprobs for _, logprobs in echoed]
            if job.completion.stream:
                job.emit(("pieces", [(index, prompt, None, logprobs)
                                     for index, (prompt, logprobs) in enumerate(echoed)]))

    def _step(self):
        for choice in self.rows.keys():
            if choice.job.cancelled:
                self.rows.cancel(choice)
        if self.rows:
            self._deliver(self.rows.step(DECODE_STEPS, logprobs=any(
                choice.job.completion.logprobs is not None for choice in self.rows.keys())))

    def _deliver(self, written):
        """Hand each choice its new text (`Written`, from the worker's TextRows); close the jobs that have ended."""
        streamed = {}  # job -> its choices' new pieces
        ended = []
        for choice, row in written.items():
            job = choice.job
            logprobs = None if job.completion.logprobs is None else choice.logprobs(self.model.tokenizer, row.drawn)
            job.texts[choice.index] += row.text
            if logprobs is not None:
                job.logprobs[choice.index].extend(logprobs)
            if job.completion.stream and (row.text or row.finish_reason):
                streamed.setdefault(job, []).append((choice.index, row.text, row.finish_reason, logprobs))
            if row.finish_reason:
                ended.append((choice, row))
        for job, pieces in streamed.items():
            job.emit(("pieces", pieces))
        for choice, row in ended:
            self._finish_choice(choice, row)

    def _finish_choice(self, choice, row):
        job = choice.job
        job.reasons[choice.index], job.completion_tokens[choice.index] = row.finish_reason, row.tokens
        job.live -= 1
        if job.live == 0:
            if not job.completion.stream:
                job.emit(("pieces", [(index, text, reason, logprobs) for index, (text, reason, logprobs) in
                                     enumerate(zip(job.texts, job.reasons, job.logprobs))]))
            job.emit(("done", job.prompt_tokens, job.completion_tokens))

    def _write_targets(self, job):
        """A Seq2Seq reads each prompt as a source; its targets come whole."""
        if job.cancelled:
            return
        tokenizer = self.model.tokenizer
        config = job.completion.sampling
        config = config.replace(max_new_tokens=min(config.max_new_tokens, self.model.config.block_size - 1))
        try:
            targets = generate_target(self.model, job.rows, sampling=config)
        except GPTLiteError as error:
            job.emit(("error", str(error)))
            return
        # A target as long as allowed was cut there; a shorter one ended with the end token or a stop string.
        lengths = [len(ids) for ids in tokenizer.encode_batch(targets)]
        reasons = ["length" if length >= config.max_new_tokens else "stop" for length in lengths]
        job.emit(("pieces", [(index, target, reason, None)
                             for index, (target, reason) in enumerate(zip(targets, reasons))]))
        prompt_tokens = [len(ids) for ids in tokenizer.encode_batch(job.rows)]
        completion_tokens = [length + (reason == "stop") for length, reason in zip(lengths, reasons)]
        job.emit(("done", prompt_tokens, completion_tokens))

    def _fail_all(self, message):
        jobs = {id(choice.job): choice.job for choice in self.rows.keys()} if self.rows is not None else {}
        for choice in self.rows.keys() if self.rows is not None else ():
            self.rows.cancel(choice)
        for job in jobs.values():
            job.emit(("failure", message))


def _prompt_logprobs(model, ids, top):
    """OpenAI's `logprobs` of an echoed prompt's token `ids` (as `prompt_ids` gives them), from one forward pass
    over its last block_size tokens (a token before them, or the first, has no log-probability: null)."""
    import numpy as np
    from keras import ops

    tokenizer = model.tokenizer
    start = len(tokenizer.text_start_ids)
    window = ids[-model.config.block_size:]
    logits = ops.convert_to_numpy(ops.cast(model(np.array([window], np.int32)), "float32"))[0]  # (T, V)
    log_probabilities = logits - np.logaddexp.reduce(logits, axis=-1, keepdims=True)
    first = len(ids) - len(window)  # the index in ids of window[0]
    result, offset = _Logprobs(), 0
    for index in range(start, len(ids)):
        token = tokenizer.decode([ids[index]])
        before = index - first - 1  # the window position whose logits predict this token
        if before < 0:
            result.add(token, None, None, offset)
        else:
            ranked = np.argsort(-log_probabilities[before])[:top]
            result.add(token, float(log_probabilities[before, ids[index]]),
                       {tokenizer.decode([int(i)]): float(log_probabilities[before, i]) for i in ranked}, offset)
        offset += len(token)
    return result


def _padded(rows):
    """The batch size that `rows` rows are decoded in: the next power of two."""
    return 1 << (rows - 1).bit_length()


def create_app(model, model_name, settings=None, worker=None):
    """The Starlette application that serves `model` under `model_name`, its worker thread started."""
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.requests import ClientDisconnect
    from starlette.responses import HTMLResponse, JSONResponse, StreamingResponse
    from starlette.routing import Route

    settings = settings or ServeSettings()
    worker = worker or Worker(model, settings)
    started = int(time.time())
    can_chat = model.chats

    def error_response(error):
        return JSONResponse(error.body(), status_code=error.status, headers=error.headers)

    def answered(handler):
        """`handler`, its refusals (a `RequestError`) answered in OpenAI's error body, and a failure of its own
        with a 500 in that body rather than a dropped connection: the client reads what went wrong, and its
        connection stays usable."""
        async def guarded(request):
            try:
                return await handler(request)
            except RequestError as error:
                return error_response(error)
            except Exception:
                traceback.print_exc()
                return error_response(RequestError(500, "the server failed to answer this request; the error is in "
                                                         "its log", kind="server_error"))
        return guarded

    async def http_error(request, error):
        """Starlette's own refusals (an unknown path, a wrong method) in OpenAI's error body."""
        messages = {404: f"no such endpoint: {request.method} {request.url.path} (the API is /v1/completions and "
                         f"/v1/models)",
                    405: f"{request.url.path} does not take {request.method}"}
        kind = "not_found_error" if error.status_code == 404 else "invalid_request_error"
        message = messages.get(error.status_code, error.detail)
        return error_response(RequestError(error.status_code, message, kind=kind, headers=error.headers))

    def check_key(request):
        if settings.api_key is None:
            return
        if request.headers.get("authorization", "") != f"Bearer {settings.api_key}":
            raise RequestError(401, "a valid API key is needed: Authorization: Bearer <key>",
                               kind="authentication_error")

    async def read_json(request):
        length = request.headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > MAX_BODY_BYTES):
            raise RequestError(413, f"the request body is larger than {MAX_BODY_BYTES} bytes")
        body = b""
        try:
            async for chunk in request.stream():
                body += chunk
                if len(body) > MAX_BODY_BYTES:
                    raise RequestError(413, f"the request body is larger than {MAX_BODY_BYTES} bytes")
        except ClientDisconnect:
            raise RequestError(400, "the client went away before sending its request") from None
        try:
            return json.loads(body)
        except (ValueError, UnicodeDecodeError) as error:
            raise RequestError(400, f"the request body is not valid JSON: {error}") from None
        except RecursionError:
            raise RequestError(400, "the request body is JSON nested too deeply") from None

    async def completions(request):
        check_key(request)
        return await answer(request, parse_completion(await read_json(request), model, model_name, settings))

    async def chat_completions(request):
        check_key(request)
        return await answer(request, parse_chat_completion(await read_json(request), model, model_name, settings))

    async def answer(request, completion):
        loop = asyncio.get_running_loop()
        events = asyncio.Queue()
        job = _Job(completion.rows, completion, lambda event: loop.call_soon_threadsafe(events.put_nowait, event))
        try:
            worker.submit(job)
        except QueueFull:
            return error_response(RequestError(503, "the server is busy; try again shortly", kind="server_busy",
                                               headers={"Retry-After": "1"}))
        identity, created = f"{'chatcmpl' if completion.chat else 'cmpl'}-{uuid.uuid4().hex}", int(time.time())
        if completion.stream:
            return StreamingResponse(_events(job, events, identity, model_name, created, completion.chat),
                                     media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        choices = [{"text": "", "index": index, "logprobs": None, "finish_reason": None}
                   for index in range(len(job.rows))]
        try:
            while True:
                try:
                    event = await asyncio.wait_for(events.get(), timeout=1.0)
                except asyncio.TimeoutError:
                    if await request.is_disconnected():  # nobody is waiting for the text any more
                        job.cancelled = True
                        return JSONResponse({}, status_code=499)
                    continue
                if event[0] == "pieces":
                    for index, text, reason, logprobs in event[1]:
                        choices[index].update(text=choices[index]["text"] + text, finish_reason=reason,
                                              logprobs=None if logprobs is None else dataclasses.asdict(logprobs))
                elif event[0] == "done":
                    prompt_tokens, completion_tokens = event[1], event[2]
                    break
                else:
                    status = 400 if event[0] == "error" else 500
                    return error_response(RequestError(status, event[1], kind="invalid_request_error" if status == 400
                                                       else "server_error"))
        except asyncio.CancelledError:
            job.cancelled = True
            raise
        counted_prompts = sum(prompt_tokens[::completion.n])  # each prompt once, as OpenAI counts
        choices = [{**choice, "finish_reason": choice["finish_reason"] or "length"} for choice in choices]
        if completion.chat:
            choices = [_chat_choice(choice) for choice in choices]
        return JSONResponse({
            "id": identity, "object": "chat.completion" if completion.chat else "text_completion",
            "created": created, "model": model_name, "choices": choices,
            "usage": {"prompt_tokens": counted_prompts, "completion_tokens": sum(completion_tokens),
                      "total_tokens": counted_prompts + sum(completion_tokens)},
        })

    async def models(request):
        check_key(request)
        return JSONResponse({"object": "list", "data": [{"id": model_name, "object": "model", "created": started,
                                                         "owned_by": "gptlite"}]})

    async def health(request):
        return JSONResponse({"status": "ok", "model": model_name, "waiting": worker.waiting,
                             "compiling": worker.compiling, "chat": can_chat})

    async def attention(request):
        from gptlite import inspection

        check_key(request)
        body = await read_json(request)
        if isinstance(body, dict) and "messages" in body and can_chat:  # a conversation, as the model reads it
            try:
                body = {"text": templates.render_for(model.tokenizer, body["messages"])}
            except InputError as error:
                raise RequestError(400, str(error), "messages") from None
        text = body.get("text") if isinstance(body, dict) else None
        if not isinstance(text, str) or not text:
            raise RequestError(400, "text must be a non-empty string", "text")
        if model.writes_targets:
            raise RequestError(400, "the attention view draws a language model's self-attention")
        if model.tokenizer.unknown_characters(text):
            raise RequestError(400, "the text has characters the model never saw", "text")
        maps = await asyncio.wrap_future(worker.call(lambda m: inspection.attention_maps(m, text)))
        weights = maps.weights
        return JSONResponse({"tokens": list(maps.tokens), "layers": int(weights.shape[0]),
                             "heads": int(weights.shape[1]), "weights": weights.round(4).tolist()})

    async def page(request):
        return HTMLResponse(importlib.resources.files("gptlite").joinpath("page.html").read_text(encoding="utf-8"))

    endpoints = [("/v1/completions", completions, "POST"), ("/v1/chat/completions", chat_completions, "POST"),
                 ("/v1/models", models, "GET"), ("/health", health, "GET"),
                 ("/v1/attention", attention, "POST"), ("/", page, "GET")]
    routes = [Route(path, answered(handler), methods=[method]) for path, handler, method in endpoints]
    app = Starlette(routes=routes, exception_handlers={HTTPException: http_error})
    app.state.worker = worker
    worker.start()
    return app


async def _events(job, events, identity, model_name, created, chat=False):
    """The server-sent events of a streamed completion, ending with `data: [DONE]`; a chat completion's
    chunks carry each answer's `delta`, the first its role."""
    def chunk(choices):
        return "data: " + json.dumps({"id": identity, "object": "chat.completion.chunk" if chat else "text_completion",
                                      "created": created, "model": model_name, "choices": choices}) + "\n\n"

    started = set()  # the chat choices whose role has been sent

    try:
        while True:
            event = await events.get()
            if event[0] in ("error", "failure"):
                kind = "invalid_request_error" if event[0] == "error" else "server_error"
                yield "data: " + json.dumps({"error": {"message": event[1], "type": kind}}) + "\n\n"
                break
            if event[0] == "done":
                break
            choices = [{"text": text, "index": index, "finish_reason": reason,
                        "logprobs": None if logprobs is None else dataclasses.asdict(logprobs)}
                       for index, text, reason, logprobs in event[1]]
            if chat:
                choices = [_chat_delta(choice, choice["index"] not in started) for choice in choices]
                started.update(choice["index"] for choice in choices)
            if choices:
                yield chunk(choices)
        yield "data: [DONE]\n\n"
    finally:
        # The client went away, or the stream ended: either way, stop decoding for it.
        job.cancelled = True


def _chat_choice(choice):
    """A completion's choice as a chat completion's: the text as the assistant's message."""
    return {"index": choice["index"], "message": {"role": "assistant", "content": choice["text"]},
            "logprobs": _chat_logprobs(choice["logprobs"]), "finish_reason": choice["finish_reason"]}


def _chat_delta(choice, first):
    delta = {"role": "assistant", "content": choice["text"]} if first else {"content": choice["text"]}
    return {"index": choice["index"], "delta": delta, "logprobs": _chat_logprobs(choice["logprobs"]),
            "finish_reason": choice["finish_reason"]}


def _chat_logprobs(logprobs):
    """Completions' `logprobs` (parallel lists) as chat completions give them: a list of tokens under "content"."""
    if logprobs is None:
        return None

    def entry(token, logprob):
        return {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8"))}

    return {"content": [{**entry(token, logprob), "top_logprobs": [entry(t, v) for t, v in top.items()]}
                        for token, logprob, top in zip(logprobs["tokens"], logprobs["token_logprobs"],
                                                       logprobs["top_logprobs"])]}


def serve(model_path, host="127.0.0.1", port=8000, settings=None, grace_seconds=30, name=None, say=print):
    """Load the model, then serve it until SIGTERM or Ctrl-C (finishing requests in flight), compiling its programs
    while idle meanwhile."""
    import uvicorn

    from gptlite import saving

    _check_address(host, port)
    say(f"loading {model_path} ...", flush=True)
    model = saving.load(model_path)
    settings = settings or ServeSettings()
    name = name or _model_name(model_path)
    worker = Worker(model, settings)
    worker.warm_up()  # planned before the worker starts, so that it compiles them before it waits for requests
    app = create_app(model, name, settings, worker)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=grace_seconds)
    server = uvicorn.Server(config)
    say(f"serving {name} at http://{host}:{port}/ (API at http://{host}:{port}/v1); Ctrl-C stops", flush=True)
    # uvicorn stops on SIGTERM or SIGINT once the requests in flight are answered, then raises the
    # signal again for the handler it found: a stop asked for and done is then no failure.
    handled = (signal.SIGINT, signal.SIGTERM)
    main_thread = threading.current_thread() is threading.main_thread()
    previous = {number: signal.signal(number, lambda *_: None) for number in handled} if main_thread else {}
    try:
        server.run()
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
    say("stopped", flush=True)


def _check_address(host, port):
    """Refuse an address that cannot be listened on before the model loads, rather than after."""
    import socket

    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, port))
    except OSError as error:
        raise InputError(f"cannot listen at {host}:{port}: {error.strerror or error}") from None


def _model_name(model_path):
    import pathlib

    path = pathlib.Path(model_path)
    return path.parent.name if path.name == "model.keras" and path.parent.name else path.stem
