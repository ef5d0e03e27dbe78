"""The web export: the decoding step as ONNX beside Keras's logits for every switch, the page's JavaScript (its
tokenizer, chat template, noise and sampler) beside Python's under Node, the refusals, and the page itself in
headless Chromium writing what gptlite writes.
"""

import functools
import http.server
import json
import shutil
import subprocess
import threading
import time
import urllib.parse

import keras
import numpy as np
import pytest

import gptlite
from conftest import built_once, last_logits, REPO, TIE
from test_gguf_export import _train, _untrained, KINDS, SHAPE, TEXT, TRICKY, _conversations, _tokenizer
from test_pretrained import bpe, hugging_face_folder  # noqa: F401 (fixtures: a tiny GPT-2 saved by transformers)
from gptlite.text import templates
from gptlite.web import export as web_export, onnx_graph
from gptlite.web.tokenizer_form import web_form

SAME_ON_EVERY_BACKEND = pytest.mark.once("the graph is written from the weights, alike on every backend")
PAGE_SCRIPTS = REPO / "gptlite" / "web" / "page"
# Each kind of model the page runs: the GGUF tests' kinds, and post-norm blocks, which llama.cpp has not.
WEB_KINDS = {**{kind: KINDS[kind][:2] for kind in ("char", "bpe", "modern", "llama", "qwen2", "smollm2", "tinyllama",
                                                    "lora", "chat", "chat_bpe")},
             "post_norm": (dict(norm_position="post", mlp="relu2"), "char")}


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # the requests are not news
        pass


def _model(kind):
    if kind == "lora":  # adapters beside the weights, which the graph holds merged
        model = _untrained(kind)
        model.enable_lora(4)
        for weight in model.trainable_weights:
            if weight.path.endswith("lora_b"):
                weight.assign(np.random.default_rng(0).normal(0, 0.05, weight.shape).astype("float32"))
        return model
    if kind in KINDS:
        return _untrained(kind)
    settings, tokenizer_kind = WEB_KINDS[kind]
    tokenizer = _tokenizer(tokenizer_kind)
    keras.utils.set_random_seed(0)
    model = gptlite.GPT(vocab_size=tokenizer.vocabulary_size, tokenizer=tokenizer, **SHAPE, **settings)
    model.build((None, SHAPE["block_size"]))
    return model


def _session(model, outtype="f32"):
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    return onnxruntime.InferenceSession(onnx_graph.decoder_graph(model, outtype).SerializeToString(), options,
                                        providers=["CPUExecutionProvider"])


def _onnx_logits(session, model, ids, prompt_length):
    """The graph's logits after each of ids[prompt_length - 1:]: the prompt in one call, then a call a token."""
    config = model.config
    feeds = {name: np.zeros((1, config.kv_heads, 0, config.head_size), np.float32)
             for name in onnx_graph.cache_names(config.n_layer)}
    names = [output.name for output in session.get_outputs()]
    logits, attention = [], []
    for start, end in [(0, prompt_length)] + [(t, t + 1) for t in range(prompt_length, len(ids))]:
        out = dict(zip(names, session.run(None, {"input_ids": np.asarray([ids[start:end]], np.int64), **feeds})))
        feeds = {name: out[name.replace("past_", "present_")] for name in feeds}
        logits.append(out["logits"][0])
        attention.append(out["attention"])
    return np.array(logits), attention


@SAME_ON_EVERY_BACKEND
@pytest.mark.parametrize("kind", sorted(WEB_KINDS))
def test_the_graph_gives_kerass_logits_for_the_prompt_and_each_cached_step(kind):
    model = _model(kind)
    ids = [int(i) for i in model.tokenizer.encode((_conversations() if "chat" in kind else TEXT)[:300])][:30]
    logits, attention = _onnx_logits(_session(model), model, ids, 12)
    expected = keras.ops.convert_to_numpy(model(np.asarray([ids], "int32")))[0, 11:]
    scale = np.abs(expected).max()
    assert np.abs(logits - expected).max() <= 1e-4 * scale
    # The attention weights: every block's and head's, each row a distribution over the keys up to its own.
    assert attention[0].shape == (2, 4, 12, 12) and attention[-1].shape == (2, 4, 1, len(ids))
    assert np.allclose(attention[0].sum(-1), 1, atol=1e-5) and np.all(np.triu(attention[0][0, 0], 1) == 0)
    expected_weights = keras.ops.convert_to_numpy(model.attention_weights(np.asarray([ids[:12]], "int32")))
    assert np.abs(attention[0] - expected_weights[:, 0]).max() <= 1e-4


@SAME_ON_EVERY_BACKEND
@pytest.mark.parametrize("outtype, share, tolerance", [("f16", 0.6, 1e-2), ("int8", 0.35, 5e-2)])
def test_smaller_weights_shrink_the_file_and_keep_the_logits_near(outtype, share, tolerance):
    model = _model("modern")
    assert onnx_graph.decoder_graph(model, outtype).ByteSize() < share * onnx_graph.decoder_graph(model).ByteSize()
    ids = [int(i) for i in model.tokenizer.encode(TEXT[:20])]
    logits, _ = _onnx_logits(_session(model, outtype), model, ids, len(ids))
    expected = keras.ops.convert_to_numpy(model(np.asarray([ids], "int32")))[0, -1]
    assert np.abs(logits[0] - expected).max() <= tolerance * np.abs(expected).max()


@SAME_ON_EVERY_BACKEND
@pytest.mark.parametrize("outtype", ["f32", "int8"])
def test_both_graphs_read_one_weights_file_each_array_once(tmp_path, outtype):
    import onnxruntime

    model = _model("modern")
    gptlite.export_web(model, tmp_path / "site", outtype)
    size = {path.name: path.stat().st_size for path in (tmp_path / "site").iterdir() if path.is_file()}
    stored = model.count_params() * {"f32": 4, "int8": 1}[outtype]
    # The graphs hold the small arrays (norms' scales, int8's column scales), not the weights.
    assert size["weights.bin"] <= 1.1 * stored and size["model.onnx"] + size["inside.onnx"] < 2 * model.count_params()
    ids = np.asarray([[int(i) for i in model.tokenizer.encode(TEXT[:20])]], np.int64)
    inside = onnxruntime.InferenceSession(str(tmp_path / "site" / "inside.onnx"), providers=["CPUExecutionProvider"])
    expected = keras.ops.convert_to_numpy(model(ids.astype("int32")))[0]
    ones = np.ones((model.config.n_layer, model.config.n_head), np.float32)  # each head as it is
    logits = inside.run(["logits"], {"input_ids": ids, "head_scale": ones})[0]
    assert np.abs(logits - expected).max() <= (1e-4 if outtype == "f32" else 5e-2) * np.abs(expected).max()
    step = onnxruntime.InferenceSession(str(tmp_path / "site" / "model.onnx"), providers=["CPUExecutionProvider"])
    feeds = {name: np.zeros((1, model.config.kv_heads, 0, model.config.head_size), np.float32)
             for name in onnx_graph.cache_names(model.config.n_layer)}
    assert np.abs(step.run(["logits"], {"input_ids": ids, **feeds})[0][0] - logits[-1]).max() <= 1e-4 * np.abs(
        expected).max()


# --- the page's JavaScript under Node

def _node(request):
    if shutil.which("node") is None:
        pytest.skip("needs Node.js")
    done = subprocess.run(["node", str(REPO / "tests" / "web" / "web_node.mjs"), str(PAGE_SCRIPTS)],
                          input=json.dumps(request), capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


TEXTS = [TRICKY, "ROMEO:\nBut soft, what light...", "  naïve café 🙂 x²\r\n\ttabs\u00a0and\u2003spaces  ",
         "digits 1234567 and 3.14, it's 'quoted' THEY'RE", "", " ", "\n\n\n", "<|user|>1+2<|end|>", "12+30", "<|assistant|>42<|end|><|user|>"]


NEEDS_NODE = pytest.mark.extras  # skipped where `node` is not on the PATH (.ci/run's machines have it)


@NEEDS_NODE
@SAME_ON_EVERY_BACKEND
@pytest.mark.parametrize("kind", ["char", "bpe", "qwen2", "smollm", "sentencepiece", "chat", "chat_bpe"])
def test_the_pages_tokenizer_gives_pythons_ids_and_text(kind):
    tokenizer = _tokenizer(kind)
    texts = [text for text in TEXTS if not tokenizer.unknown_characters(text)]
    if kind in ("bpe", "qwen2", "smollm", "sentencepiece"):
        texts.append(TEXT[:3000])
    assert len(texts) >= 4
    answer = _node({"tokenizer": web_form(tokenizer), "texts": texts})
    for text, ids, decoded in zip(texts, answer["ids"], answer["texts"]):
        assert ids == [int(i) for i in tokenizer.encode(text)], text
        # The text of those ids as it follows earlier text, which is how the page writes each new token.
        assert decoded == tokenizer.decode_after(ids), text


@NEEDS_NODE
@SAME_ON_EVERY_BACKEND
@pytest.mark.parametrize("kind", ["chat", "chat_bpe"])
def test_the_pages_chat_gives_the_templates_ids(kind):
    tokenizer = _tokenizer(kind)
    messages = [{"role": "user", "content": "1+2"}, {"role": "assistant", "content": "3"},
                {"role": "user", "content": "40+2"}]
    pieces = web_export.chat_pieces(tokenizer)
    for count in (1, 3):
        answer = _node({"tokenizer": web_form(tokenizer), "chat": pieces, "messages": messages[:count]})
        assert answer["ids"] == templates.answer_prompt_ids(tokenizer, messages[:count])


@NEEDS_NODE
@SAME_ON_EVERY_BACKEND
def test_the_pages_noise_is_pythons_to_the_bit_and_its_sampler_chooses_as_pythons():
    from gptlite.decode.sampling import next_token_probabilities, RowSettings, sample_next_token, uniform_noise
    from gptlite.decode.settings import SamplingConfig

    pairs = [[0, 0], [1, 0], [1, 1], [12345, 199], [2**31 - 1, 7]]
    noise = _node({"noise": pairs, "vocabulary_size": 50})["noise"]
    for (seed, index), row in zip(pairs, noise):
        assert np.array_equal(np.float32(row), keras.ops.convert_to_numpy(uniform_noise(seed, index, 50)))
    rng = np.random.default_rng(0)
    cases, expected, distributions = [], [], []
    for case in range(60):
        # Logits apart by more than float rounding, so that no choice is a tie.
        logits = rng.permutation(np.arange(40, dtype=np.float32)) * 0.25 + rng.normal(size=40).astype(np.float32) * 0.01
        settings = dict(temperature=float(rng.choice([0, 0.5, 1.0, 1.5])), top_k=[None, 5, 20][case % 3],
                        top_p=[1.0, 0.9, 0.5][case // 3 % 3], min_p=[0.0, 0.05][case % 2],
                        repetition_penalty=[1.0, 1.3][case // 2 % 2])
        seed, index = int(rng.integers(2**31)), int(rng.integers(500))
        seen = sorted(set(rng.integers(0, 40, size=6).tolist()))
        cases.append(dict(logits=logits.tolist(), settings=settings, noise_of=[seed, index], seen=seen))
        counts = np.zeros((1, 40), np.float32)
        counts[0, seen] = 1
        row = RowSettings.of([SamplingConfig(**settings)], 40)
        token = sample_next_token(logits[None], row, uniform_noise([seed], [index], 40), counts)
        expected.append(int(keras.ops.convert_to_numpy(token)[0]))
        distributions.append(next_token_probabilities(logits, SamplingConfig(**settings), counts[0]))
    answer = _node({"sample": cases})
    assert answer["tokens"] == expected
    # The distribution each draw picks from, which the page's Inside view shows: Python's.
    assert np.abs(np.float32(answer["probabilities"]) - np.array(distributions)).max() <= 1e-6
    for token, distribution in zip(expected, distributions):
        assert distribution[token] > 0


@NEEDS_NODE
@SAME_ON_EVERY_BACKEND
def test_the_pages_settings_are_read_as_samplingconfig_bounds_them():
    """Each setting's box, read by the page (`settingOf`) against config.json's bounds, is refused exactly where
    SamplingConfig refuses the value (or the page's own narrower bound, which says so)."""
    from gptlite.decode.settings import SamplingConfig

    offered = {setting["name"]: setting for setting in web_export.sampling_settings()}
    assert "stop" not in offered and set(offered) < set(SamplingConfig.__dataclass_fields__)
    probes = ["", "0", "-1", "1", "0.5", "1.5", "2", "2.5", "100", "101", "4096", "4097", "abc", "1e400"]
    requests = [{"setting": setting, "text": text} for setting in offered.values() for text in probes]
    read = _node({"settings": requests})["read"]
    for request, answer in zip(requests, read):
        name, text = request["setting"]["name"], request["text"]
        try:
            value = None if text == "" else float(text)
            if value is not None and SamplingConfig.__dataclass_fields__[name].type is int and value.is_integer():
                value = int(value)
            SamplingConfig(**{name: value})
            python_takes = text != "" or request["setting"]["default"] is None
        except (gptlite.ConfigError, ValueError, OverflowError):
            python_takes = False
        setting = request["setting"]
        within_page = python_takes and (setting["most"] is None or value is None or value <= setting["most"])
        assert ("error" not in answer) == within_page, (name, text, answer)
        if "error" in answer:
            assert answer["error"] == f"{name} must be {setting['says']}; got {text or 'nothing'}"


@pytest.mark.extras
@SAME_ON_EVERY_BACKEND
def test_a_gpt2_imported_from_a_hugging_face_folder_reads_and_runs_in_the_page_as_in_gptlite(hugging_face_folder):
    model = gptlite.from_pretrained(hugging_face_folder[0])
    answer = _node({"tokenizer": web_form(model.tokenizer), "texts": TEXTS})
    assert answer["ids"] == [[int(i) for i in model.tokenizer.encode(text)] for text in TEXTS]
    ids = [int(i) for i in model.tokenizer.encode(TRICKY)][:model.config.block_size]
    logits, _ = _onnx_logits(_session(model), model, ids, len(ids) - 4)
    expected = keras.ops.convert_to_numpy(model(np.asarray([ids], "int32")))[0, len(ids) - 5:]
    assert np.abs(logits - expected).max() <= 1e-4 * np.abs(expected).max()


# --- refusals

def test_what_the_page_cannot_run_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = Tokenizer(models.WordLevel({"[UNK]": 0, "the": 1, "cat": 2}, unk_token="[UNK]"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    by_words = _model("char")
    by_words.tokenizer = gptlite.PretrainedTokenizer(words.to_str())
    with pytest.raises(gptlite.ConfigError, match="byte-level BPE .*, SentencePiece-style BPE"):
        gptlite.export_web(by_words, tmp_path / "words")
    with pytest.raises(gptlite.ConfigError, match="outtype must be one of f32, f16, int8"):
        gptlite.export_web(_model("char"), tmp_path / "q8", outtype="q8_0")
    monkeypatch.setattr(web_export, "MOST_WEIGHT_BYTES", 1000)  # as if the model were past ONNX's one file
    with pytest.raises(gptlite.ConfigError, match="one ONNX file, at most 2 GiB.*try outtype f16"):
        gptlite.export_web(_model("char"), tmp_path / "large")
    monkeypatch.undo()
    earlier = tmp_path / "earlier"
    earlier.mkdir()
    (earlier / "mine.txt").write_text("kept")
    with pytest.raises(gptlite.RunExistsError, match="already exists"):
        gptlite.export_web(_model("char"), earlier)
    assert [path.name for path in tmp_path.iterdir()] == ["earlier"] and (earlier / "mine.txt").read_text() == "kept"


@pytest.mark.once("a packaging question")
def test_the_package_ships_every_file_the_page_needs():
    """The files an export copies (the page's and ONNX Runtime Web's, its licence among them) are in the folder
    and in pyproject.toml's package data, so that a wheel holds them: a user with no npm exports a working page."""
    import fnmatch

    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib

    patterns = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"][
        "gptlite.web"]
    folder = REPO / "gptlite" / "web" / "page"
    for name in [*web_export.PAGE_FILES, *(f"ort/{name}" for name in web_export.RUNTIME_FILES)]:
        assert (folder / name).is_file(), name
        assert any(fnmatch.fnmatch(f"page/{name}", pattern) for pattern in patterns), name


def test_a_template_the_page_cannot_join_is_refused():
    counting = "{% for m in messages %}{{ loop.index }}:{{ m['content'] }}|{% endfor %}>"
    tokenizer = gptlite.CharTokenizer.from_text("0123456789:|>abcdefghijklmnopqrstuvwxyz-+").with_chat_tokens(
        templates.TURN_MARKERS, counting)
    with pytest.raises(gptlite.ConfigError, match="joins a chat template's turns"):
        web_export.chat_pieces(tokenizer)


@pytest.mark.slow
def test_the_export_command_writes_the_folder_and_refuses_an_existing_one(tmp_path):
    from conftest import run_python

    model = _model("char")
    gptlite.save(model, tmp_path / "model.keras")
    done = run_python("-m", "gptlite", "export", "--model", str(tmp_path / "model.keras"), "--format", "web",
                      "--outtype", "f16", "--out", str(tmp_path / "site"))
    assert done.returncode == 0, done.stderr
    assert "wrote" in done.stdout and "http.server" in done.stdout
    files = sorted(str(path.relative_to(tmp_path / "site")) for path in (tmp_path / "site").rglob("*")
                   if path.is_file())
    assert files == sorted(["README.md", "config.json", "model.onnx", "inside.onnx", "weights.bin", "tokenizer.json",
                            *web_export.PAGE_FILES, *(f"ort/{name}" for name in web_export.RUNTIME_FILES)])
    again = run_python("-m", "gptlite", "export", "--model", str(tmp_path / "model.keras"), "--format", "web",
                       "--out", str(tmp_path / "site"))
    assert again.returncode != 0 and "already exists" in again.stderr and "Traceback" not in again.stderr
    assert "--overwrite" in again.stderr
    half = (tmp_path / "site" / "weights.bin").stat().st_size
    again = run_python("-m", "gptlite", "export", "--model", str(tmp_path / "model.keras"), "--format", "web",
                       "--out", str(tmp_path / "site"), "--overwrite")
    assert again.returncode == 0, again.stderr
    assert (tmp_path / "site" / "weights.bin").stat().st_size > 1.5 * half  # f32 in f16's place
    assert sorted(path.name for path in tmp_path.iterdir()) == ["model.keras", "site"]  # nothing left beside it


# --- the page in a browser

PROMPTS = ["the cat sat on", "a big hat ", ""]
BROWSER_KINDS = ("char", "bpe", "modern", "tinyllama", "post_norm", "chat", "lora")


@pytest.fixture(scope="module")
def site():
    """Each kind's model trained for a few seconds and its page, all under one folder served from 127.0.0.1:
    (the folder's address, kind -> model). Built once a session (`built_once`): every process that runs a
    browser test reads the models back rather than training them again."""
    def build(folder):
        for kind in BROWSER_KINDS:
            model = _model(kind)
            _train(model, model.tokenizer, text=_conversations() if kind == "chat" else TEXT)
            gptlite.export_web(model, folder / kind)
            gptlite.save(model, folder / f"{kind}.keras")

    root, _ = built_once("web_pages", build)
    models = {kind: gptlite.load(root / f"{kind}.keras") for kind in BROWSER_KINDS}
    handler = functools.partial(_QuietHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}", models
    server.shutdown()


def _written(browser, url, **query):
    """What the page at `url` writes for the query (`run=1`): (its state, the text in #output, the message)."""
    from selenium.webdriver.common.by import By

    browser.get(f"{url}/?{urllib.parse.urlencode({**query, 'run': 1})}")
    output = browser.find_element(By.ID, "output")
    deadline = time.monotonic() + 120
    while output.get_attribute("data-state") not in ("done", "error") and time.monotonic() < deadline:
        time.sleep(0.05)
    # textContent, not Selenium's .text, which trims the white space a model may write at the ends.
    return (output.get_attribute("data-state"), output.get_attribute("textContent"),
            browser.find_element(By.ID, "message").text)


def logits_before_each(model, prompt_ids, new_ids):
    """Keras's logits (N, V) before each of the N new ids, by its whole forward pass over the window before it (the
    last block_size ids)."""
    context, windows = list(prompt_ids), []
    for token in new_ids:
        windows.append(context[-model.config.block_size:])
        context.append(token)
    return np.concatenate([last_logits(model, windows[start:start + 64]) for start in range(0, len(windows), 64)])


def assert_greedy_ids(logits, new_ids):
    """Each new id is the likeliest of its `logits_before_each` row, up to a tie (TIE): true of a correct decoder
    on any CPU, whatever it writes."""
    chosen = logits[np.arange(len(new_ids)), new_ids]
    assert np.all(chosen >= logits.max(axis=1) - TIE), np.flatnonzero(chosen < logits.max(axis=1) - TIE)[:5]


@pytest.mark.slow
@pytest.mark.extras
@SAME_ON_EVERY_BACKEND
@pytest.mark.parametrize("kind", BROWSER_KINDS)
def test_the_page_writes_greedily_what_python_writes(site, browser, kind):
    url, models = site
    model = models[kind]
    for prompt in (["1+2", "17+25"] if kind == "chat" else PROMPTS):
        state, text, message = _written(browser, f"{url}/{kind}", prompt=prompt, max_new_tokens=200, temperature=0)
        assert state == "done", message
        ids = json.loads(browser.find_element("id", "output").get_attribute("data-ids"))
        if kind == "chat":
            prompt_ids = templates.answer_prompt_ids(model.tokenizer, [{"role": "user", "content": prompt}])
            assert ids and len(ids) < 200  # an answer ends at its end of turn
            python = gptlite.reply(model, [{"role": "user", "content": prompt}], 200, temperature=0)
        else:
            from gptlite.decode.generation import prompt_ids as ids_of

            prompt_ids = ids_of(model.tokenizer, prompt)
            assert len(ids) == 200
            python = gptlite.generate(model, prompt, 200, temperature=0)[len(prompt):]
        logits = logits_before_each(model, prompt_ids, ids)
        assert_greedy_ids(logits, ids)
        assert text == (prompt if kind != "chat" else "") + model.tokenizer.decode(ids)
        # The same text as Python's wherever no step is a tie (on this machine, every one so far).
        top_two = np.sort(logits, axis=1)[:, -2:]
        a_step_is_a_tie = bool(np.any(top_two[:, 1] - top_two[:, 0] < TIE))
        assert (text[len(prompt):] if kind != "chat" else text) == python or a_step_is_a_tie


@pytest.mark.slow
@pytest.mark.extras
@SAME_ON_EVERY_BACKEND
def test_the_page_refuses_bad_input_in_a_line_and_writes_a_seeded_sample_as_python(site, browser):
    url, models = site
    state, _, message = _written(browser, f"{url}/char", prompt="Ω unknown", max_new_tokens=20)
    assert state == "error" and "never saw in training" in message and "Ω" in message
    from selenium.webdriver.common.by import By

    state, _, message = _written(browser, f"{url}/char", prompt="the", max_new_tokens=10**6)
    assert state == "error" and "max_new_tokens must be a whole number from 0 to 4,096" in message
    # top_p 0 keeps nothing: refused, as SamplingConfig refuses it.
    state, _, message = _written(browser, f"{url}/char", prompt="the", top_p=0)
    assert state == "error" and "top_p must be a number above 0 and at most 1; got 0" in message
    state, text, message = _written(browser, f"{url}/char", prompt="the", max_new_tokens=100, temperature=0.8,
                                    seed=7, top_k=20, top_p=0.9)
    assert state == "done", message
    assert text == gptlite.generate(models["char"], "the", 100, temperature=0.8, seed=7, top_k=20, top_p=0.9)
    # Inside: the text read whole, the last token chosen, what it attends to and what it might be followed by.
    inside = browser.find_element(By.ID, "inside")
    deadline = time.monotonic() + 60
    while inside.get_attribute("data-state") != "done" and time.monotonic() < deadline:
        time.sleep(0.05)
    shown = browser.execute_script("return window.gptliteInside()")
    assert len(shown["ids"]) == min(103, models["char"].config.block_size) and shown["token"] == len(shown["ids"]) - 1
    assert abs(sum(shown["attention"]) - 1) <= 1e-5 and shown["probabilities"]
    # A page left open warms its model meanwhile (Writer.warm); Generate clicked then, mid-warm-up, writes the same.
    query = dict(prompt="the", max_new_tokens=100, temperature=0.8, seed=7, top_k=20, top_p=0.9)
    browser.get(f"{url}/char/?{urllib.parse.urlencode(query)}")
    output = browser.find_element(By.ID, "output")
    while output.get_attribute("data-state") != "ready":
        time.sleep(0.05)
    time.sleep(0.3)
    browser.find_element(By.ID, "generate").click()
    deadline = time.monotonic() + 60
    while output.get_attribute("data-state") != "done" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert output.get_attribute("textContent") == text
    # Stop ends the writing between two tokens, the text written so far kept.
    browser.get(f"{url}/char/?{urllib.parse.urlencode(dict(prompt='the', max_new_tokens=4096, temperature=0.8))}")
    output = browser.find_element(By.ID, "output")
    while output.get_attribute("data-state") != "ready":
        time.sleep(0.05)
    browser.find_element(By.ID, "generate").click()
    while len(output.get_attribute("textContent")) < 50:
        time.sleep(0.01)
    browser.find_element(By.ID, "stop").click()
    deadline = time.monotonic() + 60
    while output.get_attribute("data-state") != "done" and time.monotonic() < deadline:
        time.sleep(0.05)
    written = json.loads(output.get_attribute("data-ids"))
    assert output.get_attribute("data-state") == "done" and browser.find_element(By.ID, "message").text == "stopped", \
        len(written)
    assert 0 < len(written) < 4096 and output.get_attribute("textContent").startswith("the")
