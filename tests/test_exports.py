"""The forms `gptlite export` writes (`gptlite.exports.EXPORT_FORMATS`): each a function of a module of weights/
(the web page's, of web/), checked before a model loads."""

import importlib

import pytest

import gptlite
from gptlite.exports import check_export, EXPORT_FORMATS


@pytest.mark.once("the table is plain Python")
def test_every_export_format_names_a_function_that_writes_it():
    assert list(EXPORT_FORMATS)[0] == "saved_model"  # the command's default
    for name, kind in EXPORT_FORMATS.items():
        module = importlib.import_module(f"gptlite.{kind.module}")
        assert callable(getattr(module, kind.function)), name
        assert kind.check is None or callable(getattr(module, kind.check)), name
        assert bool(kind.outtypes) == (kind.outtype_help is not None), name


@pytest.mark.once("the table is plain Python")
def test_an_export_that_cannot_be_written_is_refused_before_a_model_loads():
    with pytest.raises(gptlite.ConfigError, match="format must be one of saved_model, gguf, hf, web, kerashub"):
        check_export("onnx")
    with pytest.raises(gptlite.ConfigError, match="`outtype` is for `format=gguf|web`"):
        check_export("hf", "q8_0")
    with pytest.raises(gptlite.ConfigError, match="outtype must be one of f32, f16, q8_0"):
        check_export("gguf", "q4_0")
    with pytest.raises(gptlite.ConfigError, match="outtype must be one of f32, f16, int8, got 'q8_0'"):
        check_export("web", "q8_0")
    check_export("gguf", "q8_0")


def test_the_command_offers_every_format_and_writes_the_one_asked(tmp_path, tiny_model, capsys):
    from gptlite.cli import export

    parser = export.make_parser("gptlite-export")
    choices = next(action.choices for action in parser._actions if action.dest == "format")
    assert list(choices) == list(EXPORT_FORMATS)
    gptlite.save(tiny_model, tmp_path / "model.keras")
    assert export.main(["--model", str(tmp_path / "model.keras"), "--format", "gguf", "--outtype", "f32",
                        "--out", str(tmp_path / "tiny.gguf")]) == 0
    said = capsys.readouterr().out
    assert said.startswith(f"wrote {tmp_path / 'tiny.gguf'} (") and "FROM ./tiny.gguf" in said
    assert (tmp_path / "tiny.gguf").read_bytes()[:4] == b"GGUF"


def test_an_earlier_export_is_replaced_only_when_asked_and_never_a_model(tmp_path, tiny_model):
    out = tmp_path / "tiny.gguf"
    gptlite.export(tiny_model, "gguf", out, "f32")
    with pytest.raises(gptlite.RunExistsError, match="already exists; choose another `out`, or set `overwrite`"):
        gptlite.export(tiny_model, "gguf", out, "f16")
    f32 = out.stat().st_size
    assert "wrote" in gptlite.export(tiny_model, "gguf", out, "f16", overwrite=True)
    assert out.stat().st_size < f32  # f16's file in f32's place
    assert sorted(path.name for path in tmp_path.iterdir()) == ["tiny.gguf"]  # nothing left beside it
    gptlite.save(tiny_model, tmp_path / "runs" / "model.keras")
    with pytest.raises(gptlite.ConfigError, match="holds a model file"):
        gptlite.export(tiny_model, "gguf", tmp_path / "runs", overwrite=True)
    with pytest.raises(gptlite.ConfigError, match="is a file; this format writes a folder"):
        gptlite.export(tiny_model, "web", out, overwrite=True)
    assert out.stat().st_size < f32 and (tmp_path / "runs" / "model.keras").exists()  # both untouched
    assert sorted(path.name for path in tmp_path.iterdir()) == ["runs", "tiny.gguf"]


def _numbers_module():
    """A module that only this test imports, holding a new export format: the weights as one NumPy file."""
    import types

    import numpy as np

    from gptlite.weights import decoder_only

    @decoder_only("a file of numbers")
    def export_numbers(model, path):
        with open(path, "wb") as file:
            np.savez(file, **{variable.path: np.asarray(variable) for variable in model.weights})

    module = types.ModuleType("gptlite.weights.numbers_for_a_test")
    module.export_numbers = export_numbers
    return module


def test_a_format_added_as_one_module_and_one_table_line_is_offered_written_and_refused_as_declared(
        tmp_path, tiny_model, tiny_seq2seq, monkeypatch, capsys):
    import sys

    import numpy as np

    from gptlite.cli import export
    from gptlite.exports import ExportFormat

    monkeypatch.setitem(sys.modules, "gptlite.weights.numbers_for_a_test", _numbers_module())
    monkeypatch.setitem(EXPORT_FORMATS, "numbers", ExportFormat(
        "weights.numbers_for_a_test", "export_numbers", "the weights as one NumPy file", "wrote {out}: numbers"))
    gptlite.save(tiny_model, tmp_path / "model.keras")
    assert export.main(["--model", str(tmp_path / "model.keras"), "--format", "numbers",
                        "--out", str(tmp_path / "weights.npz")]) == 0
    assert capsys.readouterr().out == f"wrote {tmp_path / 'weights.npz'}: numbers\n"
    with np.load(tmp_path / "weights.npz") as written:
        assert len(written.files) == len(tiny_model.weights)
    with pytest.raises(gptlite.ConfigError, match="^a file of numbers holds a decoder-only model, one that continues "
                                                  "text \\(a GPT\\); a Seq2Seq writes targets from sources$"):
        gptlite.export(tiny_seq2seq, "numbers", tmp_path / "seq2seq.npz")
    assert not (tmp_path / "seq2seq.npz").exists()
