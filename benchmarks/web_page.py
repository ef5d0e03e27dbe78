"""The web export's page in headless Chromium (Debian's, under Selenium), each round a fresh browser and page load:
seconds from the page's navigation to a model ready to write, to its first token, and tokens/s at batch 1 after
it, greedy; beside `gptlite.generate` on the same model in this process (TensorFlow, warm: the median of 3 calls
after one), and llama.cpp on the same weights (f32 GGUF) where llama-cpp-python is installed.

    python benchmarks/web_page.py [--shapes laptop gpt2] [--rounds 3]

Shapes: `laptop`, the default preset's model (rotary, RMSNorm, SwiGLU, grouped-query, QK-norm; 65 characters),
200 tokens; `gpt2`, GPT-2 small's (50,257 ids), 50 tokens, at f32 and f16. Random weights, speed only.
"""

import argparse
import functools
import http.server
import pathlib
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
import urllib.parse

import keras

import gptlite
from helpers.models import model_of, random_model, VOCABULARY_SIZE

TOKENS = {"laptop": 200, "gpt2": 50}
OUTTYPES = {"laptop": ("f32",), "gpt2": ("f32", "f16")}
PROMPT = "HELLO"


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # the requests are not news
        pass


def laptop_model():
    keras.utils.set_random_seed(0)
    laptop = {key: gptlite.PRESETS["laptop"][key] for key in ("n_layer", "n_head", "n_embd", "block_size", "position",
                                                             "norm", "mlp", "n_kv_head", "qk_norm")}
    tokenizer = random_model("cpu").tokenizer
    model = gptlite.GPT(vocab_size=VOCABULARY_SIZE, tokenizer=tokenizer, **laptop)
    model.build((None, laptop["block_size"]))
    return model


def _browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage"):
        options.add_argument(argument)
    options.binary_location = shutil.which("chromium")
    return webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)


def _written(driver, url, prompt, tokens, **settings):
    """The page at `url` opened with the prompt and settings, run, and waited for: its #output element."""
    query = urllib.parse.urlencode(dict(prompt=prompt, max_new_tokens=tokens, run=1, **settings))
    driver.get(f"{url}/?{query}")
    output = driver.find_element("id", "output")
    deadline = time.monotonic() + 600
    while output.get_attribute("data-state") not in ("done", "error") and time.monotonic() < deadline:
        time.sleep(0.02)
    assert output.get_attribute("data-state") == "done", driver.find_element("id", "message").text
    return output


def in_browser(url, tokens):
    """A fresh browser's page load, greedy: seconds to ready and to the first token, and tokens/s after it."""
    driver = _browser()
    try:
        output = _written(driver, url, PROMPT, tokens, temperature=0)
        ready = float(output.get_attribute("data-ready-seconds"))
        return dict(ready=ready, first=ready + float(output.get_attribute("data-first-token-seconds")),
                    rate=float(output.get_attribute("data-tokens-per-second")))
    finally:
        driver.quit()


def in_browser_text(url, prompt, tokens, **settings):
    """The text a fresh browser's page writes for the prompt and settings."""
    driver = _browser()
    try:
        return _written(driver, url, prompt, tokens, **settings).get_attribute("textContent")
    finally:
        driver.quit()


def python_rate(model, tokens):
    gptlite.generate(model, PROMPT, tokens, temperature=0)
    times = []
    for _ in range(3):
        started = time.perf_counter()
        gptlite.generate(model, PROMPT, tokens, temperature=0)
        times.append(time.perf_counter() - started)
    return tokens / statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=["laptop", "gpt2"], choices=list(TOKENS))
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    version = subprocess.run(["chromium", "--version"], capture_output=True, text=True, check=False).stdout.strip()
    print(f"# {version}; one thread (no cross-origin isolation)")
    with tempfile.TemporaryDirectory() as folder:
        root = pathlib.Path(folder)
        handler = functools.partial(_QuietHandler, directory=folder)
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        for shape in args.shapes:
            model = laptop_model() if shape == "laptop" else model_of(shape)
            tokens = TOKENS[shape]
            python = python_rate(model, tokens)
            for outtype in OUTTYPES[shape]:
                started = time.perf_counter()
                gptlite.export_web(model, root / f"{shape}-{outtype}", outtype)
                exported = time.perf_counter() - started
                size = (root / f"{shape}-{outtype}" / "model.onnx").stat().st_size / 2**20
                rounds = [in_browser(f"http://127.0.0.1:{server.server_port}/{shape}-{outtype}", tokens)
                          for _ in range(args.rounds)]
                ready, first, rate = (statistics.median(r[key] for r in rounds) for key in ("ready", "first", "rate"))
                print(f"{shape} {outtype}: model.onnx {size:.1f} MiB, exported in {exported:.1f} s; page ready "
                      f"{ready:.2f} s, first token {first:.2f} s after load, {rate:.1f} tokens/s; Python "
                      f"gptlite.generate {python:.1f} tokens/s; page/Python {rate / python:.2f}x "
                      f"(medians of {args.rounds}; rates {[round(r['rate'], 1) for r in rounds]})")
        server.shutdown()


if __name__ == "__main__":
    main()
