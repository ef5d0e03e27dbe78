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
queues and streams. The worker keeps one `gptlite.decode.engine.Engine` running:
between any two of its calls (`DECODE_STEPS` tokens at most) it admits the
requests that have arrived into the running batch (continuous batching:
nobody waits for somebody else's long answer), each row with its own
sampling settings, seed, length and stop strings, and retires the rows that
have ended, were cancelled or whose client went away. A seeded request's
text is the one `gptlite.generate` writes for that prompt and seed, whatever
shares its batch. The programs requests need are built before `/health`
says ready (`Worker.warm_up`); with the on-disk compile cache
(`gptlite.compile_cache`) a second start finds them compiled.

The room's modules: `settings` says how the server batches and what it
allows (`ServeSettings`); `parsing` checks a request's body and says what it
asks for (a `Completion`) or why not (a `RequestError`); `worker` owns the
model and its decoding; `app` is the HTTP application around them and
`serve`, what the command runs.
"""

import importlib

from gptlite.serving.settings import ServeSettings  # plain Python: the command reads it before Keras starts

# The names loaded on first use, and their modules: the worker imports Keras, which the command starts only after
# choosing its backend.
_LAZY = {"create_app": "app", "serve": "app", "Worker": "worker", "MAX_BODY_BYTES": "parsing",
         "Completion": "parsing", "RequestError": "parsing", "parse_chat_completion": "parsing",
         "parse_completion": "parsing"}
__all__ = sorted(["ServeSettings", *_LAZY])


def __getattr__(name):
    if name not in _LAZY:
        raise AttributeError(f"module 'gptlite.serving' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"gptlite.serving.{_LAZY[name]}"), name)
    globals()[name] = value
    return value
