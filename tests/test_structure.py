"""The package's shape: which modules may import which, and what library errors say."""

import ast
import json
import os
import subprocess
import sys

import pytest

from conftest import REPO

PACKAGE = REPO / "gptlite"
# The package's rooms (its folders, and the few modules at its root), lowest first, and the rooms each may import
# from: imports run one way, from the model up to the command line. `errors` may be imported by any.
ALLOWED = {
    "errors": set(),
    "files": set(),
    "backend": set(),  # the backend's notices, compile cache and devices: plain Python, before Keras starts
    "text": set(),  # tokenizers, chat templates, token ids back to text
    "model": {"backend", "text"},  # the shape, the layers, GPT and Seq2Seq (its first one starts the compile cache)
    "weights": {"files", "model", "text"},  # model.keras, GPT-2, the Llama family, GGUF
    "data": {"files", "text", "weights"},  # text, pairs, conversations, synthetic tasks
    "decode": {"backend", "data", "model", "text"},  # sampling, compiled programs, the engine, generate, chat
    "evaluation": {"data", "decode", "files", "model", "text"},  # scores, inspection
    "tasks": {"data", "decode", "evaluation", "model", "text"},  # one kind of run each: lm, chat, seq2seq
    # settings, plan, fit
    "training": {"backend", "data", "decode", "evaluation", "files", "model", "tasks", "text", "weights"},
    "serving": {"data", "decode", "evaluation", "tasks", "text", "weights"},  # the HTTP server
    "cli": {"backend", "data", "decode", "evaluation", "files", "model", "serving", "tasks", "text", "training",
            "weights"},
    "__main__": {"cli"},
}
# The most rooms, and modules in one room, a reader meets.
MOST_ROOMS = 20
MOST_MODULES_IN_A_ROOM = 12


def imported_rooms(path):
    """The rooms of gptlite that a file imports from, anywhere in it (functions included)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "gptlite":
            if node.module == "gptlite":
                found.update(alias.name for alias in node.names)
            else:
                found.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            found.update(alias.name.split(".")[1] for alias in node.names
                         if alias.name.startswith("gptlite."))
    return found


def rooms():
    """Each room of the package and its files: a root module's one file, or a folder's every file."""
    files = {path.stem: [path] for path in PACKAGE.glob("*.py") if path.stem != "__init__"}
    files.update({folder.name: sorted(folder.glob("*.py")) for folder in PACKAGE.iterdir()
                  if (folder / "__init__.py").exists()})
    return files


def test_every_room_imports_only_the_rooms_below_it():
    found = rooms()
    assert set(found) == set(ALLOWED), "a room was added or removed: give it its place in ALLOWED"
    for room, paths in sorted(found.items()):
        for path in paths:
            unexpected = imported_rooms(path) - ALLOWED[room] - {"errors", room}
            assert not unexpected, f"{path.relative_to(PACKAGE)} imports from {sorted(unexpected)}"


def test_a_reader_meets_few_rooms_of_few_modules_each():
    found = rooms()
    assert len(found) <= MOST_ROOMS, sorted(found)
    crowded = {room: len(paths) for room, paths in found.items() if len(paths) - 1 > MOST_MODULES_IN_A_ROOM}
    assert not crowded, crowded


def test_every_room_is_a_package_the_wheel_holds():
    import tomllib

    listed = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    folders = {f"gptlite.{room}" for room, paths in rooms().items() if paths[0].name == "__init__.py" or len(paths) > 1}
    assert set(listed) == {"gptlite"} | folders


def test_importing_a_room_starts_no_keras():
    """A room's `__init__` holds its plain choices (what the command line offers as flags) and imports no Keras,
    so that the commands can read them before they choose a backend."""
    code = ("import sys, importlib; " + "; ".join(f"importlib.import_module('gptlite.{room}')" for room, paths in
                                                 rooms().items() if len(paths) > 1)
            + "; print('keras' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert result.stdout.strip() == "False", result.stderr[-2000:]


def test_the_allowed_imports_form_no_circle():
    visiting, done = set(), set()

    def visit(module):
        assert module not in visiting, f"an import circle through {module}"
        if module not in done:
            visiting.add(module)
            for below in ALLOWED[module]:
                visit(below)
            visiting.remove(module)
            done.add(module)

    for module in ALLOWED:
        visit(module)


def test_library_errors_name_settings_never_flags():
    """Only the command line knows flags, and its `as_flags` writes them: no raised message has a `--name`."""
    offenders = []
    for path in sorted(PACKAGE.glob("**/*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            # A raise, or the making of an error to raise (`InputError(...)`).
            made = isinstance(node, ast.Call) and getattr(node.func, "id", "").endswith(("Error", "Diverged",
                                                                                          "Interrupted"))
            if made or (isinstance(node, ast.Raise) and node.exc is not None):
                for constant in ast.walk(node):
                    if isinstance(constant, ast.Constant) and isinstance(constant.value, str) \
                            and "--" in constant.value:
                        offenders.append(f"{path.name}:{node.lineno}: {constant.value!r}")
    assert not offenders, offenders


def test_only_the_tasks_and_the_models_ask_what_kind_a_model_or_its_data_is():
    """What differs between a language model, a chat and a seq2seq run is decided in `tasks/` (and by the models
    themselves): elsewhere no `model.writes_targets` or `model.chats`, and no isinstance on a model, data or score."""
    kinds = set()
    for path in [PACKAGE / "model" / "gpt.py", *sorted((PACKAGE / "data").glob("*.py")),
                 PACKAGE / "evaluation" / "scores.py"]:
        kinds |= {node.name for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.ClassDef)}
    assert {"GPT", "Seq2Seq", "PairSet", "Score"} <= kinds
    offenders = []
    for path in sorted(PACKAGE.glob("**/*.py")):
        if path.relative_to(PACKAGE).parts[0] in ("tasks", "model"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in ("writes_targets", "chats"):
                offenders.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: .{node.attr}")
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "isinstance" and len(node.args) == 2:
                named = {getattr(name, "id", getattr(name, "attr", None)) for name in ast.walk(node.args[1])}
                if named & kinds:
                    offenders.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: isinstance on {named & kinds}")
    assert not offenders, offenders


def test_importing_gptlite_leaves_the_backend_open_and_the_import_system_as_it_was():
    code = ("import sys; finders = list(sys.meta_path); import gptlite; "
            "assert 'keras' not in sys.modules; assert sys.meta_path == finders, sys.meta_path; print('ok')")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert result.stdout.strip() == "ok", result.stderr


@pytest.mark.slow
@pytest.mark.parametrize("first", ["import keras, gptlite", "import gptlite; gptlite.quiet(); import keras",
                                   "import gptlite, keras; gptlite.load"])
def test_keras_loads_a_saved_model_once_gptlite_is_imported_after_it_or_has_started_it(first):
    model_file = REPO / "tests" / "fixtures" / "made_char.keras"
    code = (f"{first}; import sys; model = keras.saving.load_model(sys.argv[1]); "
            "print(type(model).__name__, type(model.tokenizer).__name__)")
    result = subprocess.run([sys.executable, "-c", code, str(model_file)], capture_output=True, text=True, cwd=REPO,
                            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert result.stdout.split() == ["GPT", "CharTokenizer"], result.stderr[-2000:]


def test_importing_gptlite_changes_nothing_in_the_process():
    code = ("import importlib.util, json, os, sys; before = dict(os.environ); import gptlite; "
            "changed = sorted(k for k in set(before) | set(os.environ) if before.get(k) != os.environ.get(k)); "
            "print(json.dumps(changed))")
    clean = {name: value for name, value in os.environ.items()
             if not name.startswith(("TF_", "XLA_", "JAX_", "GPTLITE_"))}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, env=clean)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == []


# Imports Keras once, then forks a child for each piece of code: in each child that code is the first of gptlite that
# runs. Keras's own import is most of a fresh process's time (7 CPU-seconds here): once per child, it made this the
# suite's longest test (4 minutes of 20). Prints the failures as JSON: [code, the error's last line].
FIRST_IN_A_FORK = r"""
import json, os, sys, traceback, warnings
import keras
assert not [name for name in sys.modules if name.split(".")[0] == "gptlite"]
warnings.simplefilter("ignore", DeprecationWarning)  # a fork of a process with threads: the child only imports
codes, running, failures = json.loads(sys.argv[1]), {}, []

def reap():
    pid, status = os.wait()
    code, read = running.pop(pid)
    with os.fdopen(read) as pipe:
        error = pipe.read()
    if status != 0:
        failures.append([code, error or f"exit status {status}"])

for code in codes:
    if len(running) == 2:  # two at a time, one core each
        reap()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            exec(code)
        except BaseException:
            os.write(write, traceback.format_exc().strip().splitlines()[-1].encode())
            os._exit(1)
        os._exit(0)
    os.close(write)
    running[pid] = code, read
while running:
    reap()
print(json.dumps(failures))
"""


@pytest.mark.slow
@pytest.mark.once("the order of gptlite's own imports is the same on every backend")
def test_every_public_name_and_every_module_works_as_the_first_thing_a_process_does():
    """No import order can break a name: each module of the package, and each public name through its module,
    is imported first (first of gptlite: Keras is imported before, once) in a process of its own."""
    import gptlite

    names = {}  # module -> the public names loaded from it on first use
    for name, module in gptlite._LAZY.items():
        names.setdefault(module, []).append(name)
    modules = sorted(".".join(path.relative_to(PACKAGE).with_suffix("").parts) for path in PACKAGE.glob("**/*.py")
                     if path.stem not in ("__init__", "__main__"))
    modules += ["cli"]
    assert set(names) <= set(modules)
    codes = ["; ".join(["import gptlite", *(f"gptlite.{name}" for name in names[module])]) if module in names
             else f"import gptlite.{module}" for module in modules]
    # A timeout: a child stuck on a lock that a thread of the parent held at the fork fails the test, not the suite.
    result = subprocess.run([sys.executable, "-c", FIRST_IN_A_FORK, json.dumps(codes)], capture_output=True,
                            text=True, cwd=REPO, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    failures = json.loads(result.stdout.strip().splitlines()[-1])
    assert not failures, "\n".join(f"{code}\n{error}" for code, error in failures)


def test_ci_runs_the_readmes_whole_suite_command_as_the_readme_gives_it_before_installing_anything_else():
    readme = (REPO / "README.md").read_text()
    lines = [line.strip() for line in readme.splitlines() if line.startswith('    pip install -e ".[dev]"')]
    assert lines == ['pip install -e ".[dev]" && python -m pytest --whole']
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    ran = [number for number, line in enumerate(ci) if line.startswith(lines[0])]
    assert len(ran) == 1, ".ci/run must run the README's test command as the README writes it, once"
    installs = [line for line in ci[:ran[0]] if line.strip().startswith(("pip ", "python -m pip", "python3 -m pip"))]
    assert not installs, f".ci/run installs before the README's command: {installs}"
