import json

import keras
import numpy as np
import pytest

import gptlite
from gptlite.data import lm
from gptlite.training import checkpoints, film, fit
from gptlite.training.run_folder import FILM_INDEX
from gptlite.weights import saving
from conftest import StopAtStep

STEPS = 60
# A schedule of a few frames, every evaluation's (20, 40, 60) among them.
SCHEDULE = (0, 1, 3, 7, 13, 20, 27, 31, 40, 60)


def test_a_schedule_is_dense_early_holds_every_evaluation_and_about_the_frames_asked():
    steps = film.frame_steps(2000, 250)
    assert steps[:3] == [0, 1, 2] and steps[-1] == 2000
    assert set(range(250, 2001, 250)) <= set(steps)
    assert 24 <= len(steps) <= 26
    gaps = np.diff(steps)
    assert gaps[0] < gaps[len(gaps) // 2] < max(gaps)  # denser early than later
    # Each a multiple of the steps a compiled call runs (evaluations are), or the last.
    assert all(step % 7 == 0 for step in film.frame_steps(700, 70, every=7))
    # No frame a step or two from an evaluation's.
    assert all(abs(step - 250 * round(step / 250)) > step / 10 for step in steps if step % 250)


def filmed_run(tokenizer, text, out, stop_at=None, resume=False):
    """A small run with a film of SCHEDULE's frames: (the model, the evaluation rows, the validation ids)."""
    keras.utils.set_random_seed(5)
    model = gptlite.GPT(vocab_size=tokenizer.vocabulary_size, n_layer=1, n_head=2, n_embd=16, block_size=16,
                        dropout=0.1, tokenizer=tokenizer)
    model.build((None, 16))
    train_ids, validation_ids = lm.split(tokenizer.encode(text))
    config = gptlite.TrainingConfig(batch_size=8, max_iters=STEPS, lr=3e-3, min_lr=3e-4, warmup_iters=5,
                                    eval_interval=20, eval_iters=2, checkpoint_interval=40, seed=5)
    plan = film.FilmPlan(SCHEDULE, tokenizer.decode(validation_ids[:16]), tuple(int(i) for i in validation_ids[:16]))
    rows = fit.train(model, train_ids, validation_ids, config, out, "lm", verbose=0, resume=resume, film=plan,
                     stop_request=StopAtStep(model, stop_at) if stop_at else None)
    return model, rows, validation_ids


@pytest.fixture(scope="module")
def whole_film(tmp_path_factory, tokenizer, text):
    out = tmp_path_factory.mktemp("filmed")
    model, rows, validation_ids = filmed_run(tokenizer, text, out)
    return out, model, rows, validation_ids


def index(out):
    return json.loads((out / FILM_INDEX).read_text())


def test_a_film_keeps_each_frame_of_its_schedule_with_the_losses_the_run_logged(whole_film):
    out, model, rows, validation_ids = whole_film
    frames = index(out)["frames"]
    assert [frame["step"] for frame in frames] == list(SCHEDULE)
    assert frames[0]["train_loss"] is None and all(frame["train_loss"] > 0 for frame in frames[1:])
    logged = {row["step"]: row["val_loss"] for row in rows}
    for frame in frames:
        if frame["step"] in logged:  # an evaluation's frame is that evaluation's
            assert frame["val_loss"] == logged[frame["step"]]
    # The last frame's weights are the model's at the end.
    with np.load(out / "film" / frames[-1]["file"]) as saved:
        last = {name: saved[name] for name in saved.files}
    for name, value in saving.weights_by_layer(model).items():
        np.testing.assert_array_equal(last[name], value)


def test_a_frame_reloads_as_a_model_whose_validation_loss_is_the_one_the_film_logged(whole_film):
    out, _, _, validation_ids = whole_film
    movie = gptlite.film(out)
    batches = lm.fed_to_keras(lm.RandomWindows(validation_ids, 16, 8, 2, seed=5 + 1))
    for frame in (movie.frames[2], movie.frames[6]):  # steps 3 and 27: no evaluation's
        model = frame.model()
        model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        assert float(model.evaluate(batches, verbose=0)) == pytest.approx(frame.val_loss, rel=1e-5)  # compiled apart


def test_a_stopped_run_keeps_its_frames_and_resumed_continues_the_film_with_none_missing_or_repeated(
        tmp_path, tokenizer, text, whole_film):
    out, _, _, _ = whole_film
    with pytest.raises(gptlite.TrainingInterrupted):
        filmed_run(tokenizer, text, tmp_path, stop_at=29)
    kept = index(tmp_path)["frames"]
    assert [frame["step"] for frame in kept] == [0, 1, 3, 7, 13, 20, 27]
    assert all((tmp_path / "film" / frame["file"]).exists() for frame in kept)
    # The checkpoint is at the stop (29): the film goes on from there.
    assert checkpoints.read_checkpoint(tmp_path)["step"] == 29
    filmed_run(tokenizer, text, tmp_path, resume=True)
    resumed, whole = index(tmp_path)["frames"], index(out)["frames"]
    assert [frame["step"] for frame in resumed] == list(SCHEDULE)
    for got, want in zip(resumed, whole):
        assert got["val_loss"] == pytest.approx(want["val_loss"], abs=1e-4)
        if want["train_loss"] is not None:
            assert got["train_loss"] == pytest.approx(want["train_loss"], abs=1e-4)
    last = gptlite.film(tmp_path).frames[-1].model()
    whole_last = gptlite.film(out).frames[-1].model()
    for name, value in saving.weights_by_layer(whole_last).items():
        np.testing.assert_allclose(saving.weights_by_layer(last)[name], value, atol=1e-5)


def test_a_missing_or_damaged_frame_and_a_run_without_a_film_are_each_said_in_a_line(tmp_path, whole_film):
    with pytest.raises(gptlite.InputError, match="no film in"):
        gptlite.film(tmp_path)
    out, _, _, _ = whole_film
    copy = tmp_path / "copy"
    (copy / "film").mkdir(parents=True)
    for path in (out / "film").iterdir():
        (copy / "film" / path.name).write_bytes(path.read_bytes())
    movie = gptlite.film(copy)
    (copy / "film" / "step-000003.npz").unlink()
    with pytest.raises(gptlite.InputError, match=r"frame at step 3 is missing: .*step-000003\.npz"):
        movie.frames[2].model()
    (copy / "film" / "step-000007.npz").write_bytes(b"not an archive")
    with pytest.raises(gptlite.InputError, match=r"frame at step 7 is damaged"):
        movie.heads(3)
    (copy / FILM_INDEX).write_text("{")
    with pytest.raises(gptlite.InputError, match="cannot read the film's index"):
        gptlite.film(copy)
