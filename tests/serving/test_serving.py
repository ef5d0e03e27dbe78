"""`gptlite serve`: the OpenAI completions API over real HTTP, its refusals, batching, auth and shutdown."""

import base64
import http.client
import json
import signal
import socket
import subprocess
import sys
import threading
import time

import keras
import numpy as np
import pytest

import gptlite
from conftest import REPO, assert_greedy, filmed_run

pytest.importorskip("starlette", reason="serving needs gptlite[serve]")
httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")

from gptlite import serving  # noqa: E402 (after the check that starlette is there)

ONCE = pytest.mark.once("the HTTP layer does not depend on the backend")


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Server:
    """An app served by uvicorn on a thread, on a free port of 127.0.0.1."""

    def __init__(self, app):
        from gptlite.serving.app import http_server

        self.app = app
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = http_server(app, "127.0.0.1", self.port)  # as `gptlite serve` runs it
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.05)

    def stop(self):
        self.server.should_exit = True
        self.thread.join(timeout=30)


@pytest.fixture(scope="module")
def server(fluent_model):
    running = Server(serving.create_app(fluent_model, "words", serving.ServeSettings(batch_window_ms=50)))
    yield running
    running.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


@pytest.mark.slow
def test_the_openai_client_gets_the_text_generate_writes_for_the_same_seed(client, fluent_model):
    completion = client.completions.create(model="words", prompt="the cat", max_tokens=12, temperature=0.8, seed=4)
    assert completion.choices[0].text == gptlite.generate(fluent_model, "the cat", max_new_tokens=12,
                                                          temperature=0.8, seed=4)[len("the cat"):]
    assert completion.choices[0].finish_reason == "length"
    assert completion.usage.prompt_tokens == len("the cat") and completion.usage.completion_tokens == 12
    assert client.models.list().data[0].id == "words"
    # Three choices of one seeded request: the three rows generate writes together for that seed.
    three = client.completions.create(model="words", prompt="a ", max_tokens=6, temperature=1.0, seed=9, n=3)
    assert [choice.text for choice in three.choices] == [
        text[len("a "):] for text in gptlite.generate(fluent_model, ["a "] * 3, max_new_tokens=6, temperature=1.0,
                                                      seed=9)]


def test_a_streamed_completion_arrives_in_pieces_that_add_up_to_the_plain_one(client):
    settings = dict(model="words", prompt="a dog", max_tokens=20, temperature=0.0)
    plain = client.completions.create(**settings).choices[0].text
    pieces = [chunk.choices[0].text for chunk in client.completions.create(stream=True, **settings)
              if chunk.choices]
    assert len([piece for piece in pieces if piece]) > 1
    assert "".join(pieces) == plain and len(plain) == 20


def test_each_choice_stops_on_its_stop_string_or_its_length(client):
    completion = client.completions.create(model="words", prompt=["the ", "a "], max_tokens=30, n=2,
                                           temperature=0.0, stop=[" "])
    assert [choice.index for choice in completion.choices] == [0, 1, 2, 3]
    for choice in completion.choices:
        assert choice.finish_reason == "stop" and " " not in choice.text and choice.text
    assert completion.usage.prompt_tokens == len("the ") + len("a ")


@pytest.mark.slow
def test_requests_join_the_running_batch_whatever_their_settings(server, fluent_model, monkeypatch):
    worker = server.app.state.worker
    engine = worker.engine
    batch_sizes = []
    original = engine.step

    def step(*args, **kwargs):
        batch_sizes.append(len(engine.rows))
        time.sleep(0.05)  # a slower model: the long answer takes seconds, whatever this machine's speed
        return original(*args, **kwargs)

    monkeypatch.setattr(engine, "step", step)
    long_answer = {}

    def ask_long():
        long_answer["response"] = httpx.post(server.url + "/v1/completions", timeout=120, json={
            "prompt": "the", "max_tokens": 600, "temperature": 0.0})

    asking = threading.Thread(target=ask_long)
    asking.start()
    deadline = time.monotonic() + 60
    while not engine.rows:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    # Sent while the long one decodes, with other sampling settings: it joins the batch and ends first.
    short = httpx.post(server.url + "/v1/completions", timeout=60, json={
        "prompt": "a dog", "max_tokens": 5, "temperature": 0.7, "top_p": 0.9, "top_k": 5})
    assert short.status_code == 200 and asking.is_alive()
    asking.join(120)
    assert max(batch_sizes) >= 2
    text = long_answer["response"].json()["choices"][0]["text"]
    assert len(text) == 600
    assert_greedy(fluent_model, "the", "the" + text[:40])
    assert engine.rows == {}  # every row retired


@pytest.mark.slow
def test_logprobs_and_echo_come_as_openai_gives_them(client, fluent_model):
    from conftest import last_logits

    completion = client.completions.create(model="words", prompt="the cat", max_tokens=6, temperature=0.0,
                                           logprobs=2, echo=True)
    choice = completion.choices[0]
    assert choice.text.startswith("the cat") and len(choice.text) == len("the cat") + 6
    logprobs = choice.logprobs
    assert logprobs.tokens == list(choice.text)  # a char model: a token per character, prompt first
    assert logprobs.token_logprobs[0] is None and logprobs.text_offset == list(range(len(choice.text)))
    ids = [int(i) for i in fluent_model.tokenizer.encode(choice.text)]
    for position in range(1, len(ids)):
        logits = last_logits(fluent_model, [ids[:position][-fluent_model.config.block_size:]])[0].astype("float64")
        expected = logits - np.logaddexp.reduce(logits)
        assert logprobs.token_logprobs[position] == pytest.approx(expected[ids[position]], abs=1e-3)
        assert len(logprobs.top_logprobs[position]) == 2
        assert max(logprobs.top_logprobs[position].values()) == pytest.approx(expected.max(), abs=1e-3)
    streamed = client.completions.create(model="words", prompt="a", max_tokens=5, temperature=0.0, logprobs=1,
                                         stream=True)
    tokens = [token for chunk in streamed for choice in chunk.choices if choice.logprobs
              for token in choice.logprobs.tokens]
    assert len(tokens) == 5


def test_a_client_that_goes_away_frees_its_slot(server):
    engine = server.app.state.worker.engine
    with httpx.stream("POST", server.url + "/v1/completions", timeout=60,
                      json={"prompt": "the", "max_tokens": 1000, "temperature": 1.0, "stream": True}) as response:
        for line in response.iter_lines():
            if line.startswith("data: {"):
                break  # one piece, then the client hangs up
    deadline = time.monotonic() + 30
    while engine.rows:
        assert time.monotonic() < deadline, "the row of a client that went away kept decoding"
        time.sleep(0.05)


BAD_REQUESTS = [
    (b"{not json", 400, None),
    (b"[1, 2]", 400, None),
    (json.dumps({"prompt": 3}).encode(), 400, "prompt"),
    (json.dumps({"prompt": []}).encode(), 400, "prompt"),
    (json.dumps({"prompt": ["ok", 5]}).encode(), 400, "prompt"),
    (json.dumps({"prompt": "the", "max_tokens": -1}).encode(), 400, "max_tokens"),
    (json.dumps({"prompt": "the", "max_tokens": 10**9}).encode(), 400, "max_tokens"),
    (json.dumps({"prompt": "the", "max_tokens": "ten"}).encode(), 400, "max_tokens"),
    (json.dumps({"prompt": "the", "temperature": -0.5}).encode(), 400, "temperature"),
    (json.dumps({"prompt": "the", "temperature": True}).encode(), 400, "temperature"),
    (json.dumps({"prompt": "the", "top_p": 0}).encode(), 400, "top_p"),
    (json.dumps({"prompt": "the", "top_k": 0}).encode(), 400, "top_k"),
    (json.dumps({"prompt": "the", "n": 0}).encode(), 400, "n"),
    (json.dumps({"prompt": "the", "n": 1000}).encode(), 400, "n"),
    (json.dumps({"prompt": "the", "stop": [""]}).encode(), 400, "stop"),
    (json.dumps({"prompt": "the", "stop": 7}).encode(), 400, "stop"),
    (json.dumps({"prompt": "the", "stream": "yes"}).encode(), 400, "stream"),
    (json.dumps({"prompt": "the", "seed": 1.5}).encode(), 400, "seed"),
    (json.dumps({"prompt": "the", "model": "gpt-4"}).encode(), 404, "model"),
    (json.dumps({"prompt": "the", "bogus": 1}).encode(), 400, "bogus"),
    (json.dumps({"prompt": "the", "logprobs": 6}).encode(), 400, "logprobs"),
    (json.dumps({"prompt": "the", "echo": 1}).encode(), 400, "echo"),
    (json.dumps({"prompt": "the", "min_p": 2}).encode(), 400, "min_p"),
    (json.dumps({"prompt": "ZEBRA"}).encode(), 400, "prompt"),
    (b"x" * (serving.MAX_BODY_BYTES + 1), 413, None),
    # Whole numbers too large for a float, and for Python's conversion to text.
    *[(b'{"prompt": "the", "%s": 1%s}' % (name.encode(), b"0" * 400), 400, name)
      for name in ("max_tokens", "seed", "top_k", "n", "temperature")],
    (b'{"prompt": "the", "seed": 1%s}' % (b"0" * 5000), 400, None),
    (b'{"prompt": "the", "max_tokens": 1e999}', 400, "max_tokens"),
    (b'{"prompt": "the", "temperature": -1%s}' % (b"0" * 400), 400, "temperature"),
    (b'{"prompt": "the", "temperature": NaN}', 400, "temperature"),
    (json.dumps({"prompt": "the", "temperature": 2.5}).encode(), 400, "temperature"),
    (json.dumps({"prompt": "the", "stop": ["a", "b", "c", "d", "e"]}).encode(), 400, "stop"),
    (json.dumps({"prompt": "the", "stop": {"a": 1}}).encode(), 400, "stop"),
    (json.dumps({"prompt": "the", "top_k": 2.5}).encode(), 400, "top_k"),
    # JSON nested far deeper than Python's recursion, well under the size limit.
    (b"[" * 100_000 + b"]" * 100_000, 400, None),
]


@ONCE
def test_every_bad_request_gets_a_4xx_saying_what_is_wrong_and_the_server_keeps_serving(server):
    # One keep-alive connection for all of them: each answer leaves it usable for the next request.
    with httpx.Client(base_url=server.url, timeout=30) as http:
        for body, status, param in BAD_REQUESTS:
            response = http.post("/v1/completions", content=body, headers={"Content-Type": "application/json"})
            assert response.status_code == status, body[:60]
            error = response.json()["error"]
            assert error["message"] and error["param"] == param and len(error["message"]) < 300, body[:60]
        for method, path, status in (("GET", "/v1/completions", 405), ("GET", "/no/such/path", 404),
                                     ("POST", "/v1/embeddings", 404)):
            response = http.request(method, path)
            assert response.status_code == status
            assert response.json()["error"]["message"] and path in response.json()["error"]["message"]
        assert http.get("/health").json()["status"] == "ok"
        assert http.post("/v1/completions", json={"prompt": "the", "max_tokens": 2}).status_code == 200


@pytest.mark.slow
def test_health_says_ready_once_requests_need_no_program_built(fluent_model):
    from gptlite.decode.programs import programs_for

    settings = serving.ServeSettings(max_batch=4, batch_window_ms=50)
    programs = programs_for(fluent_model)
    made_before, built_before = programs.traces + programs.loads, programs.built
    worker = serving.Worker(fluent_model, settings)
    worker.warm_up()
    compiles = keras.backend.backend() != "torch"
    # Nothing built yet: warming, with the count of what is left (torch compiles nothing: ready at once).
    assert worker.status()["status"] == ("warming" if compiles else "ok")
    assert worker.status()["compiling"] == worker.status()["programs"] == (3 if compiles else 0)  # 3 batch sizes
    assert worker.status()["building"] == (3 if compiles else 0)  # then their loops of full windows
    running = Server(serving.create_app(fluent_model, "words", settings, worker))
    try:
        with httpx.Client(base_url=running.url, timeout=120) as http:
            deadline = time.monotonic() + 240
            while (health := http.get("/health")).status_code != 200:
                assert health.status_code == 503 and health.json()["status"] == "warming"
                assert 0 < health.json()["compiling"] <= health.json()["programs"]
                assert time.monotonic() < deadline, "the server never became ready"
                time.sleep(0.05)
            assert health.json()["status"] == "ok" and health.json()["compiling"] == 0
            # Requests of every batch size up to the largest, sampled, greedy and filtered, some past the window.
            bodies = [{"prompt": "the cat", "max_tokens": 30, "temperature": 0.7, "top_p": 0.9, "stream": True},
                      {"prompt": "a", "max_tokens": 5, "temperature": 0.0, "n": 2},
                      {"prompt": "the dog ran to", "max_tokens": 12, "top_k": 3, "seed": 1},
                      {"prompt": "", "max_tokens": 3, "min_p": 0.1}]

            def ask_all():
                answers = [None] * len(bodies)

                def ask(index):
                    answers[index] = http.post("/v1/completions", json=bodies[index])

                threads = [threading.Thread(target=ask, args=(index,)) for index in range(len(bodies))]
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join()
                return [(answer.status_code, None if body.get("stream") else
                         [choice["text"] for choice in answer.json()["choices"]])
                        for answer, body in zip(answers, bodies)]

            # At ready, while the recomputing loops are still being built: full windows recomputed by prefills.
            at_ready = ask_all()
            assert [status for status, _ in at_ready] == [200] * len(bodies)
            while (health := http.get("/health").json())["building"]:
                assert health["status"] == "ok" and health["building"] <= 3
                assert time.monotonic() < deadline, "the server never built its recomputing loops"
                time.sleep(0.05)
            if compiles:  # two threads built the plans, and no program twice (each traced or loaded once at most)
                assert programs.traces + programs.loads - made_before <= programs.built - built_before
            traces = programs_for(fluent_model).traces
            # The same text from the loops (seeded and greedy requests; the others draw a random seed).
            repeatable = [index for index, body in enumerate(bodies) if "seed" in body or body.get("temperature") == 0]
            settled = ask_all()
            assert [settled[index] for index in repeatable] == [at_ready[index] for index in repeatable]
            if compiles:
                assert programs_for(fluent_model).traces == traces  # served by the programs the warm-up built
                # More than half a batch joining one running row (the clients of rows that ended together coming
                # back): the worker's batch, shrunk to that row, grows back to take them. Built before ready too.
                from gptlite.serving.worker import ENGINE_SETTINGS

                engine = gptlite.Engine(fluent_model, resizable=True, **ENGINE_SETTINGS)
                ids = list(fluent_model.tokenizer.encode("the cat"))
                engine.admit([ids], [gptlite.SamplingConfig(seed=0)])
                engine.admit([ids] * 3, [gptlite.SamplingConfig(seed=1)] * 3)
                assert engine.capacity == 4
                engine.step(1)
                assert programs_for(fluent_model).traces == traces
    finally:
        running.stop()


@pytest.fixture(scope="module")
def chat_server(fluent_model):
    running = Server(serving.create_app(gptlite.chat_ready(fluent_model), "chat", serving.ServeSettings()))
    yield running
    running.stop()


CHAT = [{"role": "system", "content": "be a cat"}, {"role": "user", "content": "the cat"}]


@pytest.mark.slow
@ONCE  # the chat endpoint's own code; the engine under it is every suite's (the client's text above)
def test_the_openai_client_chats_plain_and_streamed(chat_server):
    from gptlite.decode import chat

    client = openai.OpenAI(base_url=chat_server.url + "/v1", api_key="unused", max_retries=0)
    model = chat_server.app.state.worker.model
    answer = client.chat.completions.create(model="chat", messages=CHAT, max_tokens=10, temperature=0.8, seed=3)
    choice = answer.choices[0]
    assert answer.object == "chat.completion" and choice.message.role == "assistant"
    assert choice.message.content == chat.reply(model, CHAT, max_new_tokens=10, temperature=0.8, seed=3)
    assert choice.finish_reason in ("stop", "length") and "<|end|>" not in choice.message.content
    assert answer.usage.prompt_tokens == len(conversations_prompt(model, CHAT))
    chunks = list(client.chat.completions.create(model="chat", messages=CHAT, max_tokens=10, temperature=0.8,
                                                 seed=3, stream=True))
    assert all(chunk.object == "chat.completion.chunk" for chunk in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(chunk.choices[0].delta.content or "" for chunk in chunks) == choice.message.content
    assert chunks[-1].choices[0].finish_reason == choice.finish_reason
    two = client.chat.completions.create(model="chat", messages=CHAT, max_tokens=4, n=2, logprobs=True,
                                         top_logprobs=2, temperature=0.0)
    assert [c.index for c in two.choices] == [0, 1] and two.choices[0].message == two.choices[1].message
    tokens = two.choices[0].logprobs.content
    assert "".join(token.token for token in tokens) in two.choices[0].message.content + "<|end|>"
    assert all(len(token.top_logprobs) == 2 and token.logprob <= 0 for token in tokens)


def conversations_prompt(model, messages):
    from gptlite.text import templates

    return templates.answer_prompt_ids(model.tokenizer, messages)


def test_bad_conversations_get_a_400_and_a_model_without_a_template_says_it_cannot_chat(chat_server, server):
    with httpx.Client(base_url=chat_server.url, timeout=30) as http:
        for body, param in (({"messages": []}, "messages"),
                            ({"messages": [{"role": "robot", "content": "hi"}]}, "messages"),
                            ({"messages": [{"role": "user"}]}, "messages"),
                            ({"messages": CHAT, "prompt": "the"}, "prompt"),
                            ({"messages": CHAT, "top_logprobs": 2}, "top_logprobs"),
                            ({"messages": [{"role": "user", "content": "QQ"}]}, "messages"),
                            ({"messages": CHAT, "temperature": 5}, "temperature")):
            response = http.post("/v1/chat/completions", json=body)
            assert response.status_code == 400, body
            assert response.json()["error"]["param"] == param, body
        assert http.post("/v1/chat/completions", json={"messages": CHAT, "max_tokens": 2}).status_code == 200
    with httpx.Client(base_url=server.url, timeout=30) as http:
        response = http.post("/v1/chat/completions", json={"messages": CHAT})
        assert response.status_code == 400 and "no chat template" in response.json()["error"]["message"]


@ONCE
def test_a_failure_inside_the_server_is_a_500_in_openais_shape_and_the_connection_goes_on(server, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr(serving.app, "parse_completion", broken)  # where the app finds it
    with httpx.Client(base_url=server.url, timeout=30) as http:
        response = http.post("/v1/completions", json={"prompt": "the", "max_tokens": 2})
        assert response.status_code == 500 and response.json()["error"]["type"] == "server_error"
        assert http.get("/health").status_code == 200  # the same connection, still open
        monkeypatch.undo()
        assert http.post("/v1/completions", json={"prompt": "the", "max_tokens": 2}).status_code == 200


@ONCE
def test_each_completion_is_dated_when_it_is_made(client):
    first = client.completions.create(model="words", prompt="the", max_tokens=1)
    time.sleep(1.1)
    second = client.completions.create(model="words", prompt="the", max_tokens=1)
    assert second.created > first.created and abs(second.created - time.time()) < 30


@ONCE
def test_an_api_key_is_needed_when_one_is_set(fluent_model):
    running = Server(serving.create_app(fluent_model, "words", serving.ServeSettings(api_key="sesame")))
    try:
        body = {"prompt": "the", "max_tokens": 2}
        assert httpx.post(running.url + "/v1/completions", json=body).status_code == 401
        wrong = httpx.post(running.url + "/v1/completions", json=body, headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401 and wrong.json()["error"]["type"] == "authentication_error"
        assert httpx.get(running.url + "/v1/models").status_code == 401
        assert httpx.get(running.url + "/health").status_code == 200  # probes need no key
        keyed = openai.OpenAI(base_url=running.url + "/v1", api_key="sesame", max_retries=0)
        assert keyed.completions.create(model="words", prompt="the", max_tokens=2).choices[0].text
    finally:
        running.stop()


@ONCE
def test_a_full_queue_answers_503_with_retry_after(fluent_model):
    settings = serving.ServeSettings(max_queue=1, batch_window_ms=0)
    worker = serving.Worker(fluent_model, settings)
    started, release = threading.Event(), threading.Event()
    worker.call(lambda model: (started.set(), release.wait(30)))  # the worker is busy until released
    running = Server(serving.create_app(fluent_model, "words", settings, worker))
    try:
        assert started.wait(30)
        body = {"prompt": "the", "max_tokens": 2}
        waiting = threading.Thread(target=httpx.post, args=(running.url + "/v1/completions",),
                                   kwargs={"json": body, "timeout": 60})
        waiting.start()
        deadline = time.monotonic() + 30
        while httpx.get(running.url + "/health").json()["waiting"] < 1:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        refused = httpx.post(running.url + "/v1/completions", json=body)
        assert refused.status_code == 503 and refused.headers["Retry-After"] == "1"
        release.set()
        waiting.join(60)
        assert httpx.post(running.url + "/v1/completions", json=body, timeout=60).status_code == 200
    finally:
        release.set()
        running.stop()


@pytest.mark.slow
def test_a_seq2seq_model_answers_the_same_endpoint_reading_prompts_as_sources(reverser, monkeypatch):
    running = Server(serving.create_app(reverser, "reverser", serving.ServeSettings(truncate="none")))
    failures = []  # what the worker caught on the way: it must be nothing
    monkeypatch.setattr(running.app.state.worker, "_fail_all", failures.append)
    try:
        client = openai.OpenAI(base_url=running.url + "/v1", api_key="unused", max_retries=0)
        completion = client.completions.create(model="reverser", prompt=["abc", "dea"], max_tokens=10,
                                               temperature=0.0)
        assert [choice.text for choice in completion.choices] == gptlite.generate_target(reverser, ["abc", "dea"])
        streamed = "".join(chunk.choices[0].text for chunk in client.completions.create(
            model="reverser", prompt="abc", max_tokens=10, temperature=0.0, stream=True) if chunk.choices)
        assert streamed == completion.choices[0].text
        # A target cut at max_tokens says so.
        cut = client.completions.create(model="reverser", prompt=["abcde", "edcba"], max_tokens=2, temperature=0.0)
        assert [choice.text for choice in cut.choices] == gptlite.generate_target(reverser, ["abcde", "edcba"],
                                                                                   max_new_tokens=2)
        for choice in cut.choices:
            assert len(choice.text) <= 2 and (choice.finish_reason == "length") == (len(choice.text) == 2)
        # truncate="none": a source longer than the model reads is refused, not cut.
        too_long = httpx.post(running.url + "/v1/completions", json={"prompt": "abcde" * 4})
        assert too_long.status_code == 400 and "longer than the model's context" in too_long.json()["error"]["message"]
        # The Inside view's trace: the source and the target written for it (`trace_target`).
        traced = httpx.post(running.url + "/v1/trace", json={"text": "abc", "target": completion.choices[0].text},
                            timeout=60)
        assert traced.status_code == 200, traced.text
        expected = gptlite.trace_target(reverser, "abc", completion.choices[0].text)
        found = traced.json()["trace"]
        assert found["source_ids"] == expected.source_ids.tolist() and found["ids"] == expected.ids.tolist()
        assert np.array_equal(_unpacked(found["layers"][0]["cross_attention"]),
                              expected.layers[0]["cross_attention"])
        wrong = httpx.post(running.url + "/v1/trace", json={"text": "abc", "target": "xyz!"}, timeout=60)
        assert wrong.status_code == 400 and "never saw" in wrong.json()["error"]["message"]
        assert failures == []
    finally:
        running.stop()


@pytest.mark.slow
def test_a_seq2seq_servers_requests_join_one_running_batch_with_their_real_finish_reasons(reverser):
    from gptlite.decode.programs import programs_for

    settings = serving.ServeSettings(max_batch=4, batch_window_ms=0)  # each request admitted as it comes
    worker = serving.Worker(reverser, settings)
    worker.warm_up()
    running = Server(serving.create_app(reverser, "reverser", settings, worker))
    try:
        with httpx.Client(base_url=running.url, timeout=120) as http:
            deadline = time.monotonic() + 240
            while http.get("/health").status_code != 200:
                assert time.monotonic() < deadline, "the server never became ready"
                time.sleep(0.05)
            traces = programs_for(reverser).traces
            sources = ["abc", "dcbae", "ab", "edcba"]
            limits = [10, 10, 1, 3]
            answers = [None] * len(sources)

            def ask(index):
                answers[index] = http.post("/v1/completions", json={
                    "prompt": sources[index], "max_tokens": limits[index], "temperature": 0.0}).json()

            threads = [threading.Thread(target=ask, args=(index,)) for index in range(len(sources))]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            if keras.backend.backend() != "torch":
                assert programs_for(reverser).traces == traces  # served by the programs built before ready
            for source, limit, answer in zip(sources, limits, answers):
                choice = answer["choices"][0]
                # Each row alone decodes what generate_target writes for it, whichever rows shared its batch.
                assert choice["text"] == gptlite.generate_target(reverser, source, max_new_tokens=limit)
                # The row's own end: its end token ("stop", counted among its tokens) or its limit ("length").
                written = len(reverser.tokenizer.encode(choice["text"]))
                if choice["finish_reason"] == "stop":
                    assert written < limit and answer["usage"]["completion_tokens"] == written + 1
                else:
                    assert choice["finish_reason"] == "length"
                    assert written == answer["usage"]["completion_tokens"] == limit
                assert answer["usage"]["prompt_tokens"] == len(source)
            # A source longer than the model reads is refused whatever `truncate` says: it is not a prompt to cut.
            too_long = http.post("/v1/completions", json={"prompt": "abcde" * 4})
            assert too_long.status_code == 400 and "source is longer" in too_long.json()["error"]["message"]
    finally:
        running.stop()


def test_the_page_is_the_web_pages_and_the_attention_endpoint_answers(server):
    page = httpx.get(server.url + "/")
    assert page.status_code == 200 and "<textarea" in page.text and 'id="inside"' in page.text
    config = httpx.get(server.url + "/config.json").json()
    assert config["server"] is True and config["name"] == "words" and config["chat"] is False
    assert [setting["name"] for setting in config["sampling"]][:2] == ["max_new_tokens", "temperature"]
    assert "/v1/completions" in httpx.get(server.url + "/server.js").text
    maps = httpx.post(server.url + "/v1/attention", json={"text": "the cat"}, timeout=60).json()
    assert maps["tokens"] == list("the cat")
    for layer in maps["weights"]:
        for head in layer:
            for row, weights in enumerate(head):
                assert sum(weights) == pytest.approx(1.0, abs=1e-3)
                assert all(weight == 0 for weight in weights[row + 1:])  # the masked triangle


def _unpacked(array):
    if "float32" in array:
        return np.frombuffer(base64.b64decode(array["float32"]), "<f4").reshape(array["dims"])
    return np.reshape(array["data"], array["dims"])


def test_the_trace_the_server_computes_is_gptlites_and_its_page_files_are_served(server, fluent_model):
    answer = httpx.post(server.url + "/v1/trace", json={"text": "the cat sat"}, timeout=60)
    assert answer.status_code == 200
    traced, expected = answer.json()["trace"], gptlite.trace(fluent_model, "the cat sat")
    assert traced["ids"] == expected.ids.tolist() and traced["vocabulary"] == expected.vocabulary
    for name, value in expected.steps.items():
        assert np.array_equal(_unpacked(traced["steps"][name]), value), name
    # The attention weights (the same for every text) come when asked for.
    with_weights = httpx.post(server.url + "/v1/trace", json={"text": "the cat sat", "weights": True},
                              timeout=60).json()["trace"]
    for found, plain, layer in zip(with_weights["layers"], traced["layers"], expected.layers):
        assert all(np.array_equal(_unpacked(found[name]), value) for name, value in layer.items())
        assert set(plain) == set(layer) - {"query_weight", "key_weight", "value_weight", "query_bias", "key_bias",
                                           "value_bias"}
    assert answer.json()["text_ids"] == expected.ids.tolist()
    assert [setting["name"] for setting in answer.json()["sampling"]][:2] == ["max_new_tokens", "temperature"]
    bad = httpx.post(server.url + "/v1/trace", json={"text": ""}, timeout=60)
    assert bad.status_code == 400 and "text must be a non-empty string" in bad.json()["error"]["message"]
    bad = httpx.post(server.url + "/v1/trace", json={"text": "the", "target": "cat"}, timeout=60)
    assert bad.status_code == 400 and "a target goes with a source" in bad.json()["error"]["message"]
    for path, kind in (("/page.js", "text/javascript"), ("/inside.js", "text/javascript"), ("/inside.css", "text/css"),
                       ("/ort/ort.wasm.min.js", "text/javascript")):
        served = httpx.get(server.url + path)
        assert served.status_code == 200 and served.headers["content-type"].startswith(kind), path
    for path in ("/model.onnx", "/ort/page.js", "/../errors.py"):
        assert httpx.get(server.url + path).status_code == 404, path


def test_the_servers_trace_knocks_heads_out_keeps_the_layers_asked_and_answers_one_too_large_with_a_413(
        server, fluent_model, monkeypatch):
    asked = {"text": "the cat sat", "ablate": [[1, 0]], "ablation": "mean", "layers": [1]}
    traced = httpx.post(server.url + "/v1/trace", json=asked, timeout=60).json()["trace"]
    expected = gptlite.trace(fluent_model, "the cat sat", ablate=[(1, 0)], ablation="mean", layers=[1])
    assert traced["layers"][0] == {} and traced["ablated"] == [[1, 0, "decoder"]] and traced["ablation"] == "mean"
    np.testing.assert_array_equal(_unpacked(traced["steps"]["logits"]), expected.steps["logits"])
    for body, status, message in (({"ablate": [[7, 0]]}, 400, "no layer 7"), ({"ablate": "1,0"}, 400, "ablate must"),
                                  ({"ablation": "half"}, 400, "ablation must"), ({"layers": [0, 9]}, 400, "no layer 9"),
                                  ({"layers": "all"}, 400, "layers must"), ({"position": -1}, 400, "position must"),
                                  ({"position": 99}, 400, "position must"), ({"weights": "yes"}, 400, "weights must")):
        answer = httpx.post(server.url + "/v1/trace", json={"text": "the cat", **body}, timeout=60)
        assert answer.status_code == status and message in answer.json()["error"]["message"], body
    # A text longer than the context, read in the window the writer read a position in.
    from gptlite.inside import trace as tracing

    text = "the cat sat " * 4
    block, whole = fluent_model.config.block_size, tracing.text_ids(fluent_model, text)
    assert len(whole) > block + 2
    answer = httpx.post(server.url + "/v1/trace", json={"text": text, "position": block + 1}, timeout=60).json()
    expected = gptlite.trace(fluent_model, text, position=block + 1)
    assert answer["trace"]["window_start"] == expected.window_start == 2 and answer["text_ids"] == list(whole)
    assert answer["trace"]["ids"] == expected.ids.tolist() == list(whole[2:block + 2])

    with monkeypatch.context() as patched:
        patched.setattr(tracing, "MOST_TRACE_NUMBERS", 1000)  # the server runs in this process
        answer = httpx.post(server.url + "/v1/trace", json={"text": "the cat"}, timeout=60)
    assert answer.status_code == 413 and "keep fewer blocks" in answer.json()["error"]["message"]
    assert httpx.post(server.url + "/v1/trace", json={"text": "the cat"}, timeout=60).status_code == 200


def test_the_servers_head_scores_are_gptlite_heads_on_a_text_or_its_ids(server, fluent_model):
    expected = gptlite.heads(fluent_model, "the cat sat on", calibrate=False)
    for body in ({"text": "the cat sat on"}, {"ids": expected.ids.tolist()}):
        answer = httpx.post(server.url + "/v1/heads", json=body, timeout=120)
        assert answer.status_code == 200, answer.text
        found = answer.json()
        for name in ("previous_token", "first_token", "current_token", "induction", "ablation"):
            np.testing.assert_allclose(found[name], getattr(expected, name), rtol=0, atol=1e-5, err_msg=name)
        assert found["loss"] == pytest.approx(expected.loss, rel=1e-5) and "initial" not in found
    for body, message in (({"ids": []}, "ids must"), ({"ids": [1, "a"]}, "ids must"),
                          ({"ids": [fluent_model.config.vocab_size]}, "token ids must"), ({"text": "t"}, "at least 2"),
                          ({"text": "the cat", "calibrate": 1}, "calibrate must")):
        answer = httpx.post(server.url + "/v1/heads", json=body, timeout=60)
        assert answer.status_code == 400 and message in answer.json()["error"]["message"], body


@pytest.fixture(scope="module")
def film_server():
    """A server of the tiny filmed run's model with its film: (the server, the film)."""
    run = filmed_run()
    movie = gptlite.film(run)
    running = Server(serving.create_app(gptlite.load(run / "model.keras"), "filmed", serving.ServeSettings(),
                                        film=movie))
    yield running, movie
    running.stop()


def test_the_server_answers_a_film_and_traces_and_scores_with_a_frame_s_model(film_server, server):
    running, movie = film_server
    shown = httpx.get(running.url + "/v1/film", timeout=120).json()
    assert [frame["step"] for frame in shown["frames"]] == [frame.step for frame in movie.frames]
    assert httpx.get(running.url + "/config.json").json()["film"] == "/v1/film"
    ids = [int(i) for i in movie.probe_ids]
    traced = httpx.post(running.url + "/v1/trace", json={"text": movie.probe, "frame": 2}, timeout=120).json()
    expected = gptlite.trace(movie.frames[2].model(), ids)
    logits = traced["trace"]["steps"]["logits"]
    found = np.frombuffer(base64.b64decode(logits["float32"]), "<f4")  # packed, as the page reads it
    np.testing.assert_allclose(found.reshape(logits["dims"]), expected.steps["logits"], atol=1e-5)
    scored = httpx.post(running.url + "/v1/heads", json={"ids": ids, "frame": 2}, timeout=120).json()
    np.testing.assert_allclose(scored["induction"], movie.heads(2).induction, atol=1e-5)
    for body, message in (({"ids": ids, "frame": len(movie)}, "frame must"), ({"ids": ids, "frame": "1"}, "frame must")):
        answer = httpx.post(running.url + "/v1/heads", json=body, timeout=60)
        assert answer.status_code == 400 and message in answer.json()["error"]["message"], body
    # A server without a film says so.
    assert httpx.get(server.url + "/v1/film").status_code == 404
    answer = httpx.post(server.url + "/v1/trace", json={"text": "the cat", "frame": 0}, timeout=60)
    assert answer.status_code == 400 and "shows no film" in answer.json()["error"]["message"]


SERVE = """
import sys
from gptlite.cli import main
sys.exit(main(["serve", *sys.argv[1:]]))
"""


@pytest.mark.slow
@ONCE
def test_a_real_process_serves_the_client_and_on_sigterm_finishes_the_request_in_flight(tmp_path, fluent_model):
    gptlite.save(fluent_model, tmp_path / "model.keras")
    port = free_port()
    process = subprocess.Popen([sys.executable, "-c", SERVE, str(tmp_path / "model.keras"), "--port", str(port),
                                "--max-batch", "1", "--name", "words"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    try:
        deadline = time.monotonic() + 240
        while True:
            assert process.poll() is None, process.stderr.read()[-2000:]
            assert time.monotonic() < deadline, "the server never became ready"
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        # An idle connection outlives the 5 s after which an HTTP client's pool drops it itself, so that the
        # client, not the server, closes it: a request sent on it as the server closed it would be reset.
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        for pause in (6, 0):
            connection.request("GET", "/health")  # the second on the same socket: it fails had the server closed it
            response = connection.getresponse()
            assert response.status == 200 and response.read() and connection.sock is not None  # kept alive
            time.sleep(pause)
        connection.close()
        # The official client against the real process, plain and streamed.
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
        plain = client.completions.create(model="words", prompt="the", max_tokens=10, temperature=0.0)
        streamed = client.completions.create(model="words", prompt="the", max_tokens=10, temperature=0.0,
                                             stream=True)
        assert "".join(chunk.choices[0].text for chunk in streamed if chunk.choices) == plain.choices[0].text
        answer = {}

        def ask():
            answer["response"] = httpx.post(f"http://127.0.0.1:{port}/v1/completions",
                                            json={"prompt": "the", "max_tokens": 400, "temperature": 0.0},
                                            timeout=120)

        asking = threading.Thread(target=ask)
        asking.start()
        time.sleep(0.5)  # the request is in flight
        process.send_signal(signal.SIGTERM)
        asking.join(120)
        assert answer["response"].status_code == 200
        assert answer["response"].json()["usage"]["completion_tokens"] == 400
        assert process.wait(60) == 0
        # It ran on the backend that writes fastest here where none was named, as generate does, and said so.
        from gptlite.backend import choice

        chosen, why = choice.writing_backend(str(tmp_path / "model.keras"))
        assert (f"backend: {chosen}, {why}" in process.stderr.read()) == (chosen is not None)
    finally:
        process.kill()


def _page_done(browser, element_id="output", states=("done", "error")):
    """The page's element's data-state once it is one of `states` (the page's contract; docs/inspection.md)."""
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(browser, 60).until(lambda _: browser.find_element("id", element_id).get_attribute("data-state")
                                     in states)
    return browser.find_element("id", element_id).get_attribute("data-state")


@pytest.mark.slow
@pytest.mark.extras
@ONCE
def test_the_page_in_a_browser_streams_text_and_shows_inside_with_the_servers_numbers(server, tmp_path, browser,
                                                                                       fluent_model):
    from selenium.webdriver.common.by import By

    browser.get(server.url + "/")
    assert _page_done(browser, states=("ready", "error")) == "ready", browser.find_element(By.ID, "message").text
    prompt = browser.find_element(By.ID, "prompt")
    prompt.clear()
    prompt.send_keys("the cat ")
    maximum = browser.find_element(By.ID, "max_new_tokens")
    maximum.clear()
    maximum.send_keys("120")
    browser.find_element(By.ID, "temperature").clear()
    browser.find_element(By.ID, "temperature").send_keys("0")
    # Count the times the text changes: streamed, it grows piece by piece, not once at the end.
    browser.execute_script("window.changes = 0; new MutationObserver(() => window.changes++)"
                           ".observe(document.getElementById('output'), {childList: true, subtree: true, "
                           "characterData: true});")
    browser.find_element(By.ID, "generate").click()
    assert _page_done(browser) == "done", browser.find_element(By.ID, "message").text
    # The text as the page holds it: Selenium's `.text` would trim whitespace the model may have ended on.
    shown = browser.execute_script("return document.getElementById('output').textContent")
    assert shown == gptlite.generate(fluent_model, "the cat ", 120, temperature=0)
    # The decode hands over its tokens in 5 calls for 120 of them (8, then 32 at a time): the page
    # shows several of those before the end.
    assert browser.execute_script("return window.changes") > 2
    # Inside, step by step: the web page's view over the trace the server computed, with gptlite's numbers.
    assert _page_done(browser, "inside") == "done", browser.find_element(By.ID, "inside").text
    inside = browser.execute_script("return window.gptliteInside()")
    expected = gptlite.trace(fluent_model, inside["ids"])
    token = inside["token"]
    assert token == len(inside["ids"]) - 1 and inside["window_start"] + len(inside["ids"]) == len(shown)
    assert len(inside["ids"]) == min(len(shown), fluent_model.config.block_size)  # characters: a token each
    assert np.array_equal(np.float32(inside["attention"]), expected.layers[0]["attention"][0, token])
    browser.find_element(By.CSS_SELECTOR, '[data-step="softmax"]').click()
    assert browser.execute_script("return window.gptliteInside().step") == "softmax"
    # A token before the last window is traced in the window the writer read it in, by the server.
    position = fluent_model.config.block_size + 3
    browser.find_element(By.CSS_SELECTOR, f'#inside [data-token="{position}"]').click()
    assert _page_done(browser, "inside") == "done"
    inside = browser.execute_script("return window.gptliteInside()")
    expected = gptlite.trace(fluent_model, shown, position=position)
    assert inside["position"] == position and inside["window_start"] == expected.window_start == 4
    assert inside["ids"] == expected.ids.tolist() and inside["token"] == len(expected.ids) - 1
    np.testing.assert_allclose(inside["attention"], expected.layers[0]["attention"][0, -1], rtol=0, atol=1e-6)
    # Every head scored by the server, as gptlite.heads scores the window shown.
    browser.find_element(By.CSS_SELECTOR, '[data-step="head_roles"]').click()
    assert _page_done(browser, "inside") == "done"
    report = gptlite.heads(fluent_model, inside["ids"], calibrate=False)
    grid = browser.execute_script("return window.gptliteInside().heads")
    for name in ("previous_token", "first_token", "current_token", "induction", "ablation"):
        np.testing.assert_allclose(grid[name], getattr(report, name), rtol=0, atol=1e-5, err_msg=name)
    # A link opens the view on its prompt, as the static page's does.
    browser.get(server.url + "/?prompt=the%20cat&token=2&layer=1&step=scores")
    assert _page_done(browser, "inside") == "done"
    assert browser.execute_script("return [window.gptliteInside().token, window.gptliteInside().layer]") == [2, 1]
    # An API key typed once is kept for the tab's session: a reload shows it again.
    browser.execute_script("const key = document.getElementById('api_key'); key.value = 'sesame';"
                           "key.dispatchEvent(new Event('input'));")
    browser.refresh()
    assert browser.find_element(By.ID, "api_key").get_attribute("value") == "sesame"
    screenshot = tmp_path / "page.png"
    browser.save_screenshot(str(screenshot))
    assert screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    print(f"screenshot of the page: {screenshot}")


@pytest.mark.slow
@pytest.mark.extras
@ONCE
def test_the_chat_page_in_a_browser_streams_answers_and_shows_the_conversation_inside(chat_server, tmp_path,
                                                                                       browser):
    from selenium.webdriver.common.by import By

    browser.get(chat_server.url + "/")
    # A model with a chat template opens as a conversation, with its system message.
    assert _page_done(browser, states=("ready", "error")) == "ready", browser.find_element(By.ID, "message").text
    assert browser.find_element(By.ID, "system").is_displayed()
    browser.find_element(By.ID, "system").send_keys("be a cat")
    maximum = browser.find_element(By.ID, "max_new_tokens")
    maximum.clear()
    maximum.send_keys("60")
    for question in ("the cat", "and the dog"):
        browser.find_element(By.ID, "prompt").send_keys(question)
        browser.find_element(By.ID, "generate").click()
        assert _page_done(browser) == "done", browser.find_element(By.ID, "message").text
        assert _page_done(browser, "inside") == "done"
        browser.execute_script("document.getElementById('output').dataset.state = 'asked'")
    turns = browser.find_element(By.ID, "conversation").get_attribute("textContent")
    assert turns.startswith("you: the cat\nmodel: ") and "\nyou: and the dog\nmodel: " in turns
    # The conversation as the model reads it, system message and turn markers, traced by the server.
    inside = browser.execute_script("return window.gptliteInside()")
    pieces = browser.execute_script("return window.gptliteTrace().vocabulary")
    assert pieces[inside["ids"][-1]] == "<|end|>"
    screenshot = tmp_path / "chat_page.png"
    browser.save_screenshot(str(screenshot))
    assert screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    print(f"screenshot of the chat page: {screenshot}")
    browser.find_element(By.ID, "new_chat").click()
    assert browser.find_element(By.ID, "conversation").text == ""


@pytest.mark.slow
@pytest.mark.extras
@ONCE
def test_the_served_page_shows_the_film_and_the_inside_of_a_frame_with_the_servers_numbers(film_server, browser):
    running, movie = film_server
    step = movie.frames[3].step
    browser.get(f"{running.url}/?frame={step}")
    assert _page_done(browser, "film", ("done",)) == "done"
    shown = browser.execute_script("return window.gptliteFilm()")
    assert shown["frame"] == 3 and [frame["step"] for frame in shown["frames"]] == [f.step for f in movie.frames]
    np.testing.assert_allclose(shown["heads"]["previous_token"], movie.heads(3).previous_token, atol=1e-5)
    assert _page_done(browser, "inside") == "done", browser.find_element("id", "inside").text
    trace = browser.execute_script("return window.gptliteTrace()")
    expected = gptlite.trace(movie.frames[3].model(), movie.probe_ids)
    logits = trace["steps"]["logits"]
    np.testing.assert_allclose(np.asarray(logits["data"]).reshape(logits["dims"]), expected.steps["logits"],
                               atol=1e-5)
    assert f"frame={step}" in browser.current_url
