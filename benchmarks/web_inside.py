"""The web page's Inside view in headless Chromium (Debian's, under Selenium), each round a fresh browser: a link that
opens the view at a token of a full window, then a click on each step, each token and each layer.

    python benchmarks/web_inside.py [--shapes laptop gpt2] [--rounds 3]

For each shape: the export's seconds and its files' sizes (model.onnx, inside.onnx, weights.bin); the page's
seconds from its navigation to ready (as web_page.py reads it) and to the view shown (the inside graph loaded and
run on the text, the view drawn); then milliseconds from a click to the next frame painted, for each step, for a
token and for a layer: medians and the largest; and, where the view runs the model again, milliseconds from a click to
the view drawn again: a head knocked out, put back, every head scored. Shapes: `laptop`, the default preset's model with its 64-token
window full; `gpt2`, GPT-2 small's (random weights, 64 tokens; speed only).
"""

import argparse
import pathlib
import statistics
import subprocess
import tempfile
import time
import urllib.parse

import gptlite
from helpers.browser import browser, serve
from helpers.models import model_of

# From a click to the frame after it: the view is drawn in the click's own task, then painted.
CLICK_TO_PAINT = """
const [selector, done] = [arguments[0], arguments[arguments.length - 1]];
const target = document.querySelector(selector);
const started = performance.now();
target.click();
requestAnimationFrame(() => setTimeout(() => done(performance.now() - started), 0));
"""


# From a click to the view drawn again after the model has run again (a head knocked out, every head scored): the
# view says "done" once it is, then it is painted.
CLICK_TO_DONE = """
const [selector, done] = [arguments[0], arguments[arguments.length - 1]];
const inside = document.getElementById("inside");
const started = performance.now();
document.querySelector(selector).click();
const poll = () => inside.dataset.state === "done"
  ? requestAnimationFrame(() => setTimeout(() => done(performance.now() - started), 0)) : setTimeout(poll, 1);
setTimeout(poll, 0);
"""


def one_round(url, prompt):
    """A fresh browser opening the view at token 10 of `prompt`: seconds to ready and to the view, and each click's
    milliseconds to paint, by what was clicked."""
    driver = browser()
    try:
        query = urllib.parse.urlencode(dict(prompt=prompt, token=10, step="softmax"))
        driver.get(f"{url}/?{query}")
        inside = driver.find_element("id", "inside")
        deadline = time.monotonic() + 600
        while inside.get_attribute("data-state") not in ("done", "error") and time.monotonic() < deadline:
            time.sleep(0.01)
        assert inside.get_attribute("data-state") == "done", inside.text
        shown = driver.execute_script("return performance.now() / 1000")  # an upper bound: polled
        ready = float(driver.find_element("id", "output").get_attribute("data-ready-seconds"))
        tokens = len(driver.execute_script("return window.gptliteInside().ids"))
        steps = [button.get_attribute("data-step") for button in driver.find_elements("css selector", "[role=tab]")]
        clicks = {}
        for step in steps:
            if step != "head_roles":  # timed below, to the grid drawn
                clicks[f"step {step}"] = driver.execute_async_script(CLICK_TO_PAINT, f'[data-step="{step}"]')
        clicks["token 20"] = driver.execute_async_script(CLICK_TO_PAINT, '[data-token="20"]')
        # A select's change, as a click on an option gives it.
        clicks["layer 1"] = driver.execute_async_script(CLICK_TO_PAINT.replace(
            "target.click();", "target.value = '1'; target.dispatchEvent(new Event('change'));"),
            '[aria-label="layer"]')
        runs = {}
        if "head_roles" in steps:  # the model run again: a head knocked out, then back in; every head scored
            driver.execute_async_script(CLICK_TO_PAINT, '[data-step="heads"]')
            runs["knock a head out"] = driver.execute_async_script(CLICK_TO_DONE, '[data-knock-out="1.0"]')
            runs["put it back"] = driver.execute_async_script(CLICK_TO_DONE, '[data-knock-out="1.0"]')
            runs["score every head"] = driver.execute_async_script(CLICK_TO_DONE, '[data-step="head_roles"]')
        return dict(ready=ready, shown=shown, clicks=clicks, tokens=tokens, runs=runs)
    finally:
        driver.quit()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=["laptop", "gpt2"], choices=["laptop", "gpt2"])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    version = subprocess.run(["chromium", "--version"], capture_output=True, text=True, check=False).stdout.strip()
    print(f"# {version}; one thread (no cross-origin isolation)")
    with tempfile.TemporaryDirectory() as folder:
        root = pathlib.Path(folder)
        server, address = serve(folder)
        for shape in args.shapes:
            model = model_of(shape)
            started = time.perf_counter()
            gptlite.export_web(model, root / shape)
            exported = time.perf_counter() - started
            sizes = {name: (root / shape / name).stat().st_size / 2**20 for name in ("model.onnx", "inside.onnx",
                                                                                      "weights.bin")}
            # A text that fills the window: the model's own vocabulary's pieces, cut to 64 tokens.
            pieces = "".join(model.tokenizer.pieces(list(range(min(model.config.vocab_size, 300))))) * 2
            prompt = model.tokenizer.decode(model.tokenizer.encode(pieces)[:64])
            rounds = [one_round(f"{address}/{shape}", prompt) for _ in range(args.rounds)]
            clicks = [value for load in rounds for value in load["clicks"].values()]
            slowest = max(((value, name) for load in rounds for name, value in load["clicks"].items()))
            print(f"{shape}: exported in {exported:.1f} s, model.onnx {sizes['model.onnx']:.1f} MiB, inside.onnx "
                  f"{sizes['inside.onnx']:.1f} MiB, weights.bin {sizes['weights.bin']:.1f} MiB; page ready "
                  f"{statistics.median(r['ready'] for r in rounds):.2f} s "
                  f"after load, the view shown {statistics.median(r['shown'] for r in rounds):.2f} s after load; a "
                  f"click to its paint: median {statistics.median(clicks):.1f} ms, slowest {slowest[0]:.1f} ms "
                  f"({slowest[1]}), over {len(clicks)} clicks in {args.rounds} rounds; {rounds[0]['tokens']} tokens "
                  f"read")
            for name in rounds[0]["runs"]:
                print(f"  {name}: median {statistics.median(r['runs'][name] for r in rounds):.1f} ms, slowest "
                      f"{max(r['runs'][name] for r in rounds):.1f} ms")
        server.shutdown()


if __name__ == "__main__":
    main()
