"""The pictures of docs/inspection.md's film: a run kept with `--film`, exported as the web page with its film,
opened in headless Chromium (Debian's, under Selenium) at a frame, and each part of the film view photographed.

    python docs/film_pictures.py --name induction [--run RUN] [--step STEP]
    python docs/film_pictures.py --name shakespeare --run runs/shakespeare [--step STEP] [--pattern previous_token]

Without --run it trains one first in a temporary folder: `train.py --synthetic induction --film` for the name
`induction`, else `train.py TEXT --film` on --text (Tiny Shakespeare by default). --step picks the frame (the
nearest at or before it; default: the film's first induction onset, else its last frame), --pattern the heads'
pattern shown. Writes docs/film_<name>_<part>.png for the parts losses, heads, probe, embedding and writing.
"""

import argparse
import functools
import http.server
import pathlib
import tempfile
import threading

from inside_pictures import _drawn, _Quiet, chromium  # the Inside view's pictures' browser, wait and server

DOCS = pathlib.Path(__file__).resolve().parent
PARTS = ("losses", "heads", "probe", "embedding", "writing")


def _trained(name, text, folder):
    import gptlite

    if name == "induction":
        gptlite.train_on_text(out_dir=folder / "run", synthetic="induction", film=True)
    else:
        gptlite.train_on_text([str(text)], folder / "run", film=True)
    return folder / "run"


def photograph(url, name, step, pattern):
    driver = chromium(900, 2400)
    try:
        driver.get(f"{url}/?frame={step}")
        _drawn(driver.find_element("id", "film"))
        if pattern:
            driver.find_element("css selector", f'button[data-pattern="{pattern}"]').click()
        for part in PARTS:
            driver.find_element("css selector", f".film-{part}").screenshot(str(DOCS / f"film_{name}_{part}.png"))
            print(f"wrote docs/film_{name}_{part}.png")
    finally:
        driver.quit()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--name", required=True, help="the pictures' name: induction, or another (a text's run)")
    parser.add_argument("--run", type=pathlib.Path, help="a run folder that kept a film (default: train one)")
    parser.add_argument("--text", type=pathlib.Path, default=DOCS.parent.parent / "shared" / "data" /
                        "tinyshakespeare.txt", help="the text to train on, without --run")
    parser.add_argument("--step", type=int, help="the frame to photograph: the nearest at or before this step")
    parser.add_argument("--pattern", help="the heads' pattern shown (default: induction)")
    args = parser.parse_args()

    import gptlite

    with tempfile.TemporaryDirectory() as folder:
        folder = pathlib.Path(folder)
        run = args.run or _trained(args.name, args.text, folder)
        movie = gptlite.film(run)
        step = args.step if args.step is not None else movie.induction_onset() or movie.frames[-1].step
        print(movie.table())
        gptlite.export_web(gptlite.load(run / "model.keras"), folder / "site", film=movie)
        handler = functools.partial(_Quiet, directory=str(folder / "site"))
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            photograph(f"http://127.0.0.1:{server.server_port}", args.name, step, args.pattern)
        finally:
            server.shutdown()


if __name__ == "__main__":
    main()
