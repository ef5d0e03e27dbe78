"""`train_on_text`: what train.py does, called from Python."""

import csv

import numpy as np
import pytest

import gptlite
from conftest import make_text, reversal_pairs

# The pipeline's own logic does not depend on the backend (training on each is tested in test_training).
ONCE = pytest.mark.once("the run's plumbing is the same on every backend")
TINY = {"max_iters": 12, "eval_interval": 6, "eval_iters": 2, "checkpoint_interval": 6, "n_embd": 16,
        "block_size": 16}


def pairs_file(path, pairs):
    """`pairs` written as a file of source<TAB>target lines at `path`; the path."""
    path.write_text("".join(f"{s}\t{t}\n" for s, t in zip(pairs.sources, pairs.targets)))
    return path


@pytest.fixture(scope="module")
def text_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("texts")
    (folder / "a.txt").write_text(make_text(1500, seed=1))
    (folder / "more").mkdir()
    (folder / "more" / "b.txt").write_text(make_text(1500, seed=2))
    return [folder / "a.txt", folder / "more"]


@pytest.mark.slow
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
def test_a_folder_that_holds_a_run_is_refused_before_the_model_to_start_from_is_read(tmp_path, text_files,
                                                                                      monkeypatch):
    """Reading a pretrained model takes seconds (minutes for a large one): a folder the run may not write to is
    refused first."""
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "model.keras").write_bytes(b"a user's earlier model")

    def read(*args, **kwargs):
        raise AssertionError("the model to start from was read")

    monkeypatch.setattr("gptlite.weights.pretrained.from_pretrained", read)
    with pytest.raises(gptlite.RunExistsError, match="already exists"):
        gptlite.train_on_text(text_files, tmp_path / "run", TINY, init_from=tmp_path / "base.keras", verbose=0)
    assert (tmp_path / "run" / "model.keras").read_bytes() == b"a user's earlier model"


@pytest.mark.slow
@ONCE
def test_a_seq2seq_run_from_a_pairs_file_measures_exact_match(tmp_path):
    source = pairs_file(tmp_path / "pairs.tsv", reversal_pairs(600, seed=3))
    run = gptlite.train_on_text([source], tmp_path / "run", {"max_iters": 6, "eval_interval": 6, "eval_iters": 1,
                                                              "n_embd": 16, "batch_size": 16, "warmup_iters": 2},
                                task="seq2seq", verbose=0)
    assert isinstance(run.model, gptlite.Seq2Seq) and len(run.held_out) == 60
    assert 0.0 <= run.history[-1]["exact_match"] <= 1.0
    assert run.model.config.block_size == 7  # the longest target, 6 letters, and its start token


@pytest.mark.parametrize("options,message", [
    (dict(settings={"max_iters": 0}), "max_iters must be a positive whole number"),
    (dict(settings={"max_iter": 5}), "unknown settings: max_iter"),
    (dict(tokenizer="words"), "tokenizer must be one of char, bpe"),
    (dict(synthetic="reverse", task="lm"), "leave out `task='lm'`"),
    (dict(resume=True, overwrite=True), "contradict"),
    (dict(vocab_size=300), "`vocab_size` sets the size of a learned vocabulary"),
    (dict(settings={"lora_rank": 4}), "`lora_rank` trains adapters beside a pretrained model's frozen weights"),
    (dict(tokenizer="bpe", vocab_size=10), "vocab_size must be from 257"),
    (dict(sources=(), synthetic="reverse", film=True), "a seq2seq model keeps none"),
    (dict(film_probe="ROMEO:"), "give `film=True` with it"),
    (dict(sources=(), synthetic="induction", tokenizer="bpe"), "symbols are characters"),
])
def test_mistakes_are_refused_before_anything_is_written(tmp_path, text_files, options, message):
    out = tmp_path / "run"
    with pytest.raises(gptlite.GPTLiteError, match=message) as raised:
        gptlite.train_on_text(**{"sources": text_files, "out_dir": out, "verbose": 0, **options})
    assert "--" not in str(raised.value)  # settings, never flags
    assert not out.exists()


@pytest.mark.parametrize("mistake", ["missing file", "empty text", "malformed pairs", "unknown characters"])
def test_a_run_refused_after_reading_its_text_leaves_no_folder(tmp_path, text_files, mistake):
    out = tmp_path / "nested" / "run"
    empty, pairs_file = tmp_path / "empty.txt", tmp_path / "pairs.tsv"
    empty.write_text("")
    pairs_file.write_text("abc\tcba\nno tab here\n")
    base = tmp_path / "base.keras"
    if mistake == "unknown characters":  # a pretrained char model that never saw "Z"
        tokenizer = gptlite.CharTokenizer.from_text("abc ")
        model = gptlite.GPT(vocab_size=tokenizer.vocabulary_size, n_layer=1, n_head=1, n_embd=8, block_size=8,
                            tokenizer=tokenizer)
        model.build((None, 8))
        gptlite.save(model, base)
        (tmp_path / "z.txt").write_text("abc Z " * 200)
    calls = {"missing file": dict(sources=[tmp_path / "nope.txt"]), "empty text": dict(sources=[empty]),
             "malformed pairs": dict(sources=[pairs_file], task="seq2seq"),
             "unknown characters": dict(sources=[tmp_path / "z.txt"], init_from=base)}
    with pytest.raises(gptlite.GPTLiteError):
        gptlite.train_on_text(out_dir=out, settings=TINY, verbose=0, **calls[mistake])
    assert not out.exists() and not out.parent.exists()


# The seq2seq preset's model trains in every suite as the reverser (conftest), through the same training loop.
@pytest.mark.slow
@pytest.mark.parametrize("preset", [preset if preset != "seq2seq" else pytest.param(preset, marks=ONCE)
                                    for preset in sorted(gptlite.PRESETS)])
def test_every_preset_trains_a_step_on_this_backend(tmp_path, text_files, preset):
    """Every preset as a user starts it, with its precision and dropout, on whichever backend runs the suite;
    only its shape is cut down, so that a step takes moments."""
    task = "seq2seq" if preset == "seq2seq" else None
    small = {"n_layer": 1, "n_embd": 16, "n_head": 2, "batch_size": 4, "max_iters": 2, "eval_interval": 2,
             "eval_iters": 1, "checkpoint_interval": 2}
    if task == "seq2seq":
        sources = [pairs_file(tmp_path / "pairs.tsv", reversal_pairs(100, seed=4))]
    else:
        sources, small = text_files, {**small, "block_size": 16}
    run = gptlite.train_on_text(sources, tmp_path / "run", small, preset=preset, task=task, verbose=0)
    assert run.training_config.precision == gptlite.PRESETS[preset].get("precision", "fp32")
    assert run.history[-1]["step"] == 2 and np.isfinite(run.history[-1]["val_loss"])


def test_the_doors_arguments_are_the_runs_each_by_keyword_and_nothing_else(tmp_path):
    import dataclasses
    import inspect

    from gptlite.training.plan import RunArguments

    parameters = inspect.signature(gptlite.train_on_text).parameters
    fields = {field.name: field.default for field in dataclasses.fields(RunArguments)}
    assert list(parameters) == [*fields, "verbose"]
    assert all(parameters[name].default == default for name, default in fields.items() if name != "out_dir")
    with pytest.raises(gptlite.ConfigError, match="train_on_text has no argument 'max_iters'"):
        gptlite.train_on_text([], tmp_path / "run", max_iters=10)
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
@ONCE
def test_a_film_started_on_resuming_says_where_it_starts_and_is_kept_beside_the_run(tmp_path, text_files, capsys):
    gptlite.train_on_text(text_files, tmp_path, TINY, preset="tiny", verbose=0)
    probe = text_files[0].read_text()[:12]  # within the context (16)
    with pytest.raises(gptlite.ConfigError, match="kept no film: give `film=True` with `film_probe`"):
        gptlite.train_on_text(text_files, tmp_path, {"max_iters": 18}, resume=True, film_probe=probe, verbose=0)
    gptlite.train_on_text(text_files, tmp_path, {"max_iters": 18}, resume=True, film=True, film_probe=probe)
    said = capsys.readouterr().out
    assert "the film starts at step 12, where this run resumes" in said and "keeping a film of" in said
    movie = gptlite.film(tmp_path)
    assert movie.frames[0].step == 12 and movie.frames[-1].step == 18 and movie.probe == probe
    assert gptlite.read_run_config(tmp_path / "config.toml").arguments["film"] is True
    # A folder that holds a film holds a run: a new run there is refused, and `overwrite` takes the film away.
    (tmp_path / "model.keras").unlink()
    (tmp_path / "checkpoint.npz").unlink()
    with pytest.raises(gptlite.RunExistsError, match="film"):
        gptlite.train_on_text(text_files, tmp_path, TINY, preset="tiny", verbose=0)
    gptlite.train_on_text(text_files, tmp_path, TINY, preset="tiny", verbose=0, overwrite=True)
    assert not (tmp_path / "film").exists()

