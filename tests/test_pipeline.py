"""`train_on_text`: what train.py does, called from Python."""

import csv

import keras
import numpy as np
import pytest

import gptlite
from conftest import make_text, reversal_pairs

# The pipeline's own logic does not depend on the backend (training on each is tested in test_training).
ONCE = pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="run in the tensorflow suite only")
TINY = {"max_iters": 12, "eval_interval": 6, "eval_iters": 2, "checkpoint_interval": 6, "n_embd": 16,
        "block_size": 16}


@pytest.fixture(scope="module")
def text_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("texts")
    (folder / "a.txt").write_text(make_text(1500, seed=1))
    (folder / "more").mkdir()
    (folder / "more" / "b.txt").write_text(make_text(1500, seed=2))
    return [folder / "a.txt", folder / "more"]


@ONCE
def test_a_run_from_files_and_folders_writes_its_model_and_can_go_on(tmp_path, text_files):
    run = gptlite.train_on_text(text_files, tmp_path, TINY, preset="tiny", verbose=0)
    assert isinstance(run, gptlite.TrainedRun) and isinstance(run.model, gptlite.GPT)
    assert [row["step"] for row in run.history] == [6, 12]
    assert run.best in run.history and run.training_config.max_iters == 12
    assert run.model.config.n_embd == 16 and run.model.config.n_layer == gptlite.PRESETS["tiny"]["n_layer"]
    with open(tmp_path / "history.csv") as file:
        assert [int(row["step"]) for row in csv.DictReader(file)] == [6, 12]
    saved = gptlite.load(tmp_path / "model.keras")
    assert saved.tokenizer.vocabulary == run.model.tokenizer.vocabulary

    with pytest.raises(gptlite.RunExistsError, match="`resume=True`.*`overwrite=True`"):
        gptlite.train_on_text(text_files, tmp_path, TINY, preset="tiny", verbose=0)
    further = gptlite.train_on_text(text_files, tmp_path, {"max_iters": 18}, resume=True, verbose=0)
    assert [row["step"] for row in further.history] == [6, 12, 18]
    np.testing.assert_array_equal(further.model.embedding.get_weights()[0].shape,
                                  run.model.embedding.get_weights()[0].shape)


@ONCE
def test_a_seq2seq_run_from_a_pairs_file_measures_exact_match(tmp_path):
    pairs = reversal_pairs(600, seed=3)
    source = tmp_path / "pairs.tsv"
    source.write_text("".join(f"{s}\t{t}\n" for s, t in zip(pairs.sources, pairs.targets)))
    run = gptlite.train_on_text([source], tmp_path / "run", {"max_iters": 6, "eval_interval": 6, "eval_iters": 1,
                                                              "n_embd": 16, "batch_size": 16, "warmup_iters": 2},
                                task="seq2seq", verbose=0)
    assert isinstance(run.model, gptlite.Seq2Seq) and len(run.held_out) == 60
    assert 0.0 <= run.history[-1]["exact_match"] <= 1.0
    assert run.model.config.block_size == 7  # the longest target, 6 letters, and its start token


@pytest.mark.parametrize("options,message", [
    (dict(settings={"max_iters": 0}), "max_iters must be a positive whole number"),
    (dict(settings={"max_iter": 5}), "unknown settings: max_iter"),
    (dict(tokenizer="words"), "tokenizer must be 'char' or 'bpe'"),
    (dict(synthetic="reverse", task="lm"), "leave out `task='lm'`"),
    (dict(resume=True, overwrite=True), "contradict"),
    (dict(vocab_size=300), "`vocab_size` sets the size of a new BPE vocabulary"),
])
def test_mistakes_are_refused_before_anything_is_written(tmp_path, text_files, options, message):
    out = tmp_path / "run"
    with pytest.raises(gptlite.GPTLiteError, match=message) as raised:
        gptlite.train_on_text(text_files, out, **{"verbose": 0, **options})
    assert "--" not in str(raised.value)  # settings, never flags
    assert not out.exists()
