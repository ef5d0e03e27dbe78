import pathlib

import pytest

import gptlite
from gptlite.training import run_config

pytestmark = pytest.mark.once("run files are plain Python")

TRICKY = 'a "quoted" \\ path\twith\nnew lines, ünïcödé and 🙂\x7f'


def write(path, arguments=None, settings=None):
    run_config.write_run_config(path, {"sources": ["a.txt", TRICKY], "preset": "tiny", "distribute": False,
                                       "vocab_size": None, **(arguments or {})},
                                {"max_iters": 30, "lr": 3e-3, "min_lr": 1e-05, "bias": True, "lora_alpha": None,
                                 "position": "learned", "muon_momentum": 0.9, **(settings or {})}, "jax")


def test_a_run_file_reads_back_as_written(tmp_path):
    write(tmp_path / "config.toml")
    config = gptlite.read_run_config(tmp_path / "config.toml")
    assert config.backend == "jax" and config.gptlite_version == gptlite.__version__
    assert config.arguments == {
        "sources": [pathlib.Path("a.txt"), pathlib.Path(TRICKY)],
        "preset": "tiny", "distribute": False,
        "settings": {"max_iters": 30, "lr": 3e-3, "min_lr": 1e-05, "bias": True, "position": "learned",
                     "muon_momentum": 0.9},
    }


@pytest.mark.parametrize("text,message", [
    ('max_iters = 5\n', "unknown key 'max_iters' here: it belongs in [settings]"),
    ('[settings]\nmax_iter = 5\n', "unknown key [settings] 'max_iter'; did you mean 'max_iters'?"),
    ('[settings]\ntokenizr = "bpe"\n', "did you mean 'tokenizer' (at the top)?"),
    ('[settings]\nmax_iters = "lots"\n', "[settings] 'max_iters' must be a whole number, got 'lots'"),
    ('[settings]\nlr = true\n', "'lr' must be a number, got True"),
    ('sources = "a.txt"\n', "'sources' must be a list of strings"),
    ('max_iters = \n', "is not a TOML file"),
    ('settings = 3\n', "'settings' must be a table"),
])
def test_a_bad_run_file_is_refused_naming_the_key(tmp_path, text, message):
    path = tmp_path / "config.toml"
    path.write_text(text)
    with pytest.raises(gptlite.GPTLiteError) as error:
        gptlite.read_run_config(path)
    assert message in str(error.value) and str(path) in str(error.value)


def test_a_missing_run_file_is_named(tmp_path):
    with pytest.raises(gptlite.MissingFileError, match="no such run file"):
        gptlite.read_run_config(tmp_path / "none.toml")


def test_an_older_fine_tuning_run_file_drops_the_char_tokenizer_it_wrote_by_default(tmp_path):
    write(tmp_path / "config.toml", {"init_from": "base/model.keras", "tokenizer": "char"})
    assert "tokenizer" not in gptlite.read_run_config(tmp_path / "config.toml").arguments
    write(tmp_path / "config.toml", {"tokenizer": "char"})
    assert gptlite.read_run_config(tmp_path / "config.toml").arguments["tokenizer"] == "char"


def test_the_architecture_settings_read_back_as_written(tmp_path):
    architecture = {name: value for name, value in gptlite.PRESETS["modern"].items()
                    if name in ("position", "norm", "mlp", "n_kv_head", "qk_norm")}
    architecture.update(rope_theta=500.0, norm_epsilon=1e-6, norm_position="post", mlp_hidden_size=96, qkv_bias=True)
    write(tmp_path / "config.toml", settings=architecture)
    settings = gptlite.read_run_config(tmp_path / "config.toml").arguments["settings"]
    assert {name: settings[name] for name in architecture} == architecture
