"""What a film costs a run, and what the synthetic induction task's film shows.

    python benchmarks/film.py cost [--text ../shared/data/tinyshakespeare.txt] [--preset cpu] [--pairs 2]
    python benchmarks/film.py induction [--seeds 1 2 3]

`cost`: the same run (`python train.py TEXT --preset cpu`, each in a fresh process with HOME and XDG_CACHE_HOME in a
new empty folder), with the film and without, alternated `--pairs` times: each run's wall time, its folder's size and
its film's; the medians and their ratio.

`page`: a run's page with its film (`gptlite export --format web --film`, at each `--outtype`) in headless Chromium:
the folder's size and the film's; then, from the last frame, the slider moved back a frame at a time by the arrow key,
each timed from the key to the film view painted and to the Inside view of that frame drawn (the first time a frame is
shown, its inside graph is loaded); then forward and back again over the same frames, loaded: medians and the
slowest.

    python benchmarks/film.py page --run RUN [--outtypes f32 int8] [--frames 8]

`induction`: `train.py --synthetic induction --film` with each seed, then its film read back (`gptlite.film`): the
largest induction score at step 0 and at the end (beside the perfect score on the probe), the two halves' losses on
the repeated probes at the end, the step marked as the first induction head's onset and the frames of the largest
fall in the second half's loss.
"""

import argparse
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

REPO = pathlib.Path(__file__).resolve().parent.parent


def folder_bytes(folder):
    return sum(path.stat().st_size for path in pathlib.Path(folder).rglob("*") if path.is_file())


def train(arguments, home):
    """Seconds a `train.py` run with `arguments` takes from its start to its exit, in a fresh process."""
    env = {"HOME": str(home), "XDG_CACHE_HOME": str(home / ".cache"), "PATH": "/usr/bin:/bin",
           "PYTHONPATH": str(REPO)}
    started = time.perf_counter()
    subprocess.run([sys.executable, str(REPO / "train.py"), *arguments], check=True, env=env,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - started


def cost(options):
    seconds = {"without": [], "with": []}
    with tempfile.TemporaryDirectory() as scratch:
        scratch = pathlib.Path(scratch)
        for pair in range(options.pairs):
            for kind in (("without", "with") if pair % 2 == 0 else ("with", "without")):
                home, out = scratch / f"home-{pair}-{kind}", scratch / f"run-{pair}-{kind}"
                home.mkdir()
                flags = ["--film"] if kind == "with" else []
                took = train([options.text, "--preset", options.preset, "--out", str(out), *flags], home)
                seconds[kind].append(took)
                film = folder_bytes(out / "film") if (out / "film").exists() else 0
                print(f"{kind} the film: {took:.1f} s; folder {folder_bytes(out) / 1e6:.1f} MB, film "
                      f"{film / 1e6:.1f} MB", flush=True)
    medians = {kind: statistics.median(values) for kind, values in seconds.items()}
    print(f"medians: without {medians['without']:.1f} s, with {medians['with']:.1f} s; "
          f"ratio {medians['with'] / medians['without']:.3f}")


def induction(options):
    import gptlite
    from gptlite.inside.heads import induction_pattern

    with tempfile.TemporaryDirectory() as scratch:
        scratch = pathlib.Path(scratch)
        for seed in options.seeds:
            home, out = scratch / f"home-{seed}", scratch / f"run-{seed}"
            home.mkdir()
            took = train(["--synthetic", "induction", "--film", "--seed", str(seed), "--out", str(out)], home)
            movie = gptlite.film(out)
            steps = [frame.step for frame in movie.frames]
            largest = movie.scores()["induction"].max(axis=(1, 2))
            probe = movie.heads(0).probe
            perfect = float(induction_pattern(probe).sum(axis=-1).mean())  # a head that looks nowhere else
            halves = [movie.probe_loss(index) for index in range(len(movie))]
            second = np.array([half.second_half for half in halves])
            fall = int(np.argmax(-np.diff(second))) + 1
            onset = movie.induction_onset()
            previous = [step for step in movie.onsets()["previous_token"].ravel() if step is not None]
            print(f"seed {seed}: {took:.0f} s; largest induction score {largest[0]:.3f} at step 0, "
                  f"{largest[-1]:.3f} at step {steps[-1]} (perfect on the probe: {perfect:.3f}, "
                  f"so {largest[-1] / perfect:.0%} of it); probe loss at the end: first half "
                  f"{halves[-1].first_half:.3f}, second half {halves[-1].second_half:.3f}; onset at step {onset}"
                  f" (frame {steps.index(onset) if onset is not None else None}); largest fall of the second half's "
                  f"loss from frame {fall - 1} (step {steps[fall - 1]}) to {fall} (step {steps[fall]}), "
                  f"{second[fall - 1]:.3f} to {second[fall]:.3f}; previous-token heads' onsets: "
                  f"{sorted(previous) or 'none'}", flush=True)


# From a key on the slider to the film view painted, then to the Inside view of the frame drawn (the address names
# the frame once it is): [milliseconds to paint, milliseconds to the Inside view].
KEY_TO_FRAME = """
const [step, move, done] = [arguments[0], arguments[1], arguments[arguments.length - 1]];
const slider = document.querySelector(".film-slider");
const started = performance.now();
slider.value = String(Number(slider.value) + move);
slider.dispatchEvent(new Event("input"));
requestAnimationFrame(() => setTimeout(() => {
  const painted = performance.now() - started;
  const poll = () => (new URLSearchParams(location.search).get("frame") === String(step)
      && document.getElementById("inside").dataset.state === "done"
    ? done([painted, performance.now() - started]) : setTimeout(poll, 2));
  poll();
}, 0));
"""


def page(options):
    import gptlite
    from helpers.browser import browser, serve

    movie = gptlite.film(options.run)
    model = gptlite.load(options.run / "model.keras")
    with tempfile.TemporaryDirectory() as scratch:
        for outtype in options.outtypes:
            site = pathlib.Path(scratch) / outtype
            started = time.perf_counter()
            gptlite.export_web(model, site, outtype=outtype, film=movie)
            print(f"{outtype}: export {time.perf_counter() - started:.1f} s; folder {folder_bytes(site) / 2**20:.1f} "
                  f"MiB, of which the film {folder_bytes(site / 'film') / 2**20:.1f} MiB "
                  f"({len(movie)} frames)", flush=True)
            server, url = serve(site)
            driver = browser()
            try:
                driver.get(f"{url}/?frame={movie.frames[-1].step}")
                deadline = time.monotonic() + 300
                while driver.execute_script("return document.getElementById('inside').dataset.state") != "done" \
                        and time.monotonic() < deadline:
                    time.sleep(0.05)
                last = len(movie) - 1
                # Back a frame at a time (each frame's graph loaded the first time), forward again over the same
                # frames (each loaded already), and back once more.
                walks = {"first": [(last - back, -1) for back in range(1, options.frames + 1)],
                         "loaded": [(last - options.frames + ahead, 1) for ahead in range(1, options.frames + 1)]
                         + [(last - back, -1) for back in range(1, options.frames + 1)]}
                for visit, walk in walks.items():
                    timings = [driver.execute_async_script(KEY_TO_FRAME, movie.frames[index].step, move)
                               for index, move in walk]
                    painted, inside = zip(*timings)
                    print(f"  {visit} showing: to the film painted median {statistics.median(painted):.1f} ms "
                          f"(slowest {max(painted):.1f}); to the Inside view of the frame median "
                          f"{statistics.median(inside):.1f} ms (slowest {max(inside):.1f})", flush=True)
            finally:
                driver.quit()
                server.shutdown()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    measured = commands.add_parser("cost")
    measured.add_argument("--text", default=str(REPO.parent / "shared" / "data" / "tinyshakespeare.txt"))
    measured.add_argument("--preset", default="cpu")
    measured.add_argument("--pairs", type=int, default=2)
    filmed = commands.add_parser("induction")
    filmed.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    shown = commands.add_parser("page")
    shown.add_argument("--run", type=pathlib.Path, required=True)
    shown.add_argument("--outtypes", nargs="+", default=["f32", "int8"])
    shown.add_argument("--frames", type=int, default=8)
    options = parser.parse_args()
    {"cost": cost, "induction": induction, "page": page}[options.command](options)


if __name__ == "__main__":
    main()
