"""The page's film view (page/film.js) in headless Chromium, on a tiny run's film exported with its page: the frames and
every number window.gptliteFilm() shows against Python's (gptlite.film), the Inside view at a frame against
gptlite.trace of that frame's model, a link to a frame, the slider by keyboard alone, a phone's width and nothing
fetched off the host; and its data functions under Node."""

import functools
import http.server
import json
import pathlib
import shutil
import subprocess
import threading
import time

import numpy as np
import pytest

import gptlite
from conftest import built_once, filmed_run
from gptlite.web import export
from test_inside import assert_near, _wait_for

MODULE = (pathlib.Path(export.__file__).parent / "page" / "film.js").as_uri()
ONCE = pytest.mark.once("the page is written from the film's numbers, alike on every backend")


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def film_site():
    """The tiny filmed run's page with its film, served from 127.0.0.1: (its address, the run's folder)."""
    run = filmed_run()
    root, _ = built_once("film_page", lambda folder: gptlite.export_web(gptlite.load(run / "model.keras"),
                                                                        folder / "site", film=run))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_QuietHandler, directory=str(root)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/site", run
    server.shutdown()


def _film(browser, url, query=""):
    browser.get(f"{url}/?{query}")
    assert _wait_for(browser, "film") == "done"
    return browser.execute_script("return window.gptliteFilm()")


def _wait_for_frame(browser, step, seconds=60):
    """Until the Inside view shows frame `step`'s trace (the address names it once the view is drawn)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        named = browser.execute_script("return new URLSearchParams(location.search).get('frame')")
        if named == str(step) and _wait_for(browser, "inside", seconds=1) == "done":
            return
        time.sleep(0.05)
    raise AssertionError(f"the Inside view did not show frame {step}")


@pytest.mark.slow
@pytest.mark.extras
@ONCE
@pytest.mark.parametrize("index", [0, 5])
def test_a_link_to_a_frame_shows_python_s_numbers_for_it_and_its_inside(film_site, browser, index):
    url, run = film_site
    movie = gptlite.film(run)
    step = movie.frames[index].step
    shown = _film(browser, url, f"frame={step}")
    assert [frame["step"] for frame in shown["frames"]] == [frame.step for frame in movie.frames]
    for got, frame in zip(shown["frames"], movie.frames):
        assert got["val_loss"] == pytest.approx(frame.val_loss, abs=1e-6)
    assert shown["frame"] == index and shown["step"] == step
    report = movie.heads(index)
    for name in ("previous_token", "first_token", "current_token", "induction", "ablation"):
        np.testing.assert_allclose(shown["heads"][name], getattr(report, name), atol=1e-4)
    loss = movie.probe_loss(index)
    assert shown["probe_loss"]["second_half"] == pytest.approx(loss.second_half, abs=1e-4)
    points = np.array([[point["x"], point["y"]] for point in shown["embedding"]])
    np.testing.assert_allclose(points, movie.embedding()["points"][index], atol=1e-4)
    # The Inside view shows the probe as that frame's model computed it.
    _wait_for_frame(browser, step)
    trace = browser.execute_script("return window.gptliteTrace()")
    python = gptlite.trace(movie.frames[index].model(), movie.probe_ids)
    logits = trace["steps"]["logits"]
    assert_near(np.asarray(logits["data"]).reshape(logits["dims"]), python.steps["logits"], "logits")


@pytest.mark.slow
@pytest.mark.extras
@ONCE
def test_the_slider_moves_by_keyboard_fits_a_phone_and_fetches_nothing_off_the_host(film_site, browser):
    from selenium.webdriver.common.keys import Keys

    url, run = film_site
    movie = gptlite.film(run)
    browser.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {"width": 390, "height": 844, "deviceScaleFactor": 1,
                                                                    "mobile": True})
    last = len(movie) - 1
    # A link to a step that has no frame opens the nearest before it, and says so.
    steps = [frame.step for frame in movie.frames]
    missing = next(step for step in range(steps[-1]) if step not in steps)
    shown = _film(browser, url, f"frame={missing}")
    assert shown["step"] == max(step for step in steps if step < missing)
    assert f"no frame at step {missing}" in browser.find_element("id", "message").text
    shown = _film(browser, url)
    assert shown["frame"] == last
    slider = browser.find_element("css selector", ".film-slider")
    slider.send_keys(Keys.HOME)
    assert browser.execute_script("return window.gptliteFilm().frame") == 0
    for expected in (1, 2):
        slider.send_keys(Keys.ARROW_RIGHT)
        assert browser.execute_script("return window.gptliteFilm().frame") == expected
    _wait_for_frame(browser, movie.frames[2].step)
    assert "step " + str(movie.frames[2].step) in browser.find_element("css selector", ".film-now").text
    assert browser.execute_script("return document.documentElement.scrollWidth") <= 390
    fetched = browser.execute_script("return performance.getEntriesByType('resource').map((entry) => entry.name)")
    assert fetched and all(name.startswith(url.rsplit("/", 1)[0]) for name in fetched), fetched


@pytest.mark.skipif(shutil.which("node") is None, reason="needs Node.js")
def test_the_film_s_data_functions():
    script = f"""import * as film from "{MODULE}";
const frames = [{{step: 0}}, {{step: 3}}, {{step: 10}}, {{step: 40}}];
console.log(JSON.stringify({{
  of: [0, 2, 3, 11, 40, 99].map((step) => film.frameOfStep(frames, step)),
  extent: [film.extent([3, null, 1, 2]), film.extent([2, 2])],
  place: [film.stepPlace(0, 40), film.stepPlace(40, 40)],
}}));"""
    done = subprocess.run(["node", "--input-type=module"], input=script, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["of"] == [0, 0, 1, 2, 3, 3]
    assert answer["extent"] == [[1, 3], [1, 3]]
    assert answer["place"] == [0, 1]


@pytest.mark.slow
@pytest.mark.extras
@ONCE
def test_the_notebook_s_film_view_opens_from_a_file_with_python_s_numbers(film_site, browser, tmp_path):
    _, run = film_site
    movie = gptlite.film(run)
    path = tmp_path / "film.html"
    path.write_text(movie._repr_html_())
    browser.get(path.as_uri())
    deadline = time.monotonic() + 60
    shown = None
    while shown is None and time.monotonic() < deadline:
        shown = browser.execute_script("return window.gptliteFilm ? window.gptliteFilm() : null")
        time.sleep(0.05)
    assert shown["frame"] == len(movie) - 1
    assert [frame["step"] for frame in shown["frames"]] == [frame.step for frame in movie.frames]
    np.testing.assert_allclose(shown["heads"]["induction"], movie.heads(len(movie) - 1).induction, atol=1e-4)
    assert browser.execute_script("return performance.getEntriesByType('resource').length") == 0
