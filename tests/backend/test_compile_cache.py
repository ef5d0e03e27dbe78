import json
import os
from importlib import metadata

import pytest

from gptlite.backend import compile_cache


def test_the_cache_folder_names_tensorflow_s_version_when_it_came_as_tensorflow_cpu(monkeypatch, tmp_path):
    # `pip install tensorflow-cpu` installs the module `tensorflow` under another distribution's name.
    def version(name):
        if name != "tensorflow-cpu":
            raise metadata.PackageNotFoundError(name)
        return "9.8.7"

    monkeypatch.setattr(metadata, "version", version)
    monkeypatch.setattr(metadata, "packages_distributions", lambda: {"tensorflow": ["tensorflow-cpu"]})
    monkeypatch.setattr(compile_cache, "_chosen", compile_cache._chosen)
    monkeypatch.setenv("TF_XLA_FLAGS", "")
    compile_cache.use(tmp_path, backend="tensorflow")
    folder = compile_cache.tensorflow_folder()
    assert folder.parent == tmp_path and folder.name.startswith("tensorflow-9.8.7-")


def test_the_cache_folder_still_comes_when_no_distribution_names_the_backend(monkeypatch, tmp_path):
    def version(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", version)
    monkeypatch.setattr(metadata, "packages_distributions", lambda: {})
    monkeypatch.setattr(compile_cache, "_chosen", compile_cache._chosen)
    monkeypatch.setenv("TF_XLA_FLAGS", "")
    compile_cache.use(tmp_path, backend="tensorflow")
    assert compile_cache.tensorflow_folder().name.startswith("tensorflow-unknown-")


def _entry(folder, name, size, written, data=b"\x08"):
    path = folder / name
    path.write_bytes(data * size)
    os.utime(path, ns=(written, written))
    return path


def test_the_oldest_entries_go_when_the_cache_is_full_and_only_in_folders_gptlite_made(tmp_path):
    ours = compile_cache._made(tmp_path / "tensorflow-1.0-cpu")
    programs = compile_cache._made(ours / "gptlite-programs")
    older_version = compile_cache._made(tmp_path / "tensorflow-0.9-cpu")
    users = tmp_path / "my-own-folder"  # a folder of the user's beside them: never touched
    users.mkdir()
    mine = _entry(users, "notes.pb", 500, 1)
    oldest = _entry(older_version, "a.pb", 300, 2)
    old = _entry(ours, "b.pb", 300, 3)
    newer = _entry(programs, "c.program", 300, 4)
    newest = _entry(ours, "d.pb", 300, 5)
    compile_cache.drop_oldest_entries(tmp_path, limit=650)
    assert not oldest.exists() and not old.exists()
    assert newer.exists() and newest.exists() and mine.exists()
    assert compile_cache.is_ours(ours) and not compile_cache.is_ours(users)


def test_a_damaged_entry_is_removed_only_from_a_folder_gptlite_made(tmp_path):
    users = tmp_path / "xla"  # named to TensorFlow by the user: TF_XLA_FLAGS
    users.mkdir()
    cut_short = b"\x0a\x64abc"  # field 1, 100 bytes long, of which 3 came
    theirs = _entry(users, "xla_compile_cache__1.pb", 1, 1, cut_short)
    compile_cache.drop_damaged_entries(users)
    assert theirs.exists()
    ours = compile_cache._made(tmp_path / "tensorflow-1.0-cpu")
    damaged = _entry(ours, "xla_compile_cache__2.pb", 1, 1, cut_short)
    whole = ours / "xla_compile_cache__3.pb"
    whole.write_bytes(b"\x08\x01")  # field 1, a varint: 1
    compile_cache.drop_damaged_entries(ours)
    assert not damaged.exists() and whole.exists()


def test_the_cache_s_limit_comes_from_the_environment_in_megabytes(monkeypatch):
    monkeypatch.setenv(compile_cache.LIMIT_VARIABLE, "1.5")
    assert compile_cache.limit_bytes() == 1.5 * 2**20
    monkeypatch.delenv(compile_cache.LIMIT_VARIABLE)
    assert compile_cache.limit_bytes() == compile_cache.LIMIT_MEGABYTES * 2**20


# A fresh process as on a new machine: it builds a model and runs it (nothing may appear in the cache folder), then
# saves, loads and decodes it (the folder fills). Prints JSON: the cache's files after each.
BUILD_THEN_LOAD = r"""
import json, os, pathlib, sys
import keras, gptlite

cache = pathlib.Path(os.environ["XDG_CACHE_HOME"]) / "gptlite"
tokenizer = gptlite.CharTokenizer.from_text("the cat sat on a mat")
model = gptlite.GPT(vocab_size=tokenizer.vocabulary_size, n_layer=1, n_head=1, n_embd=8, block_size=8,
                    tokenizer=tokenizer)
model.predict_on_batch(tokenizer.encode("the cat").astype("int32")[None])
built = sorted(str(path) for path in cache.rglob("*")) if cache.exists() else []
gptlite.save(model, sys.argv[1])
gptlite.generate(keras.saving.load_model(sys.argv[1]), "the", max_new_tokens=3, temperature=0)
print(json.dumps([built, len(list(cache.rglob("*.program")))]))
"""


@pytest.mark.slow
def test_building_a_model_writes_nothing_and_loading_one_keeps_its_programs(tmp_path):
    from conftest import run_python

    environment = {name: value for name, value in os.environ.items()
                   if not name.startswith(("GPTLITE_", "TF_XLA", "JAX_COMPILATION"))}
    environment.update(HOME=str(tmp_path / "home"), XDG_CACHE_HOME=str(tmp_path / "cache"), TF_CPP_MIN_LOG_LEVEL="3")
    result = run_python("-c", BUILD_THEN_LOAD, str(tmp_path / "model.keras"), env=environment)
    assert result.returncode == 0, result.stderr[-2000:]
    built, programs = json.loads(result.stdout.strip().splitlines()[-1])
    assert built == []
    assert (programs > 0) == (os.environ.get("KERAS_BACKEND", "tensorflow") != "torch")  # torch compiles nothing
