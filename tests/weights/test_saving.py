import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
import zipfile

import keras
import numpy as np
import pytest

import gptlite
from gptlite.backend.choice import BACKENDS
from gptlite.weights import saving
from conftest import REPO


def test_model_from_a_newer_gptlite_is_refused(tmp_path, tiny_model):
    path = tmp_path / "model.keras"
    saving.save(tiny_model, path)
    newer = tmp_path / "newer.keras"
    with zipfile.ZipFile(path) as source, zipfile.ZipFile(newer, "w") as target:
        for item in source.infolist():
            content = source.read(item)
            if item.filename == "config.json":
                config = json.loads(content)
                config["config"]["format_version"] = 99
                content = json.dumps(config).encode()
            target.writestr(item, content)
    with pytest.raises(gptlite.InputError, match="newer gptlite"):
        gptlite.load(newer)


def test_truncated_model_file_is_refused(tmp_path, tiny_model):
    path = tmp_path / "model.keras"
    saving.save(tiny_model, path)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(gptlite.InputError, match=str(path)):
        gptlite.load(path)


SAVE_FOREVER = """
import sys, gptlite
tokenizer = gptlite.CharTokenizer.from_text("abcdefgh")
model = gptlite.GPT(vocab_size=8, n_layer=2, n_head=2, n_embd=64, block_size=64, tokenizer=tokenizer)
model.build((None, 64))
for count in range(10_000):
    gptlite.save(model, sys.argv[1])
    print(count, flush=True)
"""


@pytest.mark.slow
@pytest.mark.parametrize("delay", [0.0, 0.01, 0.04])
def test_a_kill_during_saves_never_leaves_a_broken_model(tmp_path, delay):
    path = tmp_path / "model.keras"
    process = subprocess.Popen([sys.executable, "-c", SAVE_FOREVER, str(path)], cwd=REPO,
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        kills = 0
        for line in process.stdout:
            if int(line) >= 3:  # several whole saves done; the next is under way
                time.sleep(delay)
                process.send_signal(signal.SIGKILL)
                kills += 1
                break
        process.wait(timeout=60)
    finally:
        process.kill()
    assert kills == 1 and process.returncode == -signal.SIGKILL
    model = gptlite.load(path)  # the old file or the new one, whole either way
    assert model.config.n_embd == 64
    leftovers = [p.name for p in tmp_path.iterdir() if p.name != "model.keras"]
    # mkstemp files of the killed save may remain; they are hidden and never read.
    assert all(name.startswith(".model.") for name in leftovers)


SERVE_WITHOUT_GPTLITE = """
import json, sys
sys.modules["gptlite"] = None  # the export must not need it
import tensorflow as tf
served = tf.saved_model.load(sys.argv[1]).signatures["serve"]
logits = served(token_ids=tf.constant(json.loads(sys.argv[2]), tf.int32))["logits"]
print(json.dumps(logits.numpy().tolist()))
"""


@pytest.mark.slow
@pytest.mark.skipif(keras.backend.backend() == "torch", reason="Keras exports SavedModels from tensorflow and jax")
def test_exported_saved_model_serves_next_token_logits_without_gptlite(tmp_path, tiny_model):
    out = tmp_path / "served"
    saving.export_saved_model(tiny_model, out)
    ids = [[1, 2, 3, 4, 5], [5, 4, 3, 2, 1]]
    result = subprocess.run([sys.executable, "-c", SERVE_WITHOUT_GPTLITE, str(out), json.dumps(ids)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    expected = np.asarray(tiny_model(np.array(ids, "int32")))[:, -1]
    np.testing.assert_allclose(json.loads(result.stdout.splitlines()[-1]), expected, atol=1e-5)
    tokenizer = json.loads((out / "tokenizer.json").read_text())
    assert tokenizer["config"]["vocabulary"] == tiny_model.tokenizer.vocabulary
    with pytest.raises(gptlite.RunExistsError, match="already exists"):
        saving.export_saved_model(tiny_model, out)


@pytest.mark.skipif(keras.backend.backend() == "torch", reason="Keras exports SavedModels from tensorflow and jax")
def test_a_post_norm_model_exports_as_a_saved_model(tmp_path, tokenizer):
    import tensorflow as tf

    model = gptlite.GPT(vocab_size=tokenizer.vocabulary_size, n_layer=1, n_head=2, n_embd=16, block_size=8,
                        norm_position="post", tokenizer=tokenizer)
    model.build((None, 8))
    saving.export_saved_model(model, tmp_path / "served")
    ids = np.array([[1, 2, 3], [3, 2, 1]], "int32")
    logits = tf.saved_model.load(str(tmp_path / "served")).signatures["serve"](token_ids=tf.constant(ids))["logits"]
    np.testing.assert_allclose(logits.numpy(), np.asarray(model(ids))[:, -1], atol=1e-5)


LOGITS_UNDER_BACKEND = """
import json, sys
import keras, numpy as np
import gptlite
model = gptlite.load(sys.argv[1])
assert keras.backend.backend() == sys.argv[3]
logits = model(np.array(json.loads(sys.argv[2]), "int32"))
print(json.dumps(keras.ops.convert_to_numpy(logits).tolist()))
"""


# TensorFlow's suite loads its file under each other backend, and each other backend's suite loads its own under
# TensorFlow: every backend writes and reads once, without the pairs that repeat it. (Under TensorFlow the others
# are extras.)
@pytest.mark.extras
@pytest.mark.parametrize("backend", [b for b in BACKENDS if b != keras.backend.backend()
                                     and "tensorflow" in (b, keras.backend.backend())])
def test_a_model_saved_under_one_backend_gives_the_same_logits_under_the_others(backend, tmp_path, tiny_model):
    if importlib.util.find_spec(backend) is None:
        pytest.skip(f"needs {backend} (pip install -e '.[{backend}]')")
    gptlite.save(tiny_model, tmp_path / "model.keras")
    ids = [[1, 2, 3, 4, 5, 6], [6, 5, 4, 3, 2, 1]]
    result = subprocess.run(
        [sys.executable, "-c", LOGITS_UNDER_BACKEND, str(tmp_path / "model.keras"), json.dumps(ids), backend],
        capture_output=True, text=True, timeout=120, cwd=REPO, env=dict(os.environ, KERAS_BACKEND=backend),
    )
    assert result.returncode == 0, result.stderr[-2000:]
    expected = keras.ops.convert_to_numpy(tiny_model(np.array(ids, "int32")))
    np.testing.assert_allclose(json.loads(result.stdout.splitlines()[-1]), expected, atol=1e-5)


FIXTURES = REPO / "tests" / "fixtures"


@pytest.mark.parametrize("name", ["gpt_learned", "gpt_sinusoidal_untied", "seq2seq"])
def test_a_model_saved_before_the_architecture_settings_loads_and_gives_its_recorded_logits(name):
    recorded = json.loads((FIXTURES / "old_models.json").read_text())[name]
    model = keras.saving.load_model(FIXTURES / f"{name}.keras")
    if name == "seq2seq":
        inputs = {"source_ids": np.array(recorded["source_ids"], "int32"),
                  "target_ids": np.array(recorded["target_ids"], "int32")}
    else:
        inputs = np.array(recorded["token_ids"], "int32")
    # Logits of about 0.3 from a 16-wide model: float rounding is far below the tolerance.
    np.testing.assert_allclose(keras.ops.convert_to_numpy(model(inputs)), recorded["logits"], atol=1e-4)


MADE = json.loads((FIXTURES / "made_models.json").read_text())["models"]


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(MADE))
def test_a_model_saved_before_the_package_was_rearranged_loads_and_writes_its_recorded_greedy_text(name):
    """Models of every kind saved by an earlier gptlite (tests/fixtures/make_models.py, at the commit that
    made_models.json names) load under each backend, give the logits they gave then and write the same greedy
    text: each recorded greedy choice won by far more than float rounding moves a logit."""
    recorded = MADE[name]
    model = keras.saving.load_model(FIXTURES / f"made_{name}.keras")
    tokenizer = model.tokenizer
    if name == "seq2seq":
        source_ids = np.asarray(tokenizer.encode(recorded["source"]), "int32")[None]
        target_ids = np.asarray([tokenizer.start_token_id, *tokenizer.encode(recorded["greedy"])], "int32")[None]
        logits = model({"source_ids": source_ids, "target_ids": target_ids})
        assert gptlite.generate_target(model, recorded["source"]) == recorded["greedy"]
    else:
        logits = model(np.asarray(tokenizer.encode(recorded["prompt"]), "int32")[None])
        assert gptlite.generate(model, recorded["prompt"], max_new_tokens=12, temperature=0) == recorded["greedy"]
    # Logits of order 1 from a tiny model: float rounding is far below the tolerance.
    np.testing.assert_allclose(keras.ops.convert_to_numpy(logits)[0, -1], recorded["last_logits"], atol=1e-4)
    if name == "chat":
        reply = gptlite.reply(model, [{"role": "user", "content": "say dog"}], max_new_tokens=12, temperature=0)
        assert reply == recorded["reply"]
