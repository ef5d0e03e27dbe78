"""`gptlite serve`: a model behind an HTTP API that speaks OpenAI's completions format,
batching the requests that arrive together, with a page to try it at `/`.

    app = gptlite.serving.create_app(gptlite.load("runs/mine/model.keras"), "mine")
    gptlite.serving.serve("runs/mine/model.keras", port=8000)   # what `gptlite serve` does

Endpoints: `POST /v1/completions` (a prompt or a list of them; `stream: true`
for server-sent events), `GET /v1/models`, `GET /health`, `POST
/v1/attention` (the page's attention view) and `GET /` (the page).

One worker thread owns the model and decodes; the event loop only parses,
queues and streams. A request waits in a bounded queue; the worker takes
the first, gathers for `batch_window_ms` the requests that can share its
batch (the same sampling settings and no seed of their own: a seeded
request is decoded alone, so that its text is the one `gptlite.generate`
writes for that seed), up to `max_batch` rows, and decodes them as one
batch, each row with its own length and stop strings. Batches are padded
to a power of two rows (but a seeded one's), so that a handful of compiled
loops serve them all.
"""

import asyncio
import dataclasses
import importlib.resources
import itertools
import json
import math
import queue
import signal
import threading
import time
import traceback
import uuid

from gptlite.errors import GPTLiteError, InputError
from gptlite.model import Seq2Seq
from gptlite.settings import ServeSettings

DEFAULTS = dict(max_tokens=16, temperature=1.0, top_p=1.0, n=1)
MAX_BODY_BYTES = 1 << 20
FIELDS = {"model", "prompt", "max_tokens", "temperature", "top_p", "top_k", "n", "stop", "seed", "stream", "user",
          "echo", "logprobs", "presence_penalty", "frequency_penalty", "best_of", "logit_bias", "suffix",
          "stream_options"}
# Fields of OpenAI's request that are accepted only at the value that changes nothing.
NEUTRAL = {"echo": (False, None), "logprobs": (None,), "presence_penalty": (0, None), "frequency_penalty": (0, None),
           "best_of": (1, None), "logit_bias": (None,), "suffix": (None,)}


class RequestError(Exception):
    """A request the server refuses: its HTTP status and an OpenAI-style error body."""

    def __init__(self, status, message, param=None, kind="invalid_request_error", headers=None):
        super().__init__(message)
        self.status, self.param, self.kind, self.headers = status, param, kind, headers or {}

    def body(self):
        return {"error": {"message": str(self), "type": self.kind, "param": self.param, "code": None}}


@dataclasses.dataclass
class Completion:
    """A checked completions request: `prompts`, each wanting `n` choices."""

    prompts: list
    max_tokens: int
    temperature: float
    top_p: float
    top_k: int
    n: int
    stops: list
    seed: int
    stream: bool

    @property
    def rows(self):
        """Each choice's prompt, in OpenAI's order: prompt 0's n choices first."""
        return [prompt for prompt in self.prompts for _ in range(self.n)]


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
    temperature = _number(body, "temperature", float, 0.0, 2.0)
    top_p = _number(body, "top_p", float, 0.0, 1.0)
    if top_p == 0:
        raise RequestError(400, "top_p must be above 0", "top_p")
    top_k = _number(body, "top_k", int, 1, 2**31 - 1, default=None)  # above the vocabulary: every token
    n = _number(body, "n", int, 1, settings.max_n)
    seed = _number(body, "seed", int, -2**63, 2**63 - 1, default=None)
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise RequestError(400, "stream must be true or false", "stream")
    stops = body.get("stop")
    stops = [] if stops is None else [stops] if isinstance(stops, str) else stops
    if not (isinstance(stops, list) and len(stops) <= 4 and all(isinstance(s, str) and s for s in stops)):
        raise RequestError(400, "stop must be a non-empty string or a list of up to 4 of them", "stop")
    if len(prompts) * n > settings.max_batch * 4:
        raise RequestError(400, f"{len(prompts)} prompts x n={n} is more than {settings.max_batch * 4} choices", "n")
    tokenizer = model.tokenizer
    for prompt_text in prompts:
        unknown_characters = tokenizer.unknown_characters(prompt_text)
        if unknown_characters:
            raise RequestError(400, f"the prompt has characters the model never saw: {''.join(unknown_characters)!r}",
                               "prompt")
        if settings.truncate == "none" and len(tokenizer.encode(prompt_text)) > model.config.block_size:
            raise RequestError(400, f"a prompt is longer than the model's context of {model.config.block_size} "
                                    f"tokens", "prompt")
    return Completion(prompts, max_tokens, temperature, top_p, top_k, n, stops, seed, stream)


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
    """A request waiting for, or being decoded by, the worker; `emit` hands each event to the event loop."""

    rows: list  # each row's prompt
    completion: Completion
    emit: object
    cancelled: bool = False

    @property
    def key(self):
        """Requests with the same key can share a batch; a seeded one shares with none."""
        c = self.completion
        return (c.temperature, c.top_p, c.top_k) if c.seed is None else self


class Worker:
    """The one thread that owns the model: it decodes batches of queued jobs, and answers attention requests."""

    def __init__(self, model, settings):
        self.model, self.settings = model, settings
        self.jobs = queue.Queue()
        self.waiting = 0
        self._lock = threading.Lock()
        self._carried = None  # a job taken while gathering that could not join the batch
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
        """Compile, before the first request, every decode the worker can meet: each batch size it
        pads to, each prefill width, cache span and kind of step (with room in the window, and with it
        full). A server decodes for long: its steps read caches only as long as their texts need."""
        import numpy as np

        from gptlite import decoding
        from gptlite.sampling import sampler_settings

        if isinstance(self.model, Seq2Seq):
            return  # its targets decode in batches of one size (generation.TARGET_BATCH)
        decoding.keep_caches_short(self.model)
        block_size = self.model.config.block_size
        widths = {min(block_size, decoding.PREFILL_WIDTH << k)
                  for k in range(max(1, block_size // decoding.PREFILL_WIDTH).bit_length() + 1)}
        settings = sampler_settings(self.model.tokenizer.vocabulary_size, 1.0, None, 1.0)
        size = 1
        while size <= _padded(self.settings.max_batch):
            for length in sorted({1, *widths}):
                window = np.zeros((size, block_size), np.int32)
                lengths = np.full(size, length, np.int32)
                for _ in decoding.sample(self.model, window, lengths, None, 3, settings, np.int32(0)):
                    pass
            size *= 2

    def _next(self, timeout=None):
        if self._carried is not None:
            job, self._carried = self._carried, None
            return job
        return self.jobs.get(timeout=timeout)

    def _run(self):
        while True:
            item = self._next()
            if isinstance(item, tuple):
                function, future = item
                try:
                    future.set_result(function(self.model))
                except Exception as error:  # handed to the waiting request
                    future.set_exception(error)
                continue
            batch = [item]
            deadline = time.monotonic() + self.settings.batch_window_ms / 1000
            while sum(len(job.rows) for job in batch) < self.settings.max_batch:
                try:
                    job = self._next(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if isinstance(job, tuple) or job.key != item.key or \
                        sum(len(j.rows) for j in batch) + len(job.rows) > self.settings.max_batch:
                    self._carried = job
                    break
                batch.append(job)
            with self._lock:
                self.waiting -= len(batch)
            self._decode([job for job in batch if not job.cancelled])

    def _decode(self, batch):
        from gptlite.generation import RowsStream, generate_target

        if not batch:
            return
        try:
            if isinstance(self.model, Seq2Seq):
                for job in batch:
                    self._write_targets(job, generate_target)
                return
            c = batch[0].completion
            rows = [row for job in batch for row in job.rows]
            # A seeded request is alone in its batch, unpadded: its rows then draw the noise that
            # `generate` draws for the same prompts and seed.
            padding = 0 if c.seed is not None else _padded(len(rows)) - len(rows)
            stream = RowsStream(self.model, rows + [rows[0]] * padding,
                                [job.completion.max_tokens for job in batch for _ in job.rows] + [0] * padding,
                                temperature=c.temperature, top_k=c.top_k, top_p=c.top_p, seed=c.seed,
                                stops=[job.completion.stops for job in batch for _ in job.rows] + [()] * padding)
            spans = list(itertools.accumulate([0] + [len(job.rows) for job in batch]))
            done = [False] * len(batch)
            # A streamed request gets each step's text as it comes; the others theirs whole, at the end.
            texts = [[""] * len(job.rows) for job in batch]
            for step in stream:
                for index, job in enumerate(batch):
                    if done[index] or job.cancelled:
                        continue
                    first, last = spans[index], spans[index + 1]
                    if job.completion.stream:
                        job.emit(("pieces", step[first:last], stream.finish_reasons[first:last]))
                    else:
                        texts[index] = [text + piece for text, piece in zip(texts[index], step[first:last])]
                    if all(stream.finish_reasons[first:last]):
                        done[index] = True
                        self._finish(job, texts[index], stream, first, last)
                if all(done[i] or job.cancelled for i, job in enumerate(batch)):
                    break
            for index, job in enumerate(batch):
                if not done[index] and not job.cancelled:
                    self._finish(job, texts[index], stream, spans[index], spans[index + 1])
        except GPTLiteError as error:
            for job in batch:
                job.emit(("error", str(error)))
        except Exception as error:  # the worker must live on: the requests get a 500, the server keeps serving
            for job in batch:
                job.emit(("failure", f"decoding failed: {type(error).__name__}: {error}"))

    @staticmethod
    def _finish(job, texts, stream, first, last):
        reasons = [reason or "length" for reason in stream.finish_reasons[first:last]]
        if not job.completion.stream:
            job.emit(("pieces", texts, reasons))
        job.emit(("done", stream.prompt_tokens[first:last], stream.completion_tokens[first:last]))

    def _write_targets(self, job, generate_target):
        """A Seq2Seq reads each prompt as a source; its targets come whole."""
        c = job.completion
        sources = job.rows
        max_new_tokens = min(c.max_tokens, self.model.config.block_size - 1)
        targets = generate_target(self.model, sources, max_new_tokens=max_new_tokens,
                                  temperature=c.temperature, top_k=c.top_k, top_p=c.top_p, seed=c.seed, stop=c.stops)
        # A target as long as allowed was cut there; a shorter one ended with the end token or a stop string.
        lengths = [len(ids) for ids in self.model.tokenizer.encode_batch(targets)]
        reasons = ["length" if length >= max_new_tokens else "stop" for length in lengths]
        job.emit(("pieces", targets, reasons))
        prompt_tokens = [len(ids) for ids in self.model.tokenizer.encode_batch(sources)]
        completion_tokens = [length + (reason == "stop") for length, reason in zip(lengths, reasons)]
        job.emit(("done", prompt_tokens, completion_tokens))


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
        completion = parse_completion(await read_json(request), model, model_name, settings)
        loop = asyncio.get_running_loop()
        events = asyncio.Queue()
        job = _Job(completion.rows, completion, lambda event: loop.call_soon_threadsafe(events.put_nowait, event))
        try:
            worker.submit(job)
        except QueueFull:
            return error_response(RequestError(503, "the server is busy; try again shortly", kind="server_busy",
                                               headers={"Retry-After": "1"}))
        identity, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        if completion.stream:
            return StreamingResponse(_events(job, events, identity, model_name, created),
                                     media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        texts = [""] * len(job.rows)
        reasons = [None] * len(job.rows)
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
                    texts = [text + piece for text, piece in zip(texts, event[1])]
                    reasons = [reason or new for reason, new in zip(reasons, event[2])]
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
        return JSONResponse({
            "id": identity, "object": "text_completion", "created": created, "model": model_name,
            "choices": [{"text": text, "index": index, "logprobs": None, "finish_reason": reason or "length"}
                        for index, (text, reason) in enumerate(zip(texts, reasons))],
            "usage": {"prompt_tokens": counted_prompts, "completion_tokens": sum(completion_tokens),
                      "total_tokens": counted_prompts + sum(completion_tokens)},
        })

    async def models(request):
        check_key(request)
        return JSONResponse({"object": "list", "data": [{"id": model_name, "object": "model", "created": started,
                                                         "owned_by": "gptlite"}]})

    async def health(request):
        return JSONResponse({"status": "ok", "model": model_name, "waiting": worker.waiting})

    async def attention(request):
        from gptlite import inspection

        check_key(request)
        body = await read_json(request)
        text = body.get("text") if isinstance(body, dict) else None
        if not isinstance(text, str) or not text:
            raise RequestError(400, "text must be a non-empty string", "text")
        if isinstance(model, Seq2Seq):
            raise RequestError(400, "the attention view draws a language model's self-attention")
        if model.tokenizer.unknown_characters(text):
            raise RequestError(400, "the text has characters the model never saw", "text")
        maps = await asyncio.wrap_future(worker.call(lambda m: inspection.attention_maps(m, text)))
        weights = maps.weights
        return JSONResponse({"tokens": list(maps.tokens), "layers": int(weights.shape[0]),
                             "heads": int(weights.shape[1]), "weights": weights.round(4).tolist()})

    async def page(request):
        return HTMLResponse(importlib.resources.files("gptlite").joinpath("page.html").read_text(encoding="utf-8"))

    endpoints = [("/v1/completions", completions, "POST"), ("/v1/models", models, "GET"), ("/health", health, "GET"),
                 ("/v1/attention", attention, "POST"), ("/", page, "GET")]
    routes = [Route(path, answered(handler), methods=[method]) for path, handler, method in endpoints]
    app = Starlette(routes=routes, exception_handlers={HTTPException: http_error})
    app.state.worker = worker
    worker.start()
    return app


async def _events(job, events, identity, model_name, created):
    """The server-sent events of a streamed completion, ending with `data: [DONE]`."""
    def chunk(choices):
        return "data: " + json.dumps({"id": identity, "object": "text_completion", "created": created,
                                      "model": model_name, "choices": choices}) + "\n\n"

    reported = [False] * len(job.rows)
    try:
        while True:
            event = await events.get()
            if event[0] in ("error", "failure"):
                kind = "invalid_request_error" if event[0] == "error" else "server_error"
                yield "data: " + json.dumps({"error": {"message": event[1], "type": kind}}) + "\n\n"
                break
            if event[0] == "done":
                break
            choices = []
            for index, (piece, reason) in enumerate(zip(event[1], event[2])):
                finished = reason if reason and not reported[index] else None
                if piece or finished:
                    choices.append({"text": piece, "index": index, "logprobs": None, "finish_reason": finished})
                reported[index] = reported[index] or bool(reason)
            if choices:
                yield chunk(choices)
        yield "data: [DONE]\n\n"
    finally:
        # The client went away, or the stream ended: either way, stop decoding for it.
        job.cancelled = True


def serve(model_path, host="127.0.0.1", port=8000, settings=None, grace_seconds=30, name=None, say=print):
    """Load and warm the model, then serve it until SIGTERM or Ctrl-C (finishing requests in flight)."""
    import uvicorn

    from gptlite import saving

    _check_address(host, port)
    model = saving.load(model_path)
    settings = settings or ServeSettings()
    name = name or _model_name(model_path)
    worker = Worker(model, settings)
    say(f"loading and warming {model_path} ...", flush=True)
    worker.warm_up()
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
