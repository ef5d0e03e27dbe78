import keras
import numpy as np
import pytest

import gptlite
from gptlite.data import lm
from gptlite.data.pairs import PairBatches, PairSet
from conftest import REPO

pytestmark = pytest.mark.once("text data and its batches are NumPy")


def test_split_keeps_the_last_tenth_for_validation():
    train, validation = lm.split(np.arange(100))
    np.testing.assert_array_equal(train, np.arange(90))
    np.testing.assert_array_equal(validation, np.arange(90, 100))


def test_too_short_text_names_a_block_size_that_fits():
    train, validation = lm.split(np.arange(100))
    lm.check_enough_tokens(train, validation, block_size=9)
    with pytest.raises(gptlite.InputError, match="`block_size=9` or less"):
        lm.check_enough_tokens(train, validation, block_size=10)


def test_windows_are_inputs_and_next_token_targets():
    ids = np.arange(1000, dtype=np.uint16)
    batches = lm.RandomWindows(ids, block_size=8, batch_size=4, num_batches=5, seed=0)
    assert len(batches) == 5
    x, y = batches[3]
    assert x.shape == y.shape == (4, 8) and x.dtype == np.int32
    np.testing.assert_array_equal(y[:, :-1], x[:, 1:])
    np.testing.assert_array_equal(y[:, -1], x[:, -1] + 1)  # consecutive ids in this stream
    assert x.max() < 999 and y.max() <= 999


def test_batches_depend_only_on_seed_and_index():
    ids = np.arange(10_000)
    first = lm.RandomWindows(ids, 8, 4, 10, seed=1)
    again = lm.RandomWindows(ids, 8, 4, 10, seed=1)
    other_seed = lm.RandomWindows(ids, 8, 4, 10, seed=2)
    np.testing.assert_array_equal(first[7][0], again[7][0])
    assert not np.array_equal(first[7][0], first[6][0])
    assert not np.array_equal(first[7][0], other_seed[7][0])


@pytest.mark.parametrize("drawn", ["at once", "one by one"])
@pytest.mark.parametrize("kind", ["windows", "pairs"])
def test_keras_reads_the_batches_themselves_in_order(kind, drawn, monkeypatch):
    if drawn == "one by one":  # batches of more than STACKED_BYTES
        monkeypatch.setattr(lm, "STACKED_BYTES", 1)
    if kind == "windows":
        batches = lm.RandomWindows(np.arange(1000), 8, 4, 5, seed=3)
    else:
        ids = np.arange(60 * 17, dtype=np.int32)
        batches = PairBatches(PairSet(ids[:60 * 8].reshape(60, 8), ids[60 * 8:].reshape(60, 9), None), 4, 5, seed=3)
    fed = lm.fed_to_keras(batches)
    if keras.backend.backend() != "tensorflow":
        assert fed is batches
        return
    # On TensorFlow: a pipeline that does not autotune (whose end would wait for the tuner), of the same batches,
    # whether drawn ahead into memory or read from a generator.
    assert not fed.options().autotune.enabled
    assert int(fed.cardinality()) == len(batches) == 5
    read = list(fed.as_numpy_iterator())
    assert len(read) == 5
    for index, (inputs, targets) in enumerate(read):
        want_inputs, want_targets = batches[index]
        np.testing.assert_array_equal(targets, want_targets)
        if kind == "windows":
            np.testing.assert_array_equal(inputs, want_inputs)
        else:
            assert inputs.keys() == want_inputs.keys()
            for name in inputs:
                np.testing.assert_array_equal(inputs[name], want_inputs[name])


def test_default_corpus_is_deterministic_python_source():
    corpus = lm.default_corpus(max_characters=50_000)
    assert len(corpus) == 50_000
    assert corpus == lm.default_corpus(max_characters=50_000)
    assert corpus.startswith("# ") and "def " in corpus
    assert corpus.isascii()


def test_download_script_fails_clearly_without_a_network(tmp_path, capsys, monkeypatch):
    import runpy

    script = runpy.run_path(str(data_script()))
    # Port 9 on loopback: nothing listens, so the request fails at once, as offline.
    monkeypatch.setitem(script["main"].__globals__, "URL", "http://127.0.0.1:9/input.txt")
    target = tmp_path / "shakespeare.txt"
    assert script["main"](["--out", str(target)]) == 1
    assert "cannot download" in capsys.readouterr().err
    assert not target.exists()


def data_script():
    return REPO / "data" / "download_shakespeare.py"


def test_a_corpus_reads_files_and_folders_in_order_in_pieces(tmp_path, monkeypatch):
    monkeypatch.setattr(lm, "PIECE_BYTES", 16)  # pieces cut through lines and multi-byte characters
    (tmp_path / "books").mkdir()
    (tmp_path / "books" / "b.txt").write_text("second: 你好 🙂 e\u0301 and a long line without an end")
    (tmp_path / "books" / "a.txt").write_text("a first line\n" * 5)
    (tmp_path / "books" / ".hidden").write_text("never read")
    (tmp_path / "c.txt").write_text("third\r\n")
    corpus = lm.Corpus.from_files([tmp_path / "c.txt", tmp_path / "books"])
    documents = [list(document) for document in corpus.documents()]
    assert ["".join(d) for d in documents] == [
        "third\r\n", "a first line\n" * 5, "second: 你好 🙂 e\u0301 and a long line without an end"]
    assert len(documents[1]) > 1 and all(piece.endswith("\n") for piece in documents[1])  # cut at line ends
    with pytest.raises(gptlite.InputError, match="no files in it"):
        (tmp_path / "empty").mkdir()
        lm.Corpus.from_files([tmp_path / "empty"])
    with pytest.raises(gptlite.MissingFileError, match="no such file"):
        lm.Corpus.from_files([tmp_path / "absent.txt"])


def test_a_bad_byte_deep_in_a_file_is_reported_where_it_is(tmp_path, monkeypatch):
    monkeypatch.setattr(lm, "PIECE_BYTES", 16)
    path = tmp_path / "latin1.txt"
    path.write_bytes(("é line\n" * 10).encode() + "caf\xe9\n".encode("latin-1"))
    with pytest.raises(gptlite.InputError, match=r"not valid utf-8: byte 83 \(line 11\)"):
        list(lm.Corpus.from_files([path]).pieces())
    assert "".join(lm.Corpus.from_files([path], errors="replace").pieces()).endswith("caf\ufffd\n")


def test_token_ids_are_cached_until_the_text_or_tokenizer_changes(tmp_path, monkeypatch):
    from gptlite.text.bpe import BPETokenizer

    (tmp_path / "a.txt").write_text("one two three\n" * 50)
    (tmp_path / "b.txt").write_text("four five\n" * 50)
    corpus = lm.Corpus.from_files([tmp_path / "a.txt", tmp_path / "b.txt"])
    tokenizer = BPETokenizer.train(corpus.pieces(), 270)
    ids = lm.encode_corpus(corpus, tokenizer, tmp_path / "run")
    assert ids.dtype == np.uint16 and isinstance(ids, np.memmap)
    expected = np.concatenate([tokenizer.encode("one two three\n" * 50), [tokenizer.end_token_id],
                               tokenizer.encode("four five\n" * 50)])
    np.testing.assert_array_equal(ids, expected)
    [cache] = (tmp_path / "run").glob("tokens-*")

    calls = []
    monkeypatch.setattr(tokenizer, "encode_batch", lambda texts: calls.append(texts) or [])
    again = lm.encode_corpus(lm.Corpus.from_files([tmp_path / "a.txt", tmp_path / "b.txt"]), tokenizer,
                               tmp_path / "run")
    assert calls == [] and np.array_equal(again, ids)  # read from the cache, not encoded again
    monkeypatch.undo()

    (tmp_path / "b.txt").write_text("four five six\n" * 50)
    changed = lm.encode_corpus(lm.Corpus.from_files([tmp_path / "a.txt", tmp_path / "b.txt"]), tokenizer,
                                 tmp_path / "run")
    assert len(changed) > len(ids)
    other_tokenizer = BPETokenizer.train(corpus.pieces(), 260)
    lm.encode_corpus(lm.Corpus.from_files([tmp_path / "a.txt"]), other_tokenizer, tmp_path / "run")
    assert not cache.exists() and len(list((tmp_path / "run").glob("tokens-*"))) == 1  # stale caches go
