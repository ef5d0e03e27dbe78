"""The package's shape: which modules may import which, and what library errors say."""

import ast
import json
import os
import re
import subprocess
import sys

import pytest

from conftest import REPO

PACKAGE = REPO / "gptlite"
# The most rooms, and modules in one room, a reader meets.
MOST_ROOMS = 20
MOST_MODULES_IN_A_ROOM = 12
# The house's own limits: a module a reader takes in whole, a function one screen.
MOST_LINES_IN_A_MODULE = 500
MOST_LINES_IN_A_FUNCTION = 80


def room_levels():
    """The package's rooms (its folders, and the few modules at its root), lowest first, level by level, as
    docs/development.md draws them: imports run one way, from a room to the rooms of the levels before its own.
    That line of the docs is the one statement of the rule; the tests below read it."""
    lines = [line.strip() for line in (REPO / "docs" / "development.md").read_text().splitlines()
             if line.strip().startswith("errors,") and "→" in line]
    assert len(lines) == 1, "docs/development.md draws the rooms' order on one line, from errors to the cli"
    return [[room.strip() for room in level.split(",")] for level in lines[0].split("→")]


def allowed_rooms():
    """Each room, and the rooms it may import from: those of every level before its own."""
    allowed, below = {}, set()
    for level in room_levels():
        for room in level:
            allowed[room] = set(below)
        below |= set(level)
    return allowed


def registry_imports():
    """The modules of gptlite that `importlib.import_module` loads by a name a registry's entry gives: for each
    module that declares a registry (by its dotted name), the modules its entries name. The room order counts them
    as the registry's imports (a registry's load, inside a function, runs after its module and the entry's are
    read: no circle). A new registry that loads its entries' modules so is added here
    (`test_every_module_loaded_by_name_is_one_a_registry_names` says so)."""
    import gptlite
    from gptlite import exports, serving, tasks, text

    return {
        "gptlite": {f"gptlite.{module}" for module in gptlite._LAZY.values()},
        "gptlite.exports": {f"gptlite.{kind.module}" for kind in exports.EXPORT_FORMATS.values()},
        "gptlite.serving": {f"gptlite.serving.{module}" for module in serving._LAZY.values()},
        "gptlite.tasks": {f"gptlite.tasks.{declared.module}" for declared in tasks.TASKS.values()},
        "gptlite.text": {f"gptlite.text.{module}" for module, *_ in text.TOKENIZERS.values()} | {"gptlite.text.bpe"},
    }


def loaded_by_name(tree):
    """The names of gptlite's modules that `importlib.import_module` is given in a module's `tree`: a string, or an
    f-string's text before its first field ("gptlite.tasks." for f"gptlite.tasks.{module}"). (A name held in a
    variable is a backend's or Keras's: `backend.runtime`, `backend.program_bytes`.)"""
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "import_module" and node.args:
            named = node.args[0]
            if isinstance(named, ast.JoinedStr) and named.values:
                named = named.values[0]
            if isinstance(named, ast.Constant) and str(named.value).startswith("gptlite."):
                names.append(named.value)
    return names


def imported_rooms(path):
    """The rooms of gptlite that a file imports from, anywhere in it (functions included), a registry's entries'
    modules loaded by name among them."""
    found = {module.split(".")[1] for module in registry_imports().get(_module_name(path), ())}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "gptlite":
            if node.module == "gptlite":  # a room by its name, else a name of the package's root, whose
                # __init__ imports from the rooms: a circle
                found.update(alias.name if (PACKAGE / alias.name).is_dir() or (PACKAGE / f"{alias.name}.py").exists()
                             else "gptlite" for alias in node.names)
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
    found, allowed = rooms(), allowed_rooms()
    assert set(found) == set(allowed), "a room was added or removed: give it its place in docs/development.md's order"
    for room, paths in sorted(found.items()):
        for path in paths:
            unexpected = imported_rooms(path) - allowed[room] - {"errors", room}
            assert not unexpected, f"{path.relative_to(PACKAGE)} imports from {sorted(unexpected)}"


def _module_name(path):
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_imports():
    """Each module of the package (by its dotted name) and the modules of the package it imports, anywhere in it
    (functions included): `from gptlite.data import lm` imports gptlite.data.lm, `from gptlite.data import
    SYNTHETIC_TASKS` gptlite.data's __init__."""
    modules = {_module_name(path): path for path in PACKAGE.glob("**/*.py")}
    graph = {}
    for name, path in modules.items():
        edges = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "gptlite":
                for alias in node.names:
                    whole = f"{node.module}.{alias.name}"
                    edges.add(whole if whole in modules else node.module)
            elif isinstance(node, ast.Import):
                edges.update(alias.name for alias in node.names if alias.name.split(".")[0] == "gptlite")
        graph[name] = edges - {name}
    return graph


def test_every_module_loaded_by_name_is_one_a_registry_names():
    """`importlib.import_module` loads a module of gptlite only where a registry of `registry_imports` names it,
    so that the room order above follows each registry's entries as imports."""
    registries, offenders = registry_imports(), []
    for path in sorted(PACKAGE.glob("**/*.py")):
        module = _module_name(path)
        for named in loaded_by_name(ast.parse(path.read_text())):
            if not any(entry.startswith(named) for entry in registries.get(module, ())):
                offenders.append(f"{path.relative_to(PACKAGE)}: import_module({named!r}...)")
    assert not offenders, offenders


def test_no_module_imports_one_that_imports_it_back():
    """No circle of imports, between rooms or inside one: a module is read after every module it imports."""
    graph, visiting, done = module_imports(), [], set()

    def visit(module):
        assert module not in visiting, f"an import circle: {' -> '.join(visiting[visiting.index(module):])} -> {module}"
        if module not in done:
            visiting.append(module)
            for imported in sorted(graph.get(module, ())):
                visit(imported)
            visiting.pop()
            done.add(module)

    for module in sorted(graph):
        visit(module)


def test_no_module_is_too_long_to_read_whole_nor_a_function_a_screen():
    long_modules, long_functions = [], []
    for path in sorted(PACKAGE.glob("**/*.py")):
        source = path.read_text()
        if len(source.splitlines()) > MOST_LINES_IN_A_MODULE:
            long_modules.append(f"{path.relative_to(PACKAGE)}: {len(source.splitlines())} lines")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MOST_LINES_IN_A_FUNCTION:
                    long_functions.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name}: {length} lines")
    assert not long_modules and not long_functions, long_modules + long_functions


def _javascript_functions(source):
    """(name, first line, length in lines) of each function, method and arrow function with a body, of a page script
    laid out as the page's are: a head ending in "{" on its own line, its body closed by "}" at the head's indent."""
    head = re.compile(r"^(\s*)(?:export\s+)?(?:async\s+)?(?:function\*?\s+(\w+)\s*\(.*\)|(?:static\s+)?(\w+)\s*\(.*\)"
                      r"|(?:const|let)\s+(\w+)\s*=\s*(?:async\s*)?\(.*\)\s*=>)\s*\{$")
    lines = source.splitlines()
    for number, line in enumerate(lines):
        found = head.match(line)
        name = found and (found[2] or found[3] or found[4])
        if not name or name in ("if", "for", "while", "switch", "catch", "function"):
            continue
        end = next((index for index in range(number + 1, len(lines))
                    if re.match(rf"^{found[1]}\}}[;,)]*$", lines[index])), len(lines) - 1)
        yield name, number + 1, end - number + 1


def test_no_page_script_is_too_long_to_read_whole_nor_a_function_a_screen():
    """The page's JavaScript keeps Python's caps (ONNX Runtime Web's files, which the page carries, aside)."""
    scripts = sorted((PACKAGE / "web" / "page").glob("*.js"))
    assert len(scripts) >= 8
    long_modules = [f"{path.name}: {len(path.read_text().splitlines())} lines" for path in scripts
                    if len(path.read_text().splitlines()) > MOST_LINES_IN_A_MODULE]
    long_functions = [f"{path.name}:{line} {name}: {length} lines" for path in scripts
                      for name, line, length in _javascript_functions(path.read_text())
                      if length > MOST_LINES_IN_A_FUNCTION]
    assert not long_modules and not long_functions, long_modules + long_functions
    # the reading of a function's length itself: a short and a long one, found
    made = "function short() {\n  return 1;\n}\n\nconst long = (a) => {\n" + "  a += 1;\n" * 90 + "};\n"
    assert [(name, length) for name, _, length in _javascript_functions(made)] == [("short", 3), ("long", 92)]


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


def _class_names(paths):
    return {node.name for path in paths for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.ClassDef)}


def kind_questions(path, kinds):
    """Where a file asks which kind of model, data, score or tokenizer it holds, in every form: isinstance or
    issubclass on one of `kinds` (class names), type(x) compared, a class's name compared (`__name__ ==`, or a
    string of one of `kinds`), what a model is (`.writes_targets`, `.chats`), what a task's model reads
    (`reads ==`) or whether it converses (`.converses`), and the model room's old checks (`only_a_*`,
    `is_model`)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        where = f"{path.relative_to(PACKAGE)}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Attribute) and node.attr in ("writes_targets", "chats", "converses"):
            found.append(f"{where}: .{node.attr}")
        elif isinstance(node, ast.Name) and (node.id.startswith("only_a_") or node.id == "is_model"):
            found.append(f"{where}: {node.id}")
        elif isinstance(node, ast.Call) and getattr(node.func, "id", "") in ("isinstance", "issubclass") \
                and len(node.args) == 2:
            named = {getattr(name, "id", getattr(name, "attr", None)) for name in ast.walk(node.args[1])}
            if named & kinds:
                found.append(f"{where}: {node.func.id} on {sorted(named & kinds)}")
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            for side in sides:
                if isinstance(side, ast.Attribute) and side.attr in ("__name__", "reads"):
                    found.append(f"{where}: .{side.attr} compared")
                elif isinstance(side, ast.Call) and getattr(side.func, "id", "") == "type":
                    found.append(f"{where}: type() compared")
                elif isinstance(side, ast.Constant) and side.value in kinds:
                    found.append(f"{where}: {side.value!r} compared")
    return found


def test_only_the_tasks_and_the_models_ask_what_kind_a_model_its_data_or_its_tokenizer_is():
    """What differs between a language model, a chat and a seq2seq run is decided in `tasks/` (and by the models
    themselves, `model/`); what differs between tokenizers, by the tokenizers (`text/`): elsewhere no form of the
    question (`kind_questions`) is asked, of a model, its data, a score or a tokenizer."""
    kinds = _class_names([PACKAGE / "model" / "gpt.py", *sorted((PACKAGE / "data").glob("*.py")),
                          PACKAGE / "evaluation" / "scores.py"])
    tokenizers = _class_names([PACKAGE / "text" / "tokenizers.py", PACKAGE / "text" / "bpe.py"])
    assert {"GPT", "Seq2Seq", "PairSet", "Score"} <= kinds and {"CharTokenizer", "BPETokenizer"} <= tokenizers
    offenders = []
    for path in sorted(PACKAGE.glob("**/*.py")):
        room = path.relative_to(PACKAGE).parts[0]
        if room not in ("tasks", "model"):
            offenders += kind_questions(path, kinds | (set() if room == "text" else tokenizers))
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
    modules += ["cli", "weights"]  # packages whose __init__ holds a command line or a public name (`export`)
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


# The results page stays a page: dated detail goes to the journal (benchmarks/journal.md).
MOST_LINES_OF_BENCHMARKS_MD = 400
BENCHMARKS = REPO / "benchmarks"


def test_the_results_page_stays_a_page():
    lines = len((REPO / "BENCHMARKS.md").read_text().splitlines())
    assert lines <= MOST_LINES_OF_BENCHMARKS_MD, (
        f"BENCHMARKS.md has {lines} lines: move dated detail that a later table supersedes to the journal")


def test_every_benchmark_script_is_named_in_the_folders_readme_and_stands_alone():
    """Each script of benchmarks/ is listed in its README, edits no `sys.path`, and imports no other script (what
    two share lives in helpers/)."""
    readme = (BENCHMARKS / "README.md").read_text()
    scripts = sorted(BENCHMARKS.glob("*.py"))
    unlisted = [path.name for path in scripts if f"`{path.name}" not in readme]
    assert not unlisted, f"name these in benchmarks/README.md: {unlisted}"
    names, offenders = {path.stem for path in scripts}, []
    for path in scripts:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr == "path" and getattr(node.value, "id", "") == "sys":
                offenders.append(f"{path.name}:{node.lineno}: sys.path")
            elif isinstance(node, ast.Import):
                offenders += [f"{path.name}:{node.lineno}: imports {alias.name}" for alias in node.names
                              if alias.name.split(".")[0] in names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in names:
                offenders.append(f"{path.name}:{node.lineno}: imports {node.module}")
    assert not offenders, offenders


# What is left of the house's known debts, each counted the same way every run: the target of each is 0, and a
# change may only lower its ceiling (write the new count here when it falls). `python tests/test_structure.py
# [PACKAGE]` prints the counts of a tree, another commit's included.
BACKENDS_BY_NAME = {"tensorflow", "jax", "torch"}
FOREIGN_FORMATS = ("gguf", "hugging_face", "web", "onnx", "gpt2", "rwkv", "sentencepiece")
RENAMED_KIND_CHECKS = {"check_continues_text", "check_writes_targets", "of_data", "of_model", "checked_model"}
DEBT_CEILINGS = {"backend questions outside backend/": 0, "foreign formats in text/": 0,
                 "the kind of run asked outside tasks/ and model/": 0}


def backend_questions(path):
    """Lines of `path` that ask which backend or device runs: `keras.backend.backend()`, `on_gpu()`, or a
    backend's name compared."""
    lines = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            called = node.func
            if getattr(called, "attr", getattr(called, "id", None)) == "on_gpu" or (
                    getattr(called, "attr", None) == "backend" and getattr(called.value, "attr", None) == "backend"):
                lines.add(node.lineno)
        elif isinstance(node, ast.Compare):
            named = {side.value for side in ast.walk(node) if isinstance(side, ast.Constant)}
            if named & BACKENDS_BY_NAME:
                lines.add(node.lineno)
    return lines


def foreign_format_functions(path):
    """Functions and methods of `path` named for a format outside text and ids (GGUF, Hugging Face, the web page,
    ONNX, GPT-2's files, llama.cpp's tokenizer models)."""
    return {node.lineno for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and any(form in node.name.lower() for form in FOREIGN_FORMATS)}


def renamed_kind_checks(path):
    """Lines of `path` that call one of the checks that ask which kind of run a model or its data is."""
    return {node.lineno for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", None)) in RENAMED_KIND_CHECKS}


def debts(package=PACKAGE):
    """Each debt of DEBT_CEILINGS, counted over the package at `package`."""
    counts = dict.fromkeys(DEBT_CEILINGS, 0)
    for path in sorted(package.glob("**/*.py")):
        room = path.relative_to(package).parts[0]
        if room != "backend":
            counts["backend questions outside backend/"] += len(backend_questions(path))
        if room == "text":
            counts["foreign formats in text/"] += len(foreign_format_functions(path))
        if room not in ("tasks", "model"):
            counts["the kind of run asked outside tasks/ and model/"] += len(renamed_kind_checks(path))
    return counts


def test_the_known_debts_only_shrink():
    counts = debts()
    grown = {debt: f"{counts[debt]} (at most {ceiling})" for debt, ceiling in DEBT_CEILINGS.items()
             if counts[debt] > ceiling}
    assert not grown, grown


if __name__ == "__main__":
    import pathlib

    for debt, count in debts(pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else PACKAGE).items():
        print(f"{count:4d}  {debt}")
