"""Which backend a writing command (generate, chat, serve, eval) that names none gets: JAX on a CPU, for a model
that computes in float32."""

import json
import zipfile

import pytest

from gptlite.decode import backend_choice

pytestmark = pytest.mark.once("the backend is chosen before any starts")


def saved_with_policy(path, policy):
    """A .keras file's config.json as Keras writes it, naming `policy`, with nothing else in it: the choice reads
    only that."""
    config = {"module": "gptlite.model.gpt", "class_name": "GPT",
              "config": {"name": "gpt", "dtype": {"module": "keras", "class_name": "DTypePolicy",
                                                  "config": {"name": policy}, "registered_name": None}}}
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("config.json", json.dumps(config))
    return path


def choose(model_path=None, environment=None, gpu=False, installed=("jax",)):
    return backend_choice.writing_backend(model_path, environment or {}, gpu, installed)


def test_a_float32_model_on_a_cpu_writes_under_jax(tmp_path):
    assert choose() == ("jax", backend_choice.WHY)
    assert choose(saved_with_policy(tmp_path / "model.keras", "float32"))[0] == "jax"


@pytest.mark.parametrize("case", [
    dict(gpu=True),
    dict(installed=()),
    dict(environment={"KERAS_BACKEND": "tensorflow"}),
    dict(environment={"KERAS_BACKEND": "torch"}),
], ids=["a-gpu", "no-jax", "keras-backend-tensorflow", "keras-backend-torch"])
def test_every_other_machine_or_choice_keeps_keras_s_default_and_is_told_nothing(case):
    assert choose(**case) == (None, None)


def test_a_bfloat16_model_stays_on_tensorflow_and_an_unreadable_file_is_read_as_float32(tmp_path):
    assert choose(saved_with_policy(tmp_path / "bf16.keras", "mixed_bfloat16")) == (None, None)
    (tmp_path / "odd.keras").write_bytes(b"not a zip")
    assert choose(tmp_path / "odd.keras")[0] == "jax"  # the command itself then says what is wrong with it
    assert backend_choice.saved_policy(tmp_path / "odd.keras") is None


def test_a_keras_json_naming_another_backend_is_a_choice_and_one_naming_tensorflow_is_keras_s_own(tmp_path):
    (tmp_path / "keras.json").write_text(json.dumps({"backend": "torch"}))
    assert choose(environment={"KERAS_HOME": str(tmp_path)}) == (None, None)
    (tmp_path / "keras.json").write_text(json.dumps({"backend": "tensorflow"}))
    assert choose(environment={"KERAS_HOME": str(tmp_path)})[0] == "jax"


def test_the_policy_read_is_the_one_keras_saves(tmp_path):
    import keras

    import gptlite

    model = gptlite.GPT(vocab_size=8, n_layer=1, n_head=1, n_embd=8, block_size=4,
                        tokenizer=gptlite.CharTokenizer("abcdefgh"), dtype=keras.DTypePolicy("mixed_bfloat16"))
    model.build((None, 4))
    gptlite.save(model, tmp_path / "model.keras")
    assert backend_choice.saved_policy(tmp_path / "model.keras") == "mixed_bfloat16"
