import json
import os

import keras
import pytest

import gptlite
from conftest import assert_greedy, NEEDS_THE_PRIVATE_LAYER, new_machine, run_python
from gptlite.decode.programs import programs_for
from gptlite.model.layers import layers_within

pytestmark = pytest.mark.skipif(keras.backend.backend() == "torch", reason="torch decodes eagerly: no programs")


def _model(tokenizer, seed, **settings):
    keras.utils.set_random_seed(seed)
    model = gptlite.GPT(vocab_size=tokenizer.vocabulary_size, n_layer=1, n_head=2, n_embd=8, block_size=16,
                        tokenizer=tokenizer, **settings)
    model.build((None, 16))
    return model


@NEEDS_THE_PRIVATE_LAYER
def test_models_of_one_architecture_share_their_programs_and_another_setting_has_its_own(tokenizer):
    first = _model(tokenizer, 0, norm_epsilon=2e-5)
    gptlite.generate(first, "the", 5, temperature=0)
    # Other weights, the same architecture: the programs this process made for the first are used as they are.
    same = _model(tokenizer, 1, norm_epsilon=2e-5)
    text = gptlite.generate(same, "the", 5, temperature=0)
    programs = programs_for(same)
    assert programs.built > 0 and programs.traces == 0 and programs.loads == 0
    # They read the model's own weights at each call: its greedy text is its own.
    assert_greedy(same, "the", text)
    # Another setting of the same shapes: programs of its own, traced here or found on disk.
    other = _model(tokenizer, 0, norm_epsilon=3e-3)
    gptlite.generate(other, "the", 5, seed=1)
    assert programs_for(other).traces + programs_for(other).loads > 0


def test_a_model_that_gains_adapters_after_decoding_decodes_with_them(tokenizer):
    import numpy as np

    model = _model(tokenizer, 2)
    gptlite.generate(model, "the", 5, temperature=0)
    model.enable_lora(2, targets="qkv,contract")
    for layer in layers_within(model):
        if getattr(layer, "lora_enabled", False):  # adapters that change the logits: B starts at zero
            layer.lora_b.assign(np.random.default_rng(0).normal(0, 0.5, layer.lora_b.shape).astype("float32"))
    text = gptlite.generate(model, "the", 5, temperature=0)
    # Greedy by the model as it is now, adapters and all: its programs read its new weights.
    assert_greedy(model, "the", text)
    assert programs_for(model).variables == model.variables


@pytest.mark.slow
def test_a_decode_stopped_before_its_first_step_leaves_no_program_running_beside_the_next(tokenizer, monkeypatch):
    import threading
    import time

    from gptlite.decode.compiled import Compiled

    # Each program's run on a preparing thread takes a while: long enough that a decode stopped at its first piece
    # is over before the run it started.
    running, most = [], []
    make_program = Compiled._program

    def slow_program(self, layout, shapes):
        program = make_program(self, layout, shapes)

        def run(variables, inputs):
            if threading.current_thread() is threading.main_thread():
                return program(variables, inputs)
            running.append(1)
            most.append(len(running))
            time.sleep(0.5)
            try:
                return program(variables, inputs)
            finally:
                running.pop()

        return run

    monkeypatch.setattr(Compiled, "_program", slow_program)
    # Settings no other test uses, so that this process has no programs for them yet.
    first, second = (_model(tokenizer, 0, norm_epsilon=epsilon) for epsilon in (4e-4, 5e-4))
    stopped = gptlite.stream(first, "the", 20, seed=1)
    next(stopped)
    stopped.close()  # its first step's program is still being prepared
    text = "".join(gptlite.stream(second, "the cat", 20, seed=1))
    assert most and max(most) == 1 and isinstance(text, str)


# A tiny model's greedy text through every way of decoding: generate, stream, a chat reply and the server.
_EVERY_WAY = r"""
import json, sys
import keras
import gptlite
from gptlite import serving
from gptlite.backend import program_bytes
from starlette.testclient import TestClient

keras.utils.set_random_seed(0)
tokenizer = gptlite.CharTokenizer.from_text("the cat sat on a mat and the dog ran")
model = gptlite.GPT(vocab_size=tokenizer.vocabulary_size, n_layer=1, n_head=2, n_embd=8, block_size=16,
                    tokenizer=tokenizer)
model.build((None, 16))
texts = {"private layer": program_bytes.private_layer()}
texts["generate"] = gptlite.generate(model, ["the", "a cat"], 6, temperature=0)
texts["stream"] = "".join(gptlite.stream(model, "the", 6, temperature=0))
chat = gptlite.chat_ready(model)
texts["reply"] = gptlite.reply(chat, [{"role": "user", "content": "the cat"}], max_new_tokens=6, temperature=0)
with TestClient(serving.create_app(model, "tiny")) as client:
    answer = client.post("/v1/completions", json={"prompt": "the", "max_tokens": 6, "temperature": 0})
    texts["serve"] = answer.json()["choices"][0]["text"]
print(json.dumps(texts))
"""


@pytest.mark.slow
@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="the private layer loads TensorFlow programs")
def test_with_the_private_layer_off_every_way_of_decoding_gives_the_same_greedy_text():
    pytest.importorskip("starlette", reason="serving needs gptlite[serve]")
    written = {}
    for setting in ("on", "off"):
        result = run_python("-c", _EVERY_WAY, env=dict(os.environ, GPTLITE_PRIVATE_APIS=setting))
        assert result.returncode == 0, result.stderr[-3000:]
        written[setting] = json.loads(result.stdout.splitlines()[-1])
        assert written[setting].pop("private layer") is (setting == "on")
    assert written["on"] == written["off"]
    assert all(isinstance(text, (str, list)) for text in written["off"].values())


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="the private layer loads TensorFlow programs")
def test_a_tensorflow_whose_internals_moved_fails_the_self_test_and_says_so_once(monkeypatch):
    from gptlite.backend import program_bytes

    def moved(header, payload):
        raise AttributeError("module 'tensorflow.python.eager.context' has no attribute 'context'")

    monkeypatch.setattr(program_bytes, "load_tensorflow", moved)
    monkeypatch.delenv(program_bytes.PRIVATE_APIS_VARIABLE, raising=False)
    program_bytes.private_layer.cache_clear()
    try:
        with pytest.warns(RuntimeWarning, match="each process traces its own"):
            assert program_bytes.private_layer() is False
        assert program_bytes.private_layer() is False  # checked once: no second warning
    finally:
        program_bytes.private_layer.cache_clear()


_AS_README_SHOWS = """
import json, os, sys
import keras
before = dict(os.environ)  # as the backend left it at its import
import gptlite
from gptlite.decode.programs import programs_for

model = keras.saving.load_model(sys.argv[1])
text = gptlite.generate(model, "the", 10, temperature=0)
programs = programs_for(model)
print(json.dumps({"text": text, "traced": programs.traces, "loaded": programs.loads,
                  "environment unchanged": dict(os.environ) == before}))
"""


@pytest.mark.slow
@pytest.mark.long
@NEEDS_THE_PRIVATE_LAYER
def test_a_library_s_second_process_traces_nothing_new_with_no_opt_in(tmp_path, tokenizer):
    gptlite.save(_model(tokenizer, seed=5), tmp_path / "model.keras")
    home = tmp_path / "home"  # empty
    environment = new_machine(home)
    runs = []
    for _ in range(2):
        result = run_python("-c", _AS_README_SHOWS, str(tmp_path / "model.keras"), env=environment)
        assert result.returncode == 0, result.stderr[-3000:]
        runs.append(json.loads(result.stdout.splitlines()[-1]))
    first, second = runs
    assert first["traced"] > 0 and first["loaded"] == 0
    assert second == dict(first, traced=0, loaded=first["traced"])
    assert first["environment unchanged"]
    # In gptlite's own folder of the user's cache folder: its programs, and (under TensorFlow) XLA's machine code.
    kept = [path.name for path in (home / ".cache" / "gptlite" / "compiled").rglob("*") if path.is_file()]
    assert sum(name.endswith(".program") for name in kept) == first["traced"]
    if keras.backend.backend() == "tensorflow":
        assert any(name.startswith("xla_compile_cache") for name in kept)


@pytest.mark.slow
def test_a_cache_folder_that_cannot_be_made_keeps_nothing_and_decodes_all_the_same(tmp_path, tokenizer):
    gptlite.save(_model(tokenizer, seed=5), tmp_path / "model.keras")
    not_a_folder = tmp_path / "home"
    not_a_folder.write_text("a file where the home folder would be")
    environment = new_machine(not_a_folder)
    result = run_python("-c", _AS_README_SHOWS, str(tmp_path / "model.keras"), env=environment)
    assert result.returncode == 0, result.stderr[-3000:]
    written = json.loads(result.stdout.splitlines()[-1])
    assert written["traced"] > 0 and written["loaded"] == 0 and written["environment unchanged"]


@NEEDS_THE_PRIVATE_LAYER
def test_a_program_kept_by_another_version_of_the_backend_is_not_loaded(tokenizer, monkeypatch):
    from gptlite.decode import compiled

    model = _model(tokenizer, seed=6, n_kv_head=1)  # an architecture no other test decodes
    monkeypatch.setattr(compiled, "_loaded", {})  # this process's programs forgotten: only the disk is left
    monkeypatch.setattr(compiled, "backend_version", lambda: "0.0.1")
    gptlite.generate(model, "the", 3, temperature=0)
    assert programs_for(model).traces > 0 and programs_for(model).loads == 0
    # A second model of that architecture, with the backend "upgraded": traced anew, nothing loaded.
    monkeypatch.setattr(compiled, "_loaded", {})
    monkeypatch.setattr(compiled, "backend_version", lambda: "0.0.2")
    other = _model(tokenizer, seed=7, n_kv_head=1)
    gptlite.generate(other, "the", 3, temperature=0)
    assert programs_for(other).traces > 0 and programs_for(other).loads == 0
    # The same version again: loaded.
    monkeypatch.setattr(compiled, "_loaded", {})
    third = _model(tokenizer, seed=8, n_kv_head=1)
    gptlite.generate(third, "the", 3, temperature=0)
    assert programs_for(third).traces == 0 and programs_for(third).loads > 0


@NEEDS_THE_PRIVATE_LAYER
def test_a_program_kept_before_the_model_s_code_changed_is_not_loaded(tokenizer, monkeypatch):
    # gptlite upgraded with only its layers changed (the model's folder, not decoding's): its programs are others.
    import pathlib

    from gptlite.decode import compiled

    layers_code = pathlib.Path(compiled.__file__).resolve().parents[1] / "model" / "layers.py"
    monkeypatch.setattr(compiled, "_loaded", {})
    first = _model(tokenizer, seed=9, n_kv_head=1, qk_norm=True)  # an architecture no other test decodes
    gptlite.generate(first, "the", 3, temperature=0)
    assert programs_for(first).traces > 0  # and kept on disk
    read_bytes = pathlib.Path.read_bytes
    monkeypatch.setattr(pathlib.Path, "read_bytes",
                        lambda path: read_bytes(path) + (b"\n# changed\n" if path == layers_code else b""))
    compiled._code_fingerprint.cache_clear()
    try:
        monkeypatch.setattr(compiled, "_loaded", {})
        second = _model(tokenizer, seed=10, n_kv_head=1, qk_norm=True)
        gptlite.generate(second, "the", 3, temperature=0)
        assert programs_for(second).traces > 0 and programs_for(second).loads == 0
    finally:
        monkeypatch.undo()
        compiled._code_fingerprint.cache_clear()
    # The code as it is again: the first model's programs are loaded.
    monkeypatch.setattr(compiled, "_loaded", {})
    third = _model(tokenizer, seed=11, n_kv_head=1, qk_norm=True)
    gptlite.generate(third, "the", 3, temperature=0)
    assert programs_for(third).traces == 0 and programs_for(third).loads > 0


@pytest.mark.skipif(keras.backend.backend() != "jax", reason="jax.jit's own compiled programs")
def test_under_jax_each_program_compiles_once_whatever_mix_of_arrays_it_is_given(tokenizer):
    # A program is first called with NumPy inputs, then with its own outputs beside new rows from NumPy: jax.jit
    # would compile it again for each mix, as a server met them after its warm-up.
    import jax

    compiles = []
    listening = [True]

    def count(event, duration, fun_name=None, **_):
        # A loaded program is jax.jit of its exported `call`; eager operations compile programs of their own names.
        if listening[0] and event.endswith("backend_compile_duration") and fun_name == "jit(call)":
            compiles.append(event)

    jax.monitoring.register_event_duration_secs_listener(count)
    try:
        model = _model(tokenizer, seed=12, n_kv_head=1, bias=True)  # an architecture no other test decodes
        gptlite.generate(model, ["the", "the cat at the end"], 20, temperature=0.8, top_p=0.9, seed=1)
        programs = programs_for(model)
        made = programs.traces + programs.loads  # traced here, or read from the compile cache's folder
        assert made > 0 and len(compiles) == made
        gptlite.generate(model, ["the", "the cat at the end"], 20, temperature=0.8, top_p=0.9, seed=2)
        assert len(compiles) == made
    finally:
        listening[0] = False
