"""The web export's page in headless Chromium (Debian's, under Selenium), each round a fresh browser and page load:
seconds from the page's navigation to a model ready to write, to its first token, and tokens/s at batch 1 after
it, greedy, first and warm (the page writing again), and a reader's page: loaded fresh and left open a few
seconds before Generate is clicked (the page warms its model meanwhile); beside `gptlite.generate` on the same model in this process
(TensorFlow, warm: the median of 3 calls after one), and llama.cpp on the same weights (f32 GGUF) where
llama-cpp-python is installed.

    python benchmarks/web_page.py [--shapes laptop gpt2] [--rounds 3]

Shapes: `laptop`, the default preset's model (rotary, RMSNorm, SwiGLU, grouped-query, QK-norm; 65 characters),
58 and 200 tokens; `gpt2`, GPT-2 small's (50,257 ids), 50 tokens, at f32, f16 and int8. Random weights, speed only.
"""

import argparse
import itertools
import pathlib
import statistics
import subprocess
import tempfile
import time
import urllib.parse


import gptlite
from helpers.browser import browser, serve, written
from helpers.models import model_of

# New tokens a call writes: for the laptop shape, 58 (the prompt's 5 and these fill its 64-token window, every
# token read over the cache) and 200 (past the window, where each token is read over the whole last window again,
# as gptlite.generate does); for GPT-2 small's, 50.
TOKENS = {"laptop": (58, 200), "gpt2": (50,)}
OUTTYPES = {"laptop": ("f32",), "gpt2": ("f32", "f16", "int8")}
PROMPT = "HELLO"
# Seconds a reader's page stays open before Generate is clicked: a short prompt's typing.
READER_SECONDS = 3


def in_browser(url, tokens):
    """A fresh browser's first load of the page writing at once (`run=1`), then the same page writing twice more
    (warm: its WebAssembly compiled by then), greedy each time: seconds to ready and to the first token, and
    tokens/s after the first, first and warm."""
    driver = browser()
    try:
        output = written(driver, url, PROMPT, tokens, temperature=0)
        ready = float(output.get_attribute("data-ready-seconds"))
        measured = dict(ready=ready, first=ready + float(output.get_attribute("data-first-token-seconds")),
                        rate=float(output.get_attribute("data-tokens-per-second")))
        warm = []
        for _ in range(2):
            driver.execute_script("document.getElementById('output').dataset.state = 'asked'")
            driver.find_element("id", "generate").click()
            deadline = time.monotonic() + 600
            while output.get_attribute("data-state") != "done" and time.monotonic() < deadline:
                time.sleep(0.02)
            warm.append(float(output.get_attribute("data-tokens-per-second")))
        return dict(measured, warm=statistics.median(warm))
    finally:
        driver.quit()


def as_a_reader(url, tokens):
    """A fresh browser's first load of the page, left open `READER_SECONDS` (a person typing a prompt, the page
    warming its model meanwhile) before Generate is clicked: tokens/s after the first token, greedy."""
    driver = browser()
    try:
        query = urllib.parse.urlencode(dict(prompt=PROMPT, max_new_tokens=tokens, temperature=0))
        driver.get(f"{url}/?{query}")
        output = driver.find_element("id", "output")
        deadline = time.monotonic() + 600
        while output.get_attribute("data-state") != "ready" and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(READER_SECONDS)
        driver.find_element("id", "generate").click()
        while output.get_attribute("data-state") not in ("done", "error") and time.monotonic() < deadline:
            time.sleep(0.02)
        assert output.get_attribute("data-state") == "done", driver.find_element("id", "message").text
        return float(output.get_attribute("data-tokens-per-second"))
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


def llama_cpp_rate(model, path, tokens):
    """llama.cpp's tokens/s on the model's f32 GGUF, greedy (the median of 3 calls after one), or None without
    llama-cpp-python. Past the model's context it runs on, where gptlite reads the last window again."""
    import importlib.util

    if importlib.util.find_spec("llama_cpp") is None:
        return None
    from helpers.llama_cpp import open_llama_cpp

    if not path.exists():
        gptlite.export_gguf(model, path, "f32")
    prompt = [int(i) for i in model.tokenizer.encode(PROMPT)]
    llm = open_llama_cpp(path, len(prompt) + tokens + 1)

    def run():
        return list(itertools.islice(llm.generate(prompt, temp=0.0, top_k=1, reset=True), tokens))

    run()
    times = []
    for _ in range(3):
        started = time.perf_counter()
        run()
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
        server, address = serve(folder)
        for shape in args.shapes:
            model = model_of(shape)
            for outtype in OUTTYPES[shape]:
                started = time.perf_counter()
                gptlite.export_web(model, root / f"{shape}-{outtype}", outtype)
                exported = time.perf_counter() - started
                size = sum((root / f"{shape}-{outtype}" / name).stat().st_size
                           for name in ("model.onnx", "weights.bin")) / 2**20
                for tokens in TOKENS[shape]:
                    python = python_rate(model, tokens)
                    llama = llama_cpp_rate(model, root / f"{shape}.gguf", tokens)
                    rounds = [in_browser(f"{address}/{shape}-{outtype}", tokens)
                              for _ in range(args.rounds)]
                    ready, first, rate, warm = (statistics.median(load[key] for load in rounds)
                                                for key in ("ready", "first", "rate", "warm"))
                    reader = statistics.median(as_a_reader(f"{address}/{shape}-{outtype}", tokens)
                                               for _ in range(args.rounds))
                    llama_said = "" if llama is None else f"; llama.cpp f32 {llama:.1f} tokens/s, page/llama.cpp " \
                                                          f"{warm / llama:.2f}x warm"
                    print(f"{shape} {outtype}, {tokens} tokens: model.onnx and weights.bin {size:.1f} MiB, exported in "
                          f"{exported:.1f} "
                          f"s; page ready {ready:.2f} s after load, first token {first:.2f} s; {rate:.1f} tokens/s "
                          f"(warm page {warm:.1f}; a reader's page, open {READER_SECONDS} s first, {reader:.1f}); "
                          f"Python gptlite.generate {python:.1f} tokens/s; page/Python {rate / python:.2f}x (warm "
                          f"{warm / python:.2f}x, reader's {reader / python:.2f}x){llama_said}; medians of "
                          f"{args.rounds}")
        server.shutdown()


if __name__ == "__main__":
    main()
