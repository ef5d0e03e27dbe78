"""Which backend a command that names none gets: a writing command (generate, chat, serve, eval) JAX on a CPU,
for a model that computes in float32; a training run torch for bf16 on a CPU with bfloat16 instructions."""

import json
import zipfile

import pytest

import gptlite
from gptlite.backend import choice, machine
from gptlite.files import saved_dtype_policy

pytestmark = pytest.mark.once("the backend is chosen before any starts")

BF16_CPU = {"avx2", "avx512f", "avx512_bf16"}
PLAIN_CPU = {"avx2", "fma"}


def saved_with_policy(path, policy):
    """A .keras file's config.json as Keras writes it, naming `policy`, with nothing else in it: the choice reads
    only that."""
    config = {"module": "gptlite.model.gpt", "class_name": "GPT",
              "config": {"name": "gpt", "dtype": {"module": "keras", "class_name": "DTypePolicy",
                                                  "config": {"name": policy}, "registered_name": None}}}
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("config.json", json.dumps(config))
    return path


def choose_writing(model_path=None, environment=None, gpu=False, installed=("jax",)):
    return choice.writing_backend(model_path, environment or {}, gpu, installed)


def choose_training(precision="bf16", environment=None, cpu_flags=BF16_CPU, gpu=False, installed=("torch",)):
    return choice.training_backend(precision, environment or {}, cpu_flags, gpu, installed)


# --- writing


def test_a_float32_model_on_a_cpu_writes_under_jax(tmp_path):
    assert choose_writing() == ("jax", choice.WRITING_WHY)
    assert choose_writing(saved_with_policy(tmp_path / "model.keras", "float32"))[0] == "jax"


@pytest.mark.parametrize("case", [
    dict(gpu=True),
    dict(installed=()),
    dict(environment={"KERAS_BACKEND": "tensorflow"}),
    dict(environment={"KERAS_BACKEND": "torch"}),
], ids=["a-gpu", "no-jax", "keras-backend-tensorflow", "keras-backend-torch"])
def test_every_other_machine_or_choice_keeps_keras_s_default_for_writing(case):
    assert choose_writing(**case) == (None, None)


def test_a_bfloat16_model_stays_on_tensorflow_and_an_unreadable_file_is_read_as_float32(tmp_path):
    assert choose_writing(saved_with_policy(tmp_path / "bf16.keras", "mixed_bfloat16")) == (None, None)
    (tmp_path / "odd.keras").write_bytes(b"not a zip")
    assert choose_writing(tmp_path / "odd.keras")[0] == "jax"  # the command itself then says what is wrong with it
    assert saved_dtype_policy(tmp_path / "odd.keras") is None


def test_a_keras_json_naming_another_backend_is_a_choice_for_writing_too(tmp_path):
    (tmp_path / "keras.json").write_text(json.dumps({"backend": "torch"}))
    assert choose_writing(environment={"KERAS_HOME": str(tmp_path)}) == (None, None)
    (tmp_path / "keras.json").write_text(json.dumps({"backend": "tensorflow"}))
    assert choose_writing(environment={"KERAS_HOME": str(tmp_path)})[0] == "jax"


# --- training


def test_bf16_training_on_a_cpu_with_bfloat16_instructions_goes_to_torch():
    backend, why = choose_training()
    assert backend == "torch" and "avx512_bf16" in why
    assert choose_training(cpu_flags={"amx_bf16", "amx_tile"})[0] == "torch"


@pytest.mark.parametrize("case", [
    dict(precision="fp32"),
        dict(precision="fp16"),
    dict(cpu_flags=PLAIN_CPU),
    dict(gpu=True),
    dict(environment={"KERAS_BACKEND": "tensorflow"}),
], ids=["fp32", "fp16", "no-bf16-instructions", "a-gpu", "keras-backend-named"])
def test_every_other_run_keeps_keras_s_default_for_training(case):
    assert choose_training(**case) == (None, None)


def test_without_torch_the_run_stays_on_tensorflow_and_says_what_to_install():
    backend, why = choose_training(installed=())
    assert backend is None and 'pip install "gptlite[torch]"' in why


def test_a_keras_json_naming_another_backend_is_a_choice_and_one_naming_tensorflow_is_keras_s_own(tmp_path):
    (tmp_path / "keras.json").write_text(json.dumps({"backend": "jax", "floatx": "float32"}))
    assert choose_training(environment={"KERAS_HOME": str(tmp_path)}) == (None, None)
    (tmp_path / "keras.json").write_text(json.dumps({"backend": "tensorflow"}))
    assert choose_training(environment={"KERAS_HOME": str(tmp_path)})[0] == "torch"


def test_a_gpu_hidden_from_the_process_does_not_count():
    assert machine.has_gpu({"CUDA_VISIBLE_DEVICES": ""}) is False
    assert machine.has_gpu({"CUDA_VISIBLE_DEVICES": "-1"}) is False


def automatic_backend(argv):
    """What train.py's automatic choice picks for its flags, parsed as the command parses them."""
    from gptlite.cli import train
    from gptlite.cli.flags import parse

    return train.automatic_backend(parse(train.make_parser("gptlite-train"), argv))


def test_train_reads_the_precision_from_its_flags_its_run_file_and_its_preset(monkeypatch, tmp_path):

    monkeypatch.delenv("KERAS_BACKEND", raising=False)
    monkeypatch.setenv("KERAS_HOME", str(tmp_path))
    monkeypatch.setattr(machine, "cpu_flags", lambda: BF16_CPU)
    monkeypatch.setattr(machine, "has_gpu", lambda environment=None: False)
    monkeypatch.setattr(machine, "installed", lambda module: True)
    backend, line = automatic_backend(["text.txt", "--preset", "gpu"])  # the gpu preset trains in bf16
    assert backend == "torch" and line.startswith("backend: torch, ") and "--backend" in line
    assert automatic_backend(["text.txt", "--preset", "gpu", "--precision", "fp32"]) == (None, None)
    assert automatic_backend(["text.txt"]) == (None, None)
    run_file = tmp_path / "config.toml"
    run_file.write_text('sources = ["text.txt"]\n[settings]\nprecision = "bf16"\n')
    assert automatic_backend(["--config", str(run_file)])[0] == "torch"
    with pytest.raises(gptlite.GPTLiteError):  # the command says so, in one line, before choosing
        automatic_backend(["--config", str(tmp_path / "missing.toml")])


def test_a_resumed_run_keeps_the_backend_it_started_on(monkeypatch, tmp_path):
    from gptlite.training import run_config

    monkeypatch.delenv("KERAS_BACKEND", raising=False)
    monkeypatch.setattr(machine, "cpu_flags", lambda: BF16_CPU)
    monkeypatch.setattr(machine, "has_gpu", lambda environment=None: False)
    monkeypatch.setattr(machine, "installed", lambda module: True)
    run_config.write_run_config(tmp_path / "config.toml", {"sources": ["text.txt"], "preset": "gpu"},
                                {"precision": "bf16"}, "tensorflow")
    assert automatic_backend(["--preset", "gpu", "--out", str(tmp_path), "--resume"]) == ("tensorflow", None)
    assert automatic_backend(["--out", str(tmp_path / "none"), "--resume"]) == (None, None)  # the run says so


def test_every_backend_has_a_runtime_and_an_install_line_that_names_its_extra():
    import tomllib

    from gptlite.backend.runtime import RUNTIMES
    from conftest import REPO

    assert set(choice.BACKENDS) == set(RUNTIMES)
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for backend in choice.BACKENDS:
        line = choice.install_line(backend)
        assert line.startswith('pip install "gptlite') and (backend == "tensorflow" or backend in extras), line
    assert choice.install_line("jax") == 'pip install "gptlite[jax]", or pip install -e ".[jax]" in a checkout'
