"""The pictures of docs/inspection.md's Inside view: a model trained on Tiny Shakespeare, exported as the web page,
opened in headless Chromium (Debian's, under Selenium) at a link's state, and the view photographed at each step.

    python docs/inside_pictures.py [--model runs/shakespeare/model.keras] [--text data/tinyshakespeare.txt]

Without --model it trains one first, as `python train.py TEXT --out RUN` does (the default preset), in a
temporary folder. Writes docs/inside_<step>.png, one for each step of the view, docs/inside_overview.png (the model
at a glance) and docs/inside_knocked_out.png (the probabilities with the head photographed knocked out).
"""

import argparse
import functools
import http.server
import pathlib
import shutil
import tempfile
import threading
import time
import urllib.parse

DOCS = pathlib.Path(__file__).resolve().parent
PROMPT = "ROMEO:\nBut soft, what light through yonder window breaks?"
# The state photographed: the "o" of "soft" (token 12), layer 2, head 1.
STATE = dict(token=12, layer=2, head=1)


def _photographed(driver, inside, name, selector="#inside section.step"):
    """docs/inside_<name>.png: the element `selector` once the view is drawn (a step that runs the model again, once
    it has run)."""
    _drawn(inside)
    driver.find_element("css selector", selector).screenshot(str(DOCS / f"inside_{name}.png"))
    print(f"wrote docs/inside_{name}.png")


def _drawn(inside):
    deadline = time.monotonic() + 300
    while inside.get_attribute("data-state") != "done" and time.monotonic() < deadline:
        time.sleep(0.05)


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=pathlib.Path, help="a trained model.keras (default: train one)")
    parser.add_argument("--text", type=pathlib.Path, default=DOCS.parent.parent / "shared" / "data" /
                        "tinyshakespeare.txt", help="the text to train on, without --model")
    args = parser.parse_args()

    import gptlite

    with tempfile.TemporaryDirectory() as folder:
        folder = pathlib.Path(folder)
        model_file = args.model
        if model_file is None:
            run = gptlite.train_on_text([str(args.text)], str(folder / "run"))
            model_file = pathlib.Path(run.out_dir) / "model.keras"
        gptlite.export_web(gptlite.load(model_file), folder / "site")
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(folder)))
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            photograph(f"http://127.0.0.1:{server.server_port}/site")
        finally:
            server.shutdown()


def chromium(width, height):
    """Headless Chromium (Debian's, under Selenium) with a window of `width` by `height` pixels."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", f"--window-size={width},{height}",
                     "--hide-scrollbars"):
        options.add_argument(argument)
    options.binary_location = shutil.which("chromium")
    return webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)


def photograph(url):
    driver = chromium(760, 4000)
    try:
        driver.get(f"{url}/?{urllib.parse.urlencode(dict(prompt=PROMPT, step='tokens', **STATE))}")
        inside = driver.find_element("id", "inside")
        deadline = time.monotonic() + 120
        while inside.get_attribute("data-state") != "done" and time.monotonic() < deadline:
            time.sleep(0.05)
        steps = [button.get_attribute("data-step") for button in driver.find_elements("css selector", "[role=tab]")]
        shot = functools.partial(_photographed, driver, inside)
        shot("overview", "#inside nav.overview")
        for step in steps:
            driver.find_element("css selector", f'[data-step="{step}"]').click()
            shot(step)
        # A head knocked out: its switch in the heads' step, then the probabilities of the edited model.
        driver.find_element("css selector", '[data-step="heads"]').click()
        driver.find_element("css selector", f'[data-knock-out="{STATE["layer"]}.{STATE["head"]}"]').click()
        _drawn(inside)
        driver.find_element("css selector", '[data-step="probabilities"]').click()
        shot("knocked_out")
    finally:
        driver.quit()


if __name__ == "__main__":
    main()
