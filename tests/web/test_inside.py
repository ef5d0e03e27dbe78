"""The Inside view: the inside graph against gptlite.trace for every switch (ONNX Runtime in Python), then the page in
headless Chromium through its contract (window.gptliteInside, #inside's data-state): its numbers against Python's,
the state a link opens, a link's mistakes, a phone's width, the keyboard alone, the writer's draw; and the notebook's
view of a Python trace, saved to a file, in the same browser."""

import json
import re
import time
import urllib.parse

import numpy as np
import pytest

import gptlite
from conftest import REPO, TIE
from test_export import _model, BROWSER_KINDS, SAME_ON_EVERY_BACKEND, site, WEB_KINDS  # noqa: F401 (site: a fixture)
from test_gguf_export import _conversations, TEXT
from gptlite.inside import notebook
from gptlite.web import onnx_graph

FIXTURES = REPO / "tests" / "fixtures"
# Every step the view shows, as its buttons name them, for a GPT with every switch (QK-norm, rotary).
ALL_STEPS = ["tokens", "embedding", "position", "norm", "qkv", "qk_norm", "rotary", "scores", "mask", "softmax",
             "values", "heads", "residual", "feed_forward", "feed_forward_residual", "final_norm", "logits",
             "probabilities", "graph", "head_roles"]


def _inside_session(model):
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    return onnxruntime.InferenceSession(onnx_graph.inside_graph(model).SerializeToString(), options,
                                        providers=["CPUExecutionProvider"])


def _run(session, model, **given):
    """The inside graph's every output by name, for the inputs `given`, each head scaled by 1 unless given."""
    ones = np.ones((model.config.n_layer, model.config.n_head), np.float32)
    inputs = {name: ones for name in onnx_graph.HEAD_SCALES.values()
              if name in [given.name for given in session.get_inputs()]}
    names = [output.name for output in session.get_outputs()]
    return dict(zip(names, session.run(None, {**inputs, **given})))


def assert_near(found, expected, what):
    """`found` within 1e-4 of `expected`'s scale (its largest magnitude, at least 1e-6)."""
    found, expected = np.asarray(found, np.float64), np.asarray(expected, np.float64)
    assert found.shape == expected.shape, (what, found.shape, expected.shape)
    scale = max(np.abs(expected).max(), 1e-6)
    assert np.abs(found - expected).max() <= 1e-4 * scale, (what, np.abs(found - expected).max(), scale)


def assert_same_trace(arrays, layers, trace):
    """Every array of a trace (by name: steps, then each layer's) as `trace`'s, ids exactly where no values tie."""
    assert set(arrays) == set(trace.steps) and [set(layer) for layer in layers] == [set(l) for l in trace.layers]
    for name, expected in trace.steps.items():
        if name.endswith("_ids"):  # which tokens are nearest: the same, up to ties in value
            values = trace.steps[name[:-4]]
            distinct = np.abs(np.diff(values, axis=-1)).min(axis=-1) > 1e-4
            assert np.array_equal(np.asarray(arrays[name])[distinct], expected[distinct]), name
        else:
            assert_near(arrays[name], expected, name)
    for index, (found, expected) in enumerate(zip(layers, trace.layers)):
        for name in expected:
            assert_near(found[name], expected[name], f"layer {index} {name}")


@SAME_ON_EVERY_BACKEND
@pytest.mark.parametrize("kind", sorted(WEB_KINDS))
def test_the_inside_graph_gives_every_step_of_pythons_trace(kind):
    model = _model(kind)
    text = _conversations() if "chat" in kind else TEXT
    trace = gptlite.trace(model, [int(i) for i in model.tokenizer.encode(text)][:40])
    session = _inside_session(model)
    out = _run(session, model, input_ids=trace.ids[None].astype(np.int64))
    steps = {name: value for name, value in out.items() if not name.startswith("layer_")}
    layers = [{name.split(".", 1)[1]: value for name, value in out.items() if name.startswith(f"layer_{index}.")}
              for index in range(model.config.n_layer)]
    assert_same_trace(steps, layers, trace)
    for layer in layers:
        assert np.all(np.triu(layer["attention"], 1) == 0) and np.allclose(layer["attention"].sum(-1), 1, atol=1e-5)


@SAME_ON_EVERY_BACKEND
def test_a_seq2seqs_inside_graph_gives_its_encoder_and_cross_attention_as_python():
    model = gptlite.load(FIXTURES / "made_seq2seq.keras")
    trace = gptlite.trace_target(model, "12+345", "357")
    session = _inside_session(model)
    out = _run(session, model, input_ids=trace.ids[None].astype(np.int64),
               source_ids=trace.source_ids[None].astype(np.int64))
    steps = {name: value for name, value in out.items() if "layer_" not in name}
    layers = [{name.split(".", 1)[1]: value for name, value in out.items() if name.startswith(f"layer_{index}.")}
              for index in range(model.config.n_layer)]
    assert_same_trace(steps, layers, trace)
    for index, layer in enumerate(trace.encoder_layers):
        for name, value in layer.items():
            assert_near(out[f"encoder_layer_{index}.{name}"], value, f"encoder layer {index} {name}")


@SAME_ON_EVERY_BACKEND
@pytest.mark.parametrize("kind", ["char", "modern"])
def test_the_inside_graph_scales_each_heads_output_and_a_zero_knocks_it_out_as_python_does(kind):
    model = _model(kind)
    trace = gptlite.trace(model, [int(i) for i in model.tokenizer.encode(TEXT)][:30], ablate=[(1, 1), (0, 0)])
    session = _inside_session(model)
    assert [given.name for given in session.get_inputs()] == ["input_ids", "head_scale"]
    scale = np.ones((model.config.n_layer, model.config.n_head), np.float32)
    scale[1, 1] = scale[0, 0] = 0
    out = _run(session, model, input_ids=trace.ids[None].astype(np.int64), head_scale=scale)
    assert_near(out["logits"], trace.steps["logits"], "logits")
    assert_near(out["layer_1.heads"], trace.layers[1]["heads"], "layer 1's heads")
    assert not np.any(out["layer_1.heads"][1])


@SAME_ON_EVERY_BACKEND
def test_a_seq2seqs_inside_graph_scales_its_cross_attentions_heads_too():
    model = gptlite.load(FIXTURES / "made_seq2seq.keras")
    trace = gptlite.trace_target(model, "12+345", "357", ablate=[(0, 1, "cross"), (1, 0, "encoder")])
    session = _inside_session(model)
    scales = {name: np.ones((model.config.n_layer, model.config.n_head), np.float32)
              for name in ("head_scale", "cross_head_scale", "encoder_head_scale")}
    scales["cross_head_scale"][0, 1] = scales["encoder_head_scale"][1, 0] = 0
    out = _run(session, model, input_ids=trace.ids[None].astype(np.int64),
               source_ids=trace.source_ids[None].astype(np.int64), **scales)
    assert_near(out["logits"], trace.steps["logits"], "logits")
    assert not np.any(out["layer_0.cross_heads"][1]) and not np.any(out["encoder_layer_1.heads"][0])


# --- the page in a browser

def _wait_for(browser, element_id, states=("done", "error"), seconds=120):
    """The `data-state` of the element `element_id` once it is one of `states`, or when `seconds` have passed; the
    element may be made by the page's script after the page has loaded."""
    from selenium.common.exceptions import NoSuchElementException
    from selenium.webdriver.common.by import By

    deadline = time.monotonic() + seconds
    while True:
        try:
            state = browser.find_element(By.ID, element_id).get_attribute("data-state")
        except NoSuchElementException:
            state = None
        if state in states or time.monotonic() >= deadline:
            return state
        time.sleep(0.05)


def _opened(browser, url, **query):
    """The page at `url` opened with the query, once its Inside view shows a step: what the view says it shows."""
    browser.get(f"{url}/?{urllib.parse.urlencode(query)}")
    assert _wait_for(browser, "inside") == "done", browser.find_element("id", "inside").text
    return browser.execute_script("return window.gptliteInside()")


def _prompt(kind):
    return "1+2" if kind == "chat" else "the cat sat on a mat and the hat"


@pytest.mark.slow
@pytest.mark.extras
@SAME_ON_EVERY_BACKEND
@pytest.mark.parametrize("kind", BROWSER_KINDS)
def test_the_page_shows_pythons_numbers_for_any_token_layer_and_head(site, browser, kind):
    url, models = site
    model = models[kind]
    token, layer, head = 5, model.config.n_layer - 1, model.config.n_head - 1
    shown = _opened(browser, f"{url}/{kind}", prompt=_prompt(kind), token=token, layer=layer, head=head,
                    step="softmax", temperature=0.7, top_k=5)
    assert (shown["token"], shown["layer"], shown["head"], shown["step"]) == (token, layer, head, "softmax")
    trace = gptlite.trace(model, shown["ids"])  # the page's ids: a chat's template, a tokenizer's start
    page_trace = browser.execute_script("return window.gptliteTrace()")
    arrays = {name: value["data"] for name, value in page_trace["steps"].items()}
    arrays = {name: np.reshape(arrays[name], page_trace["steps"][name]["dims"]) for name in arrays}
    layers = [{name: np.reshape(value["data"], value["dims"]) for name, value in found.items()}
              for found in page_trace["layers"]]
    assert_same_trace(arrays, layers, trace)
    assert_near(shown["scores"], trace.layers[layer]["scores"][head, token, :token + 1], "scores")
    assert_near(shown["attention"], trace.layers[layer]["attention"][head, token], "attention")
    assert abs(sum(shown["attention"]) - 1) <= 1e-5 and all(w == 0 for w in shown["attention"][token + 1:])
    # The probabilities over the whole vocabulary, after the page's settings (top_k 5 keeps 5), likeliest first.
    expected = trace.probabilities(token, dict(temperature=0.7, top_k=5))
    assert len(shown["probabilities"]) == np.count_nonzero(expected) == 5
    for candidate in shown["probabilities"]:
        assert abs(candidate["probability"] - expected[candidate["id"]]) <= 1e-4
    assert [c["probability"] for c in shown["probabilities"]] == sorted((c["probability"] for c in
                                                                         shown["probabilities"]), reverse=True)
    assert_near([n["cosine"] for n in shown["neighbours"]], [value for _, value in trace.neighbours(token)],
                "neighbours")


@pytest.mark.slow
@pytest.mark.extras
@SAME_ON_EVERY_BACKEND
def test_a_link_opens_its_state_and_a_wrong_one_the_nearest_with_a_line_saying_so(site, browser):
    url, models = site
    config = models["modern"].config
    shown = _opened(browser, f"{url}/modern", prompt=_prompt("modern"), token=999, layer=config.n_layer,
                    head=-1, step="everything")
    assert (shown["token"], shown["layer"], shown["head"], shown["step"]) == (
        len(shown["ids"]) - 1, config.n_layer - 1, 0, "tokens")
    message = browser.find_element("css selector", "#inside .inside-message").text
    assert "there is no token 999" in message and f"there is no layer {config.n_layer}" in message
    assert "there is no head -1" in message and "no step \"everything\"" in message
    # The page's address follows the view, so that a link opens the state shown.
    browser.find_element("css selector", '[data-step="scores"]').click()
    assert _wait_for(browser, "inside") == "done"
    query = urllib.parse.parse_qs(urllib.parse.urlparse(browser.current_url).query)
    assert query["step"] == ["scores"] and query["token"] == [str(len(shown["ids"]) - 1)]
    again = _opened(browser, browser.current_url.split("/?")[0], **{k: v[0] for k, v in query.items()})
    assert again["step"] == "scores" and again["scores"] == browser.execute_script(
        "return window.gptliteInside()")["scores"]


@pytest.mark.slow
@pytest.mark.extras
@SAME_ON_EVERY_BACKEND
def test_every_step_fits_a_phone_and_is_reached_by_keyboard_alone(site, browser):
    from selenium.webdriver.common.keys import Keys

    url, _ = site
    browser.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {"width": 390, "height": 844, "deviceScaleFactor": 1,
                                                                    "mobile": True})
    shown = _opened(browser, f"{url}/modern", prompt=_prompt("modern"), token=3, step="tokens")
    active = lambda: browser.switch_to.active_element  # noqa: E731
    browser.find_element("css selector", '[role="tab"][aria-selected="true"]').send_keys(Keys.HOME)
    seen = []
    for _ in ALL_STEPS:
        assert _wait_for(browser, "inside") == "done"
        seen.append(browser.execute_script("return window.gptliteInside().step"))
        width = browser.execute_script("return document.documentElement.scrollWidth")
        assert width <= 390, (seen[-1], width)
        assert active().get_attribute("data-step") == seen[-1]
        active().send_keys(Keys.ARROW_RIGHT)
    assert seen == ALL_STEPS
    # Tab from the steps to the tokens, where the arrows move; then to the layer and the head.
    active().send_keys(Keys.TAB)
    assert active().get_attribute("data-token") == "3"
    active().send_keys(Keys.ARROW_LEFT)
    assert browser.execute_script("return window.gptliteInside().token") == 2
    active().send_keys(Keys.TAB)
    assert active().get_attribute("aria-label") == "layer"
    active().send_keys(Keys.ARROW_DOWN)
    assert browser.execute_script("return window.gptliteInside().layer") == 1
    browser.switch_to.active_element.send_keys(Keys.TAB)
    assert active().get_attribute("aria-label") == "head"
    active().send_keys(Keys.ARROW_DOWN)
    assert browser.execute_script("return window.gptliteInside().head") == 1
    assert len(shown["ids"]) > 3


@pytest.mark.slow
@pytest.mark.extras
@SAME_ON_EVERY_BACKEND
def test_after_writing_greedily_the_draw_shown_is_the_token_written(site, browser):
    url, models = site
    model = models["char"]
    browser.get(f"{url}/char/?" + urllib.parse.urlencode(dict(prompt="the", max_new_tokens=30, temperature=0, seed=2,
                                                               run=1, token=10, step="probabilities")))
    assert _wait_for(browser, "output") == "done" and _wait_for(browser, "inside") == "done"
    shown = browser.execute_script("return window.gptliteInside()")
    assert shown["token"] == 10 and len(shown["ids"]) == 33
    logits = gptlite.trace(model, shown["ids"]).steps["logits"][10]
    top_two = np.sort(logits)[-2:]
    assert shown["drawn"]["id"] == shown["ids"][11] or top_two[1] - top_two[0] < TIE
    # Learned positions: the position step works the sum's first entry out with the model's numbers.
    browser.find_element("css selector", '[data-step="position"]').click()
    assert _wait_for(browser, "inside") == "done"
    steps = gptlite.trace(model, shown["ids"]).steps
    said = browser.find_element("css selector", "#inside section.step").text
    worked = re.search(r"sum\[0\] = token\[0\] \+ position\[0\] = (\S+) \+ (\S+) = (\S+) \(the model's: (\S+)\)",
                       said)
    token_entry, position_entry, total, models_total = (float(number) for number in worked.groups())
    expected = (steps["token_embedding"][10, 0], steps["position"][10, 0], steps["embedding"][10, 0])
    assert np.allclose([token_entry, position_entry, models_total], expected, rtol=1e-3, atol=1e-4)
    assert abs(total - models_total) <= 1e-3 * abs(models_total) + 2e-4  # the sum, as the page adds it


@pytest.mark.slow
@pytest.mark.extras
@SAME_ON_EVERY_BACKEND
def test_the_notebooks_view_of_a_python_trace_answers_the_same_contract(site, browser, tmp_path):
    _, models = site
    model = models["modern"]
    trace = gptlite.trace(model, _prompt("modern"))
    page = tmp_path / "trace.html"
    page.write_text('<!doctype html><meta charset="utf-8"><meta name="viewport" content="width=device-width">'
                    + trace._repr_html_())
    html = trace._repr_html_()
    assert not any(fetching in html for fetching in ("src=", "href=", "fetch(", "import(")), "it fetches nothing"
    browser.get(page.as_uri())
    assert _wait_for(browser, "inside") == "done"
    shown = browser.execute_script("return window.gptliteInside()")
    token = len(trace.ids) - 1
    assert shown["ids"] == trace.ids.tolist() and shown["token"] == token and shown["step"] == "tokens"
    np.testing.assert_array_equal(np.float32(shown["scores"]), trace.layers[0]["scores"][0, token])
    np.testing.assert_array_equal(np.float32(shown["attention"]), trace.layers[0]["attention"][0, token])
    expected = trace.probabilities(token)
    for candidate in shown["probabilities"]:
        assert abs(candidate["probability"] - expected[candidate["id"]]) <= 1e-6
    other = notebook.html(trace, dict(token=1, layer=1, head=3, step="rotary"))
    page = tmp_path / "other.html"  # a new address: the browser loads it afresh, never as a reload of the first
    page.write_text("<!doctype html><meta charset='utf-8'>" + other)
    browser.get(page.as_uri())
    assert _wait_for(browser, "inside") == "done"
    assert browser.execute_script("return window.gptliteInside()")["step"] == "rotary"


@pytest.fixture(scope="module")
def seq2seq_site(tmp_path_factory):
    """A trained Seq2Seq's page (the fixture that adds up numbers), served from 127.0.0.1: (its address, the model)."""
    from test_export import _QuietHandler
    import functools
    import http.server
    import threading

    model = gptlite.load(FIXTURES / "made_seq2seq.keras")
    root = tmp_path_factory.mktemp("seq2seq_page")
    gptlite.export_web(model, root / "site")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_QuietHandler, directory=str(root)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/site", model
    server.shutdown()


@pytest.mark.slow
@pytest.mark.extras
@SAME_ON_EVERY_BACKEND
def test_a_seq2seqs_page_writes_pythons_target_and_shows_its_cross_attention(seq2seq_site, browser):
    url, model = seq2seq_site
    for source in ("12+345", "9+9", "400+27"):
        browser.get(f"{url}/?" + urllib.parse.urlencode(dict(prompt=source, run=1, step="cross", token=1, head=1)))
        assert _wait_for(browser, "output") == "done" and _wait_for(browser, "inside") == "done"
        written = browser.find_element("id", "output").get_attribute("textContent")
        shown = browser.execute_script("return window.gptliteInside()")
        trace = gptlite.trace_target(model, source, written)
        assert shown["ids"] == trace.ids.tolist() and shown["source_ids"] == trace.source_ids.tolist()
        # Greedy, the target Python writes, wherever no step's two likeliest tokens tie.
        top_two = np.sort(trace.steps["logits"], axis=1)[:, -2:]
        assert written == gptlite.generate_target(model, source) or np.any(top_two[:, 1] - top_two[:, 0] < TIE)
        assert shown["step"] == "cross" and shown["head"] == 1
        assert_near(shown["cross_attention"], trace.layers[0]["cross_attention"][1, 1], "cross-attention")
        assert abs(sum(shown["cross_attention"]) - 1) <= 1e-5
        # Every source token followed through the head, as the self-attention's rows follow the text.
        rows, steps = shown["cross_rows"], trace.layers[0]
        assert [row["id"] for row in rows] == trace.source_ids.tolist()
        assert_near([row["product"] for row in rows], steps["cross_products"][1, 1], "cross q.k")
        assert_near([row["scaled"] for row in rows], steps["cross_scores"][1, 1], "cross scores")
        assert_near([row["weight"] for row in rows], steps["cross_attention"][1, 1], "cross weights")
    page_trace = browser.execute_script("return window.gptliteTrace()")
    for index, layer in enumerate(trace.encoder_layers):
        for name, value in layer.items():
            found = page_trace["encoder_layers"][index][name]
            assert_near(np.reshape(found["data"], found["dims"]), value, f"encoder layer {index} {name}")



# --- a link that reopens what was seen, a long text, a knocked-out head

def _written(browser, url, **query):
    """The page at `url` opened to write with the query (run=1), once it has written and shown its Inside view."""
    browser.get(f"{url}/?{urllib.parse.urlencode(dict(run=1, **query))}")
    assert _wait_for(browser, "output") == "done" and _wait_for(browser, "inside") == "done"
    return browser.execute_script("return window.gptliteInside()")


def _same_view(found, expected):
    for name in ("ids", "window_start", "token", "position", "layer", "head", "step", "ablated", "settings", "drawn"):
        assert found[name] == expected[name], name
    for name in ("scores", "attention", "matrix"):
        assert_near(found[name], expected[name], name)
    assert [c["id"] for c in found["probabilities"]] == [c["id"] for c in expected["probabilities"]]


@pytest.mark.slow
@pytest.mark.extras
@SAME_ON_EVERY_BACKEND
@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_a_link_reopens_the_writing_and_the_view_in_a_fresh_page_after_a_second_writing_too(site, browser, kind):
    from selenium.webdriver.common.by import By

    url, _ = site
    _written(browser, f"{url}/{kind}", prompt="the", max_new_tokens=12, temperature=0.9, seed=5)
    browser.find_element(By.CSS_SELECTOR, '[data-step="softmax"]').click()
    browser.find_element(By.CSS_SELECTOR, '[data-token="4"]').click()
    assert _wait_for(browser, "inside") == "done"
    # A second writing: the link now says it, and nothing of the first.
    box = browser.find_element(By.ID, "prompt")
    box.clear()
    box.send_keys("a cat")
    browser.find_element(By.ID, "generate").click()
    assert _wait_for(browser, "output", ("writing",), seconds=10) in ("writing", "done")
    assert _wait_for(browser, "output") == "done" and _wait_for(browser, "inside") == "done"
    shown = browser.execute_script("return window.gptliteInside()")
    output = browser.find_element(By.ID, "output").get_attribute("textContent")
    query = urllib.parse.parse_qs(urllib.parse.urlparse(shown["link"]).query)
    assert query["prompt"] == ["a cat"] and "a cat" + query["written"][0] == output
    assert query["seed"] == ["5"] and query["temperature"] == ["0.9"] and query["step"] == ["softmax"]
    assert (shown["step"], shown["position"]) == ("softmax", len(shown["ids"]) - 1)  # the last token, the same step
    assert browser.current_url == shown["link"]
    # The link in a fresh page: the same text (not written again), the same view, the same numbers.
    browser.get("about:blank")
    browser.get(shown["link"])
    assert _wait_for(browser, "inside") == "done"
    assert browser.find_element(By.ID, "output").get_attribute("textContent") == output
    _same_view(browser.execute_script("return window.gptliteInside()"), shown)


@pytest.mark.slow
@pytest.mark.extras
@SAME_ON_EVERY_BACKEND
def test_every_position_of_a_long_text_is_seen_as_the_writer_read_it(site, browser):
    url, models = site
    model = models["char"]
    block = model.config.block_size
    shown = _written(browser, f"{url}/char", prompt="the", max_new_tokens=block + 20, temperature=0, seed=1)
    text_ids = [int(i) for i in model.tokenizer.encode("the")] + json.loads(
        browser.find_element("id", "output").get_attribute("data-ids"))
    assert len(text_ids) > block and shown["position"] == len(text_ids) - 1
    for position in range(2, len(text_ids) - 1):
        browser.execute_script(f'document.querySelector(\'#inside [data-token="{position}"]\').click()')
        assert _wait_for(browser, "inside") == "done"
        shown = browser.execute_script("return window.gptliteInside()")
        start = max(0, position + 1 - block)
        assert shown["position"] == position and shown["window_start"] == start, position
        assert shown["ids"] == text_ids[start:max(position + 1, min(block, len(text_ids)))]
        # The greedy writer's token, unless the window's two likeliest tie.
        logits = gptlite.trace(model, shown["ids"]).steps["logits"][shown["token"]]
        top_two = np.sort(logits)[-2:]
        assert shown["drawn"]["id"] == text_ids[position + 1] or top_two[1] - top_two[0] < TIE, position


@pytest.mark.slow
@pytest.mark.extras
@SAME_ON_EVERY_BACKEND
def test_a_knocked_out_head_shows_the_edited_model_and_its_link_reopens_it(site, browser):
    url, models = site
    model = models["modern"]
    shown = _opened(browser, f"{url}/modern", prompt=_prompt("modern"), step="heads", layer=1, token=6)
    for head in (2, 0, 3, 0):  # head 0 knocked out, then back in
        browser.find_element("css selector", f'[data-knock-out="1.{head}"]').click()
        assert _wait_for(browser, "inside") == "done"
    edited = browser.execute_script("return window.gptliteInside()")
    assert edited["ablated"] == [[1, 2], [1, 3]]
    assert browser.switch_to.active_element.get_attribute("data-knock-out") == "1.0"  # the focus stays
    trace = gptlite.trace(model, edited["ids"], ablate=[tuple(head) for head in edited["ablated"]])
    assert_near(edited["attention"], trace.layers[1]["attention"][edited["head"], 6], "attention")
    expected = trace.probabilities(6, edited["settings"])
    for candidate in edited["probabilities"]:
        assert abs(candidate["probability"] - expected[candidate["id"]]) <= 1e-4
    assert "knocked out" in browser.find_element("id", "inside").text
    clean = gptlite.trace(model, edited["ids"]).probabilities(6, edited["settings"])
    assert np.abs(clean - expected).max() > 1e-4  # the edit changed what the model says
    query = urllib.parse.parse_qs(urllib.parse.urlparse(edited["link"]).query)
    assert query["ablate"] == [",".join(f"{l}.{h}" for l, h in edited["ablated"])]
    browser.get("about:blank")
    browser.get(edited["link"])
    assert _wait_for(browser, "inside") == "done"
    _same_view(browser.execute_script("return window.gptliteInside()"), edited)
    # Heads the model lacks, or no heads at all: the nearest valid state, with a line saying so.
    wrong = _opened(browser, f"{url}/modern", prompt=_prompt("modern"), ablate="1.2,9.9,x")
    assert wrong["ablated"] == [[1, 2]]
    message = browser.find_element("css selector", "#inside .inside-message").text
    assert "no head 9.9" in message and '"x" is not a head' in message
    assert len(shown["ids"]) > 6


@pytest.mark.slow
@pytest.mark.extras
@SAME_ON_EVERY_BACKEND
def test_the_head_grid_is_gptlite_heads_and_a_head_chosen_there_opens_its_attention(site, browser):
    url, models = site
    model = models["modern"]
    shown = _opened(browser, f"{url}/modern", prompt=_prompt("modern"), step="head_roles")
    report = gptlite.heads(model, shown["ids"], calibrate=False)
    for name in ("previous_token", "first_token", "current_token", "induction"):
        assert_near(shown["heads"][name], getattr(report, name), name)
    # the loss's change without each head, to 1e-4 of the loss
    assert np.abs(np.array(shown["heads"]["ablation"]) - report.ablation).max() <= 1e-4 * report.loss
    assert abs(shown["heads"]["loss"] - report.loss) <= 1e-4 * report.loss
    browser.find_element("css selector", '[data-role="induction.1.2"]').click()
    assert _wait_for(browser, "inside") == "done"
    opened = browser.execute_script("return window.gptliteInside()")
    assert (opened["step"], opened["layer"], opened["head"]) == ("softmax", 1, 2)
    # A row of the scores' table lights its token wherever the view shows it.
    browser.find_element("css selector", '[data-step="scores"]').click()
    assert _wait_for(browser, "inside") == "done"
    browser.find_element("css selector", 'table.rows tr[data-position="2"]').click()
    lit = browser.execute_script("return Array.from(document.querySelectorAll('#inside .lit'), "
                                 "e => e.dataset.token ?? e.dataset.position)")
    assert set(lit) == {"2"} and len(lit) >= 4  # the token, its two chips, its row
    # It stays lit in the other steps: its row of the keys under the query (and of the values) is marked.
    browser.find_element("css selector", '[data-step="qkv"]').click()
    assert _wait_for(browser, "inside") == "done"
    assert browser.execute_script("return document.querySelector('#inside [data-token=\"2\"]').classList"
                                  ".contains('lit')")
    marked = browser.execute_script("""
        const canvas = document.querySelector('#inside canvas[data-marks="rows"]');
        const read = () => canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data;
        const lit = read();
        canvas.mark(-1);
        const plain = read();
        const rows = new Set();
        for (let i = 0; i < lit.length; i++) if (lit[i] !== plain[i]) rows.add(Math.floor(i / 4 / canvas.width));
        return Array.from(rows);""")
    assert marked == [2]
