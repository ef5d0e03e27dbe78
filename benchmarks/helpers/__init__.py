"""What the benchmarks share, in one place: child processes as on a new machine and their timing
(`new_machine`, `run_child`, `in_turns`, `medians`, `time_*`, `stolen_share`), the generation benchmarks'
random-weight models (`helpers.models`), and a `gptlite serve` under load (`SERVE_SHAPES`,
`make_model`, `start_server`, `load_phase`, ...). Every script of this folder imports it as `helpers`; none
imports another script.

A Keras backend is fixed for the life of a process, so each backend's measurement runs in a process of its own
and prints its results as one JSON line, last. A child that should run other code than this checkout's (`--code
DIR`) gets DIR first on its PYTHONPATH (`with_code`).
"""

import json
import os
import pathlib
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = pathlib.Path(__file__).resolve().parent.parent  # benchmarks/: the scripts run there
REPO = HERE.parent
# What would name a compile cache for a process: a new user has none of them.
NAMES_A_CACHE = ("GPTLITE_COMPILE_CACHE", "TF_XLA_FLAGS", "JAX_COMPILATION_CACHE_DIR")


def new_machine(home):
    """This process's environment as on a machine that never ran gptlite: `home` (made if missing) for the home
    and cache folders, and no compile cache named."""
    pathlib.Path(home).mkdir(parents=True, exist_ok=True)
    environment = {name: value for name, value in os.environ.items() if name not in NAMES_A_CACHE}
    environment.update(HOME=str(home), XDG_CACHE_HOME=str(pathlib.Path(home) / ".cache"))
    return environment


def run_child(label, command, env, python=sys.executable):
    """Run `command` (after the Python interpreter `python`) in this folder; its last line of output as a dict.

    A child that fails stops the benchmark with `label` and the end of its error output.
    """
    child = subprocess.run([python, *command], env=env, capture_output=True, text=True, cwd=HERE)
    if child.returncode:
        sys.exit(f"{label} failed:\n{child.stderr[-3000:]}")
    return json.loads(child.stdout.splitlines()[-1])


def in_turns(names, rounds, run, file=sys.stdout):
    """Each name's results over `rounds` rounds, {name: [result, ...]}.

    Every round calls `run(name, round_index)` (a dict of figures) for each
    name in turn, so that the machine's noise hits them all alike; each
    result is printed to `file` as it comes.
    """
    results = {name: [] for name in names}
    for round_index in range(rounds):
        for name in names:
            result = run(name, round_index)
            results[name].append(result)
            label = " ".join(name) if isinstance(name, tuple) else name
            figures = ", ".join(f"{key} {value:.4g}" for key, value in result.items()
                                if isinstance(value, (int, float)))
            print(f"round {round_index + 1}, {label}: {figures}", file=file, flush=True)
    return results


def medians(results, keys):
    """{name: {key: its median over the rounds}} of `in_turns`' results."""
    return {name: {key: statistics.median(run[key] for run in runs) for key in keys} for name, runs in results.items()}


def time_calls(call, repeats):
    """(seconds of a first, cold call, the median seconds of `repeats` calls after it, the first call's result)."""
    start = time.perf_counter()
    result = call()
    cold = time.perf_counter() - start
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return cold, statistics.median(times), result


def time_steps(step, steps, warmup_steps=2):
    """ms per call of `step` over `steps` calls after `warmup_steps`, and the process's peak RSS by then."""
    for _ in range(warmup_steps):
        step()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return {"ms_per_step": 1000 * (time.perf_counter() - start) / steps, "peak_rss_mb": peak_rss_mb()}


def time_training(model, config, vocabulary_size, warmup_steps):
    """Optimizer steps of a built gptlite model under `gptlite.training.fit.train`, as a fine-tuning run takes them,
    on random token ids: ms per step after `warmup_steps` (which include compiling), its trained parameters, and
    the process's peak RSS by the last step (the evaluation and the saving of model.keras that end the run come
    after). `config` is a `TrainingConfig` of `warmup_steps` + the steps to time."""
    import tempfile

    import keras
    import numpy as np

    from gptlite.training import fit

    ids = np.random.default_rng(0).integers(0, vocabulary_size, 200_000).astype(np.uint16)
    times, peaks = [], []

    class Timer(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            times.append(time.perf_counter())
            peaks.append(peak_rss_mb())

    with tempfile.TemporaryDirectory() as out:
        fit.train(model, ids, ids[:5000], config, out, "lm", verbose=0, callbacks=[Timer()])
    steady = times[warmup_steps - 1:]
    trainable = sum(int(np.prod(w.shape)) for w in model.trainable_weights)
    return {"ms_per_step": 1000 * (steady[-1] - steady[0]) / (len(steady) - 1), "trainable": trainable,
            "peak_rss_mb": peaks[-1]}


def cpu_ticks():
    """The machine's CPU time so far from /proc/stat, in ticks: (all of it, the part of it "stolen", that the
    hypervisor of a virtual machine gave to other machines while this one had work); (0, 0) without /proc/stat."""
    try:
        with open("/proc/stat") as file:
            fields = [int(value) for value in file.readline().split()[1:9]]
    except (OSError, ValueError):
        return 0, 0
    return sum(fields), fields[7]  # user nice system idle iowait irq softirq steal


def stolen_share(before):
    """The share of the machine's CPU time stolen since `before` (a `cpu_ticks()`): on a shared host, figures
    measured while it is high are slower by about that much, and noisier."""
    total, stolen = cpu_ticks()
    return round((stolen - before[1]) / max(1, total - before[0]), 3)


def peak_rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kilobytes on Linux


def with_code(environment, code):
    """`environment` with the gptlite of the checkout `code` first on the path a child imports from."""
    return {**environment, "PYTHONPATH": os.pathsep.join(filter(None, [str(code), environment.get("PYTHONPATH")]))}


# --- gptlite serve under load

SERVE_SHAPES = {"cpu": dict(n_layer=4, n_head=4, n_embd=128, block_size=64),
                "wide": dict(n_layer=6, n_head=6, n_embd=384, block_size=256)}
CHARACTERS = "\n !$&',-.3:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"  # Tiny Shakespeare's 65
# An empty prompt starts from a newline: with 64 new tokens, the text fills the cpu shape's 64-token
# context exactly (its last token needs one whole-window pass), so the figures are of decoding within
# the context, not of a window sliding past it.
PROMPT = ""


def make_model(shape, folder):
    import gptlite

    tokenizer = gptlite.CharTokenizer(CHARACTERS)
    model = gptlite.GPT(vocab_size=tokenizer.vocabulary_size, tokenizer=tokenizer, **SERVE_SHAPES[shape])
    model.build((None, model.config.block_size))
    path = pathlib.Path(folder) / f"{shape}.keras"
    gptlite.save(model, path)
    return path


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_server(model, port, max_batch, max_queue, cache, code=REPO, flags=()):
    """Launch `gptlite serve` as on a new machine, its home folder `cache` (empty on a cold start: the compile cache
    is gptlite's default folder in it, and no cache is named); (process, seconds from launch to /health's first
    answer, seconds until it says it is ready, its warm-up done)."""
    environment = new_machine(cache)
    started = time.perf_counter()
    # Its output goes to a file: a pipe that nobody reads until the end would stop a server that logs much.
    log = tempfile.TemporaryFile("w+")
    process = subprocess.Popen(
        [sys.executable, "-m", "gptlite", "serve", str(model), "--port", str(port), "--max-batch", str(max_batch),
         "--max-queue", str(max_queue), *flags],
        cwd=code, stdout=log, stderr=subprocess.STDOUT, text=True, env=environment)
    import httpx

    deadline = time.monotonic() + 600
    ready = None
    while True:
        if process.poll() is not None:
            log.seek(0)
            sys.exit(f"the server failed:\n{log.read()[-3000:]}")
        if time.monotonic() > deadline:
            sys.exit("the server did not become ready in 10 minutes")
        try:
            health = httpx.get(f"http://127.0.0.1:{port}/health")
            ready = ready or time.perf_counter() - started  # it answers (503 while it warms up)
            if health.status_code == 200 and not health.json().get("compiling"):
                return process, ready, time.perf_counter() - started
        except httpx.TransportError:
            pass
        time.sleep(0.05)


def wait_settled(port):
    """Wait until a ready server has built what it builds after ready (/health's `building` at 0; older code has
    no such count); the seconds waited."""
    import httpx

    started = time.perf_counter()
    while httpx.get(f"http://127.0.0.1:{port}/health").json().get("building", 0):
        if time.perf_counter() - started > 600:
            sys.exit("the server did not build its programs after ready in 10 minutes")
        time.sleep(0.05)
    return time.perf_counter() - started


# Each request's sampling settings, by its number: a mix, as many clients send.
TEMPERATURES = (0.6, 0.8, 1.0, 1.2)
TOP_PS = (0.9, 1.0)


def request_body(tokens, number, stream):
    """Request `number`'s body: `tokens` new tokens of a new text, its temperature and top_p by turns."""
    return {"prompt": PROMPT, "max_tokens": tokens, "temperature": TEMPERATURES[number % len(TEMPERATURES)],
            "top_p": TOP_PS[number // len(TEMPERATURES) % len(TOP_PS)], "stream": stream}


def in_threads(client, clients):
    """Run client(number) on `clients` threads at once; the seconds until the last is done."""
    started = time.perf_counter()
    threads = [threading.Thread(target=client, args=(number,)) for number in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - started


def complete(http, tokens, number, stream=True):
    """One request, streamed or not; (seconds, seconds to its first text, status, ok). Unstreamed, the first
    text comes with the whole answer."""
    body = request_body(tokens, number, stream)
    started = time.perf_counter()
    if not stream:
        response = http.post("/v1/completions", json=body)
        seconds = time.perf_counter() - started
        ok = response.status_code == 200 and response.json()["usage"]["completion_tokens"] == tokens \
            and response.json()["choices"][0]["finish_reason"] == "length"
        return seconds, seconds, response.status_code, ok
    first, text, reasons = None, "", []
    with http.stream("POST", "/v1/completions", json=body) as response:
        status = response.status_code
        for line in response.iter_lines():
            if not line.startswith("data: {"):
                continue
            for choice in json.loads(line[6:]).get("choices", []):
                if choice["text"] and first is None:
                    first = time.perf_counter() - started
                text += choice["text"]
                reasons.append(choice["finish_reason"])
    seconds = time.perf_counter() - started
    # A character model: one character a token.
    ok = status == 200 and len(text) == tokens and "length" in reasons
    return seconds, first if first is not None else seconds, status, ok


def load_phase(url, clients, requests, tokens, stream=True):
    import httpx

    results = []
    lock = threading.Lock()

    def client(number):
        with httpx.Client(base_url=url, timeout=600) as http:
            for request in range(requests):
                result = complete(http, tokens, number * requests + request, stream)
                with lock:
                    results.append(result)

    elapsed = in_threads(client, clients)
    latencies = sorted(seconds for seconds, _, _, _ in results)
    firsts = sorted(first for _, first, _, _ in results)
    p99 = lambda values: values[min(len(values) - 1, int(0.99 * len(values)))]
    return dict(
        clients=clients, stream=stream, requests=len(results), complete=sum(ok for *_, ok in results),
        errors_5xx=sum(status >= 500 for _, _, status, _ in results),
        p50_s=statistics.median(latencies), p99_s=p99(latencies),
        first_text_p50_s=statistics.median(firsts), first_text_p99_s=p99(firsts),
        tokens_per_s=sum(ok for *_, ok in results) * tokens / elapsed,
    )


def rss_mb(pid):
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def wave(model, rows, tokens):
    """Seconds to admit `rows` empty prompts and draw `tokens` new tokens for each."""
    from gptlite.decode.engine import Engine
    from gptlite.decode.sampling import SamplingConfig
    from gptlite.serving.worker import ENGINE_SETTINGS

    configs = [SamplingConfig(temperature=TEMPERATURES[row % len(TEMPERATURES)],
                              top_p=TOP_PS[row // len(TEMPERATURES) % len(TOP_PS)], seed=row) for row in range(rows)]
    prompt = model.tokenizer.encode("\n")
    started = time.perf_counter()
    engine = Engine(model, rows, **ENGINE_SETTINGS)
    drawn = engine.admit([prompt] * rows, configs)
    made = 1
    while made < tokens:
        drawn = engine.step(min(32, tokens - made))
        made += len(next(iter(drawn.values())).ids)
    return time.perf_counter() - started


def run_training(command):
    """Run a training command; (its completed process, its wall time in seconds). A failed one ends the
    benchmark with its output's end."""
    started = time.perf_counter()
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    if result.returncode:
        sys.exit(result.stdout[-2000:] + result.stderr[-3000:])
    return result, time.perf_counter() - started


# --- drawing

def draw_lines(lines, path, xlabel, title=None, size=(6, 4), **axes_settings):
    """A PNG at `path` of validation losses: `lines` maps each label to (x values, losses, matplotlib's line
    settings); `axes_settings` go to the axes (`ylim=(None, 3.5)`)."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=size, dpi=100)
    axes = figure.subplots()
    for label, (xs, losses, style) in lines.items():
        axes.plot(xs, losses, label=label, **style)
    axes.set(xlabel=xlabel, ylabel="validation loss (nats per character)", **axes_settings)
    if title:
        axes.set_title(title, fontsize=10)
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, format="png")
