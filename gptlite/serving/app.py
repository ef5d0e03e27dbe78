"""The HTTP application around the worker (`create_app`), and `serve`, what `gptlite serve` runs."""

import asyncio
import dataclasses
import importlib.resources
import json
import pathlib
import signal
import threading
import time
import traceback
import uuid

from gptlite.errors import ConfigError, InputError, TooLargeError
from gptlite.serving import parsing
from gptlite.serving.parsing import MAX_BODY_BYTES, parse_chat_completion, parse_completion, RequestError
from gptlite.serving.settings import ServeSettings
from gptlite.serving.worker import Job, QueueFull, Worker
from gptlite.tasks import task as tasks
from gptlite.text import templates

# The web page's files (gptlite/web/page): the page the server serves.
_PAGE = importlib.resources.files("gptlite.web") / "page"

def create_app(model, model_name, settings=None, worker=None, film=None):
    """The Starlette application that serves `model` under `model_name`, its worker thread started; `film`: the
    `gptlite.film` of its run, which the page shows and /v1/film, /v1/trace and /v1/heads answer for."""
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.routing import Route

    endpoints = _Endpoints(model, model_name, settings or ServeSettings(), worker, film)
    routes = [Route(path, _answered(handler), methods=[method]) for path, handler, method in (
        ("/v1/completions", endpoints.completions, "POST"),
        ("/v1/chat/completions", endpoints.chat_completions, "POST"),
        ("/v1/models", endpoints.models, "GET"), ("/health", endpoints.health, "GET"),
        ("/v1/attention", endpoints.attention, "POST"), ("/v1/trace", endpoints.trace, "POST"),
        ("/v1/heads", endpoints.heads, "POST"), ("/v1/film", endpoints.film_frames, "GET"),
        ("/", endpoints.page, "GET"), ("/config.json", endpoints.page_config, "GET"),
        ("/ort/{name}", endpoints.page_file, "GET"), ("/{name}", endpoints.page_file, "GET"))]
    app = Starlette(routes=routes, exception_handlers={HTTPException: _http_error})
    app.state.worker = endpoints.worker
    endpoints.worker.start()
    return app


def _error_response(error):
    from starlette.responses import JSONResponse

    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)


def _answered(handler):
    """`handler`, its refusals (a `RequestError`) answered in OpenAI's error body, and a failure of its own
    with a 500 in that body rather than a dropped connection: the client reads what went wrong, and its
    connection stays usable."""
    async def guarded(request):
        try:
            return await handler(request)
        except RequestError as error:
            return _error_response(error)
        except Exception:
            traceback.print_exc()
            return _error_response(RequestError(500, "the server failed to answer this request; the error is in "
                                                     "its log", kind="server_error"))
    return guarded


async def _http_error(request, error):
    """Starlette's own refusals (an unknown path, a wrong method) in OpenAI's error body."""
    messages = {404: f"no such endpoint: {request.method} {request.url.path} (the API is /v1/completions and "
                     f"/v1/models)",
                405: f"{request.url.path} does not take {request.method}"}
    kind = "not_found_error" if error.status_code == 404 else "invalid_request_error"
    message = messages.get(error.status_code, error.detail)
    return _error_response(RequestError(error.status_code, message, kind=kind, headers=error.headers))


async def _read_json(request):
    """The request's body as JSON, at most MAX_BODY_BYTES of it."""
    from starlette.requests import ClientDisconnect

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


class _Endpoints:
    """The server's endpoints over one model and its worker: each method answers one route."""

    def __init__(self, model, model_name, settings, worker=None, film=None):
        self.model, self.model_name, self.settings = model, model_name, settings
        self.worker = worker or Worker(model, settings)
        self.film = film
        self.film_json = None  # the film as the page reads it, computed on the first request
        self.started = int(time.time())

    def check_key(self, request):
        if self.settings.api_key is None:
            return
        if request.headers.get("authorization", "") != f"Bearer {self.settings.api_key}":
            raise RequestError(401, "a valid API key is needed: Authorization: Bearer <key>",
                               kind="authentication_error")

    async def completions(self, request):
        self.check_key(request)
        return await self.answer(request, parse_completion(await _read_json(request), self.model, self.model_name,
                                                           self.settings))

    async def chat_completions(self, request):
        self.check_key(request)
        return await self.answer(request, parse_chat_completion(await _read_json(request), self.model,
                                                                self.model_name, self.settings))

    async def answer(self, request, completion):
        from starlette.responses import JSONResponse, StreamingResponse

        loop = asyncio.get_running_loop()
        events = asyncio.Queue()
        job = Job(completion.rows, completion, lambda event: loop.call_soon_threadsafe(events.put_nowait, event))
        try:
            self.worker.submit(job)
        except QueueFull:
            return _error_response(RequestError(503, "the server is busy; try again shortly", kind="server_busy",
                                                headers={"Retry-After": "1"}))
        identity, created = f"{'chatcmpl' if completion.chat else 'cmpl'}-{uuid.uuid4().hex}", int(time.time())
        if completion.stream:
            return StreamingResponse(_events(job, events, identity, self.model_name, created, completion.chat),
                                     media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        try:
            answered = await _whole(request, job, events)
        except asyncio.CancelledError:
            job.cancelled = True
            raise
        if not isinstance(answered, tuple):
            return answered  # the client went away, or the request failed
        choices, prompt_tokens, completion_tokens = answered
        counted_prompts = sum(prompt_tokens[::completion.n])  # each prompt once, as OpenAI counts
        choices = [{**choice, "finish_reason": choice["finish_reason"] or "length"} for choice in choices]
        if completion.chat:
            choices = [_chat_choice(choice) for choice in choices]
        return JSONResponse({
            "id": identity, "object": "chat.completion" if completion.chat else "text_completion",
            "created": created, "model": self.model_name, "choices": choices,
            "usage": {"prompt_tokens": counted_prompts, "completion_tokens": sum(completion_tokens),
                      "total_tokens": counted_prompts + sum(completion_tokens)},
        })

    async def models(self, request):
        from starlette.responses import JSONResponse

        self.check_key(request)
        return JSONResponse({"object": "list", "data": [{"id": self.model_name, "object": "model",
                                                         "created": self.started, "owned_by": "gptlite"}]})

    async def health(self, request):
        from starlette.responses import JSONResponse

        # 503 while warming, as a load balancer's probe expects of a server not ready for traffic yet.
        status = self.worker.status()
        chats = tasks.request_refusal(self.model, "messages") is None
        return JSONResponse({**status, "model": self.model_name, "chat": chats},
                            status_code=200 if status["status"] == "ok" else 503)

    async def text_of(self, request, view, body=None):
        """The text a view of the model reads (`view`: "attention" or "trace"): a request's `text`, or its
        `messages` as the chat template renders them; refused where the model's task has no such view."""
        self.check_key(request)
        body = await _read_json(request) if body is None else body
        tokenizer = self.model.tokenizer
        # A conversation, as the model reads it.
        if isinstance(body, dict) and "messages" in body and tasks.request_refusal(self.model, "messages") is None:
            try:
                body = {"text": templates.render_for(tokenizer, body["messages"])}
            except InputError as error:
                raise RequestError(400, str(error), "messages") from None
        text = body.get("text") if isinstance(body, dict) else None
        if not isinstance(text, str) or not text:
            raise RequestError(400, "text must be a non-empty string", "text")
        refusal = tasks.request_refusal(self.model, view)
        if refusal is not None:
            raise RequestError(400, refusal)
        if tokenizer.unknown_characters(text):
            raise RequestError(400, "the text has characters the model never saw", "text")
        return text

    async def attention(self, request):
        from starlette.responses import JSONResponse

        from gptlite.inside import inspection

        text = await self.text_of(request, "attention")
        maps = await asyncio.wrap_future(self.worker.call(lambda m: inspection.attention_maps(m, text)))
        weights = maps.weights
        return JSONResponse({"tokens": list(maps.tokens), "layers": int(weights.shape[0]),
                             "heads": int(weights.shape[1]), "weights": weights.round(4).tolist()})

    async def trace(self, request):
        """Every step of the model's forward pass over the text (`gptlite.trace`; a Seq2Seq's over the source `text`
        and its `target`, `gptlite.trace_target`), as the Inside view reads it (its arrays packed), with the
        sampling settings the view offers. `ablate` ([[layer, head], ...]; a Seq2Seq's [layer, head, part]) and
        `ablation` knock heads out, `layers` keeps only those blocks' steps; a trace past what one holds is a 413.
        A text longer than the context is read as its last window, or with `position` in the window the writer read
        that token in; `text_ids` are the whole text's. The attention weights, the same for every text, come only
        with `"weights": true`."""
        from starlette.responses import JSONResponse

        from gptlite.decode.settings import sampling_settings
        from gptlite.inside.trace import text_ids

        body = await _read_json(request)
        text = await self.text_of(request, "trace", body)
        target = body.get("target")  # a Seq2Seq's: what it wrote for the source `text`
        if target is not None and not isinstance(target, str):
            raise RequestError(400, "target must be a string", "target")
        options = parsing.trace_options(body)
        weights = body.get("weights", False)
        if not isinstance(weights, bool):
            raise RequestError(400, "weights must be true or false", "weights")
        frame = parsing.film_frame(body, self.film)

        def traced(model):
            model = model if frame is None else self.film.loaded(frame)
            try:
                found = tasks.traced(model, text, target, **options).to_json(packed=True, weights=weights)
                # The whole text's ids, of which the trace is one window (a Seq2Seq's target is read whole).
                whole = text_ids(model, text) if tasks.reads(model) == "prompt" else found["ids"]
                return {"trace": found, "text_ids": [int(i) for i in whole]}
            except TooLargeError as error:
                return RequestError(413, str(error), "layers")
            except (InputError, ConfigError) as error:
                return RequestError(400, str(error), "target" if target is not None else "text")

        answer = await asyncio.wrap_future(self.worker.call(traced))
        if isinstance(answer, RequestError):
            raise answer
        return JSONResponse({**answer, "sampling": sampling_settings()})

    async def heads(self, request):
        """Every head of the model scored on a text (`gptlite.heads`, without calibrating unless `"calibrate":
        true`): the text as `text` or `messages`, or as token `ids` (the Inside view's window); the report as
        `HeadReport.to_json` gives it."""
        from starlette.responses import JSONResponse

        from gptlite.inside.heads import heads

        body = await _read_json(request)
        ids = parsing.token_ids(body)
        if ids is None:
            text = await self.text_of(request, "trace", body)
        else:
            self.check_key(request)
            text = ids
        calibrate = body.get("calibrate", False)
        if not isinstance(calibrate, bool):
            raise RequestError(400, "calibrate must be true or false", "calibrate")
        frame = parsing.film_frame(body, self.film)

        def scored(model):
            model = model if frame is None else self.film.loaded(frame)
            try:
                return heads(model, text, calibrate=calibrate).to_json()
            except (InputError, ConfigError) as error:
                return RequestError(400, str(error), "text" if ids is None else "ids")

        answer = await asyncio.wrap_future(self.worker.call(scored))
        if isinstance(answer, RequestError):
            raise answer
        return JSONResponse(answer)

    async def film_frames(self, request):
        """The served run's film as the page's film view reads it (`Film.to_json`), computed on the worker's thread
        the first time (its frames' models run there, one at a time, as the served model does)."""
        from starlette.responses import JSONResponse

        self.check_key(request)
        if self.film is None:
            raise RequestError(404, "this server shows no film: serve the model with `film` on",
                               kind="not_found_error")
        if self.film_json is None:
            self.film_json = await asyncio.wrap_future(self.worker.call(lambda model: self.film.to_json()))
        return JSONResponse(self.film_json)

    async def page(self, request):
        """The web page (`gptlite export --format web`'s), which reads `/config.json` and so writes through this
        server's API and explains with its traces."""
        from starlette.responses import HTMLResponse

        return HTMLResponse((_PAGE / "index.html").read_text(encoding="utf-8"))

    async def page_config(self, request):
        from starlette.responses import JSONResponse

        from gptlite.web.export import server_config

        return JSONResponse(server_config(self.model, self.model_name,
                                          tasks.request_refusal(self.model, "messages") is None,
                                          film=self.film is not None))

    async def page_file(self, request):
        """The page's scripts and look (and ONNX Runtime Web's script, which it loads though it runs nothing here)."""
        from starlette.responses import Response

        from gptlite.web.export import PAGE_FILES, RUNTIME_FILES

        name = request.path_params["name"]
        folder = _PAGE / "ort" if request.url.path.startswith("/ort/") else _PAGE
        served = RUNTIME_FILES if folder != _PAGE else [name for name in PAGE_FILES if name != "index.html"]
        if name not in served:
            raise RequestError(404, f"no such file: {request.url.path}", kind="not_found_error")
        kinds = {".js": "text/javascript", ".mjs": "text/javascript", ".css": "text/css", ".wasm": "application/wasm"}
        return Response((folder / name).read_bytes(), media_type=kinds.get(pathlib.PurePath(name).suffix,
                                                                           "text/plain"))


async def _whole(request, job, events):
    """A request's choices once the worker has written them whole, with its (prompt tokens, completion tokens);
    or the response to send instead: an error, or nothing for a client that went away."""
    from starlette.responses import JSONResponse

    choices = [{"text": "", "index": index, "logprobs": None, "finish_reason": None} for index in range(len(job.rows))]
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
            return choices, event[1], event[2]
        else:
            status = 400 if event[0] == "error" else 500
            return _error_response(RequestError(status, event[1], kind="invalid_request_error" if status == 400
                                                else "server_error"))


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


# How long an idle keep-alive connection stays open. Longer than the 5 s after which httpx (under the OpenAI
# client) drops an idle connection itself: with uvicorn's own 5 s the two closed it together, and a request sent on
# it as the server closed it was reset (the client sees a connection error).
KEEP_ALIVE_SECONDS = 75


def http_server(app, host, port, grace_seconds=30):
    """uvicorn's server for `app`, as `serve` runs it: quiet below warnings, idle connections kept
    KEEP_ALIVE_SECONDS, requests in flight given `grace_seconds` to finish when it stops."""
    import uvicorn

    return uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning",
                                         timeout_keep_alive=KEEP_ALIVE_SECONDS,
                                         timeout_graceful_shutdown=grace_seconds))


def serve(model_path, host="127.0.0.1", port=8000, settings=None, grace_seconds=30, name=None, say=print,
          film=False):
    """Load the model, then serve it until SIGTERM or Ctrl-C (finishing requests in flight), compiling its programs
    while idle meanwhile; with `film`, the film of its run (in the model's folder) too."""
    import uvicorn  # noqa: F401 (first: without the serve extra this fails before the model loads)

    from gptlite.weights import saving

    _check_address(host, port)
    movie = None
    if film:  # said at once where the run kept none
        from gptlite.inside.film import Film

        movie = Film(pathlib.Path(model_path).parent)
    say(f"loading {model_path} ...", flush=True)
    model = saving.load(model_path)
    settings = settings or ServeSettings()
    name = name or _model_name(model_path)
    worker = Worker(model, settings)
    say(f"serving {name} at http://{host}:{port}/ (API at http://{host}:{port}/v1); Ctrl-C stops", flush=True)
    warming = time.monotonic()
    # Planned before the worker starts, so that it builds them before it waits for requests.
    worker.warm_up(on_ready=lambda: say(f"ready: {worker.planned} decoding programs built in "
                                        f"{time.monotonic() - warming:.1f} s" if worker.planned else "ready",
                                        flush=True))
    if not worker.ready:
        say(f"warming up: building {worker.planned} decoding programs; /health says ready once they are built "
            f"(requests are served meanwhile)", flush=True)
    app = create_app(model, name, settings, worker, movie)
    server = http_server(app, host, port, grace_seconds)
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
