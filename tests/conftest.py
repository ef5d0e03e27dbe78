"""Shared fixtures: small texts and tiny models, built once per test session."""

import atexit
import importlib.util
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile


_SESSION_FOLDER = "GPTLITE_TESTS_COMPILE_CACHE"


def _share_compiled_programs():
    """Keep compiled programs in a folder of this session's, for every test and child process, never the user's.

    Many tests train or decode the same tiny shapes, each in a function or a
    process of its own; TensorFlow and JAX then load the program compiled
    the first time instead of compiling it again. Set before either is imported.
    One folder for the session's every process: pytest-xdist's workers
    inherit it from the process that starts them (which made it, and removes
    it at its end), so a program one worker compiled, the others load.
    """
    folder = os.environ.get(_SESSION_FOLDER)
    if folder is None:
        folder = tempfile.mkdtemp(prefix="gptlite-tests-xla-")
        os.environ[_SESSION_FOLDER] = folder
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
    os.environ["GPTLITE_COMPILE_CACHE"] = folder  # gptlite's own decode programs, and TensorFlow's training steps
    os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", f"{folder}/jax")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")


def _compile_without_machine_code_optimisation():
    """XLA's machine code unoptimised (LLVM at -O0), for every test and child process.

    The tests' models are tiny and most of their programs run a few times, so
    compiling costs more than running: this took a fifth of the CPU time off
    the TensorFlow and JAX suites (docs/development.md). XLA's own graph
    passes (fusion, layout) still run, so each program computes what it does
    at the default level; float results may differ in the last bits, as they
    do between CPUs, which no test depends on. Set before TensorFlow or JAX
    is imported.
    """
    flags = os.environ.get("XLA_FLAGS", "")
    if "--xla_backend_optimization_level" not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} --xla_backend_optimization_level=0".strip()


_share_compiled_programs()
_compile_without_machine_code_optimisation()

import numpy as np
import pytest

import gptlite

gptlite.compile_cache.use()  # the folder named above, before the backend starts

REPO = pathlib.Path(__file__).resolve().parent.parent
# The web page's tests (tests/web/) build the GGUF tests' kinds of model (tests/weights/), whichever folder pytest
# collects first.
sys.path.insert(0, str(REPO / "tests" / "weights"))
# And the inside tests build the architecture tests' combinations of switches (tests/model/).
sys.path.insert(0, str(REPO / "tests" / "model"))
SHAKESPEARE = REPO.parent / "shared" / "data" / "tinyshakespeare.txt"


def make_text(num_words=6000, seed=0):
    """A small learnable language: words from a fixed list, a line break every 8 words."""
    words = ["the", "cat", "sat", "on", "a", "mat", "dog", "ran", "to", "big", "red", "hat", "and", "sun"]
    rng = np.random.default_rng(seed)
    chosen = rng.choice(words, size=num_words)
    lines = [" ".join(chosen[i:i + 8]) for i in range(0, num_words, 8)]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="session")
def text():
    return make_text()


@pytest.fixture(scope="session")
def tokenizer(text):
    return gptlite.CharTokenizer.from_text(text)


@pytest.fixture(scope="session")
def tiny_model(tokenizer):
    """A random-weight GPT small enough to build and run in milliseconds."""
    import keras

    keras.utils.set_random_seed(0)
    model = gptlite.GPT(
        vocab_size=tokenizer.vocabulary_size, n_layer=2, n_head=2, n_embd=16, block_size=16,
        tokenizer=tokenizer,
    )
    model.build((None, 16))
    return model


@pytest.fixture(scope="session")
def fluent_model(tokenizer, text):
    """A tiny GPT trained for a few seconds on `text`, so that what it writes depends on its context; trained once
    a session (`built_once`), every process reading it back.

    Greedy decoding from random weights mostly repeats one character, which
    would let a wrong context go unnoticed.
    """
    def train(folder):
        import keras

        keras.utils.set_random_seed(1)
        model = gptlite.GPT(
            vocab_size=tokenizer.vocabulary_size, n_layer=2, n_head=2, n_embd=32, block_size=16,
            tokenizer=tokenizer,
        )
        ids = tokenizer.encode(text).astype("int32")
        starts = np.random.default_rng(0).integers(0, len(ids) - 17, size=8192)
        windows = ids[starts[:, None] + np.arange(17)]  # (N, 17)
        model.compile(optimizer=keras.optimizers.Adam(1e-2),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        model.fit(windows[:, :-1], windows[:, 1:], batch_size=64, epochs=1, verbose=0)
        gptlite.save(model, folder / "model.keras")

    folder, _ = built_once("fluent", train)
    return gptlite.load(folder / "model.keras")


# Two computations of the same logits (a cache against a whole forward pass, one batch shape against
# another) agree to about 1e-6 on any CPU, but not bit for bit, and not the same way on every CPU: two
# tokens whose logits are closer than this are a tie that either computation may break either way.
TIE = 1e-4


def last_logits(model, windows):
    """Plain forward passes: the logits after the last token of each window (a list of id lists)."""
    padded = np.zeros((len(windows), model.config.block_size), "int32")
    for row, window in enumerate(windows):
        padded[row, : len(window)] = window  # the mask keeps the padding after it from mattering
    logits = np.asarray(model.predict_on_batch(padded))
    return logits[np.arange(len(windows)), [len(w) - 1 for w in windows]]  # (N, V)


def assert_greedy(model, prompt, text, slide=1):
    """`text` continues `prompt` greedily: each new token is the likeliest after the window before it, by the
    plain model's whole forward pass, up to a tie (TIE).

    This holds for a correct decoder on any CPU, whatever text it writes; comparing with a greedy text
    recomputed another way would fail wherever the two computations break a near-tie differently. The
    window holds the last block_size tokens; with `slide`, a full window keeps only its last
    block_size - slide tokens before the next one joins.
    """
    block_size = model.config.block_size
    ids, start = list(model.tokenizer.encode(text)), len(model.tokenizer.encode(prompt))
    assert text.startswith(prompt)
    window = ids[:start][-block_size:]
    for position in range(start, len(ids)):
        logits = last_logits(model, [window])[0]
        chosen = ids[position]
        assert logits[chosen] >= logits.max() - TIE, (
            f"new token {position - start} of {text!r} is {chosen}, whose logit {logits[chosen]:.6f} is below "
            f"the largest, {logits.max():.6f} (token {int(logits.argmax())})")
        window = (window[slide:] if len(window) == block_size else window) + [chosen]


# Decoding programs are kept on disk and shared between models under TensorFlow only through its private layer
# (gptlite.backend.program_bytes.private_layer); with GPTLITE_PRIVATE_APIS=off each process and model traces its own.
NEEDS_THE_PRIVATE_LAYER = pytest.mark.skipif(
    os.environ.get("GPTLITE_PRIVATE_APIS", "").strip().lower() in ("off", "0", "false", "no")
    and os.environ.get("KERAS_BACKEND", "tensorflow") == "tensorflow",
    reason="with GPTLITE_PRIVATE_APIS=off, TensorFlow programs are neither kept on disk nor shared between models")


def built_once(name, build):
    """(the folder `name`, what `build(folder)` returned): built in the first of the session's processes to ask,
    the others waiting for it and reading both back.

    pytest-xdist's workers each build a session fixture of their own, so one
    that trains for seconds costs that in every worker that uses it. A fixture
    that keeps what it made in this folder costs it once a session. A build
    that raised leaves nothing kept, and the next to ask builds again.
    """
    import fcntl
    import pickle

    root = pathlib.Path(os.environ[_SESSION_FOLDER]) / "built"
    root.mkdir(exist_ok=True)
    folder, returned = root / name, root / f"{name}.pickle"
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, even if `build` raises
        if not returned.exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            returned.write_bytes(pickle.dumps(build(folder)))
    return folder, pickle.loads(returned.read_bytes())


@pytest.fixture
def browser():
    """Headless Chromium under Selenium (Debian's chromium and chromium-driver); the test is skipped where either
    is missing. Chromium's temporary files go in a folder of their own, removed after: left in /tmp they pile up
    run after run. That folder's path stays short (tempfile's): Chromium keeps a Unix socket in it, whose path
    may not pass 108 characters, which a test's tmp_path under pytest-xdist does."""
    import shutil

    if importlib.util.find_spec("selenium") is None or not shutil.which("chromedriver"):
        pytest.skip("needs selenium and Debian's chromium and chromium-driver (.ci/run installs them)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1100,1300"):
        options.add_argument(argument)
    if shutil.which("chromium"):
        options.binary_location = shutil.which("chromium")
    folder = tempfile.mkdtemp(prefix="gptlite-chromium-")
    try:
        driver = webdriver.Chrome(service=Service(shutil.which("chromedriver"),
                                                  env={**os.environ, "TMPDIR": folder}), options=options)
        try:
            yield driver
        finally:
            driver.quit()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def new_machine(home):
    """This process's environment as a new machine's user has it: `home` for the home and cache folders, no
    compile cache named anywhere."""
    environment = {name: value for name, value in os.environ.items()
                   if name not in ("GPTLITE_COMPILE_CACHE", "TF_XLA_FLAGS", "JAX_COMPILATION_CACHE_DIR")}
    return dict(environment, HOME=str(home), XDG_CACHE_HOME=str(pathlib.Path(home) / ".cache"))


def run_python(*args, cwd=REPO, timeout=300, env=None):
    """Run a Python command line in a fresh process (in `env`, or this one's environment); return the
    CompletedProcess."""
    env = dict(env or os.environ, PYTHONUNBUFFERED="1")
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


class StopAtStep:
    """A stop request that comes, as from Ctrl-C, once the optimizer reaches `step`."""

    signal_number = signal.SIGINT

    def __init__(self, model, step):
        self.model, self.step = model, step

    @property
    def requested(self):
        import keras

        if keras.backend.backend() == "jax":
            self.model.jax_state_sync()  # JAX's fit holds the optimizer's state apart until asked
        return int(keras.ops.convert_to_numpy(self.model.optimizer.iterations)) >= self.step


def filmed_run():
    """The folder of a tiny run on generated text that kept a film (`train.py --film`), trained once a session."""
    def train(out):
        (out / "text.txt").write_text(make_text(3000, seed=4))
        gptlite.train_on_text([out / "text.txt"], out / "run", {"n_embd": 16}, preset="tiny", film=True, verbose=0)

    return built_once("filmed_tiny_run", train)[0] / "run"


@pytest.fixture(scope="session")
def seq2seq_tokenizer():
    return gptlite.CharTokenizer("abcde", special_tokens=("pad", "start", "end"))


@pytest.fixture(scope="session")
def tiny_seq2seq(seq2seq_tokenizer):
    """A random-weight Seq2Seq for sources and targets of up to 8 tokens."""
    import keras

    keras.utils.set_random_seed(0)
    model = gptlite.Seq2Seq(vocab_size=seq2seq_tokenizer.vocabulary_size, n_layer=2, n_head=2, n_embd=16,
                            block_size=8, tokenizer=seq2seq_tokenizer)
    model.build()
    return model


def reversal_pairs(count, seed=0):
    """Strings of 2 to 6 letters from "abcde", each with its reverse."""
    from gptlite.data import pairs

    rng = np.random.default_rng(seed)
    sources = ["".join(rng.choice(list("abcde"), size=rng.integers(2, 7))) for _ in range(count)]
    return pairs.Pairs(sources, [s[::-1] for s in sources])


@pytest.fixture(scope="session")
def reverser_run(seq2seq_tokenizer):
    """A tiny Seq2Seq trained by `fit.train` for a few seconds to reverse short strings, once a session
    (`built_once`): every process reads it back from the run's folder.

    Returns (model, evaluation rows, output folder, held-out PairSet).
    """
    from gptlite.data import pairs
    from gptlite.evaluation import scores
    from gptlite.training import fit

    held_out = pairs.encode(reversal_pairs(200, seed=2), seq2seq_tokenizer, 8)

    def train(out):
        import keras

        keras.utils.set_random_seed(0)
        model = gptlite.Seq2Seq(vocab_size=seq2seq_tokenizer.vocabulary_size, n_layer=1, n_head=2, n_embd=32,
                                block_size=8, tokenizer=seq2seq_tokenizer)
        config = gptlite.TrainingConfig(batch_size=64, max_iters=300, lr=3e-3, min_lr=3e-4, warmup_iters=10,
                                        eval_interval=150, eval_iters=4, checkpoint_interval=300)
        train_set = pairs.encode(reversal_pairs(4000, seed=1), seq2seq_tokenizer, 8)
        metrics = {"exact_match": lambda trained: scores.exact_matches(trained, held_out.pairs) / len(held_out)}
        return fit.train(model, train_set, held_out, config, out, "seq2seq", verbose=0, metrics=metrics)

    out, rows = built_once("reverser", train)
    return gptlite.load(out / "model.keras"), rows, out, held_out


@pytest.fixture(scope="session")
def reverser(reverser_run):
    """The trained reverser: mostly right, not always."""
    return reverser_run[0]


# A test that needs what the dev extra leaves out (another backend, torch for transformers' models, llama.cpp,
# Chromium) skips in the README's test command with a reason that starts so (pytest.importorskip's own reason
# does too), and must be marked `extras`: .ci/run runs those again once the extras are installed (-m extras), and
# an unmarked one would run in no suite of CI's at all.
NEEDS = ("needs ", "could not import ")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.skipped and item.get_closest_marker("extras") is None and isinstance(report.longrepr, tuple):
        reason = report.longrepr[2].removeprefix("Skipped: ")
        if reason.startswith(NEEDS):
            report.outcome = "failed"
            report.longrepr = (f"{item.nodeid} skipped ({reason}) but is not marked extras: no stage of .ci/run "
                               "would run it; mark it @pytest.mark.extras")
    return report


# Session fixtures that train a model for seconds: every test that reads one is slow by nature.
TRAINING_FIXTURES = ("trained_run", "reverser_run", "tiny_run", "uninterrupted", "uninterrupted_muon",
                     "one_batch_of_16")


def pytest_addoption(parser):
    parser.addoption("--whole", action="store_true",
                     help="run the whole suite: the tests marked slow too (training, child processes, llama.cpp, "
                          "the browser, many compiles), which `python -m pytest` leaves out")


def pytest_collection_modifyitems(config, items):
    """Without `--whole`, the tests marked `slow` (each slow by nature: it trains, starts a child process, runs
    llama.cpp or a browser, or compiles programs for many shapes) are left out: `python -m pytest` is the fast
    loop, `python -m pytest --whole` the suite CI runs. A test that reads a model trained for the session is slow.
    A test marked `once(reason)` checks what no backend changes: the JAX and torch suites skip it, saying why.
    The tests marked `long` go first: the suite runs in several processes, and one such test handed out last
    would leave the others idle while it runs. (They use no module's fixtures, so moving them splits none.)"""
    import keras

    other_backend = keras.backend.backend() != "tensorflow"
    for item in items:
        if set(TRAINING_FIXTURES) & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
        once = item.get_closest_marker("once")
        if once is not None and other_backend:
            item.add_marker(pytest.mark.skip(reason=f"{once.args[0]}: run in the tensorflow suite only"))
    if not config.getoption("whole"):
        slow = [item for item in items if item.get_closest_marker("slow") is not None]
        if slow:
            config.hook.pytest_deselected(items=slow)
            items[:] = [item for item in items if item.get_closest_marker("slow") is None]
    items.sort(key=lambda item: item.get_closest_marker("long") is None)  # stable: the rest keep their order


def pytest_report_header(config):
    if not config.getoption("whole"):
        return "the fast loop: the tests marked slow are left out (deselected); --whole runs every test"
