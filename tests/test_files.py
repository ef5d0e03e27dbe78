import os

import pytest

import gptlite
from gptlite import files

pytestmark = pytest.mark.once("reading and writing files is plain Python")


def test_read_text_errors_say_what_is_wrong(tmp_path):
    with pytest.raises(gptlite.MissingFileError, match="no such file"):
        files.read_text(tmp_path / "absent.txt")
    with pytest.raises(gptlite.InputError, match="is a folder"):
        files.read_text(tmp_path)
    blank = tmp_path / "blank.txt"
    blank.write_text(" \n\t\n")
    with pytest.raises(gptlite.InputError, match="no text"):
        files.read_text(blank)
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("first line\ncaf\xe9\n".encode("latin-1"))
    with pytest.raises(gptlite.InputError, match=r"not valid utf-8: byte 14 \(line 2\)"):
        files.read_text(latin1)


def test_atomic_path_replaces_only_when_the_write_finishes(tmp_path):
    target = tmp_path / "model.weights.h5"
    target.write_text("old")
    with pytest.raises(RuntimeError):
        with files.atomic_path(target) as temporary:
            assert temporary.name.endswith(".weights.h5") and temporary.parent == tmp_path
            temporary.write_text("half")
            raise RuntimeError("crash")
    assert target.read_text() == "old"
    assert os.listdir(tmp_path) == ["model.weights.h5"]
    with files.atomic_path(target) as temporary:
        temporary.write_text("new")
    assert target.read_text() == "new"
    assert os.listdir(tmp_path) == ["model.weights.h5"]


def test_the_policy_read_is_the_one_keras_saves(tmp_path):
    import keras

    import gptlite

    model = gptlite.GPT(vocab_size=8, n_layer=1, n_head=1, n_embd=8, block_size=4,
                        tokenizer=gptlite.CharTokenizer("abcdefgh"), dtype=keras.DTypePolicy("mixed_bfloat16"))
    model.build((None, 4))
    gptlite.save(model, tmp_path / "model.keras")
    assert files.saved_dtype_policy(tmp_path / "model.keras") == "mixed_bfloat16"
