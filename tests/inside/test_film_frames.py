"""`gptlite.film`: a run's frames read back, and every number they show the model's own at that frame."""

import csv
import math

import numpy as np
import pytest

import gptlite
from gptlite.inside import film as films
from conftest import filmed_run


@pytest.fixture(scope="module")
def filmed():
    return filmed_run()


@pytest.fixture(scope="module")
def movie(filmed):
    return gptlite.film(filmed)


def test_the_film_of_a_run_holds_its_schedule_with_the_run_s_logged_losses(filmed, movie):
    steps = [frame.step for frame in movie.frames]
    assert steps[0] == 0 and steps[-1] == gptlite.PRESETS["tiny"]["max_iters"] and len(steps) >= 20
    assert steps == sorted(set(steps))
    with open(filmed / "history.csv") as file:
        logged = {int(row["step"]): float(row["val_loss"]) for row in csv.DictReader(file)}
    for frame in movie.frames:
        if frame.step in logged:
            assert frame.val_loss == pytest.approx(logged[frame.step], abs=1e-5)
    assert movie.probe_ids.shape == (gptlite.PRESETS["tiny"]["block_size"],)


def test_every_head_score_of_a_frame_is_gptlite_heads_on_that_frame_s_model(movie):
    for index in (0, len(movie) // 2, len(movie) - 1):
        report = gptlite.heads(movie.frames[index].model(), movie.probe_ids, calibrate=False)
        shown = movie.heads(index)
        for name in ("previous_token", "first_token", "current_token", "induction", "ablation"):
            np.testing.assert_allclose(getattr(shown, name), getattr(report, name), atol=1e-5)
    scores = movie.scores()
    assert scores["induction"].shape == (len(movie), 2, 2)
    np.testing.assert_allclose(scores["previous_token"][-1], movie.heads(len(movie) - 1).previous_token)


def test_a_frame_s_trace_is_gptlite_trace_of_its_model(movie):
    frame = movie.frames[-1]
    traced = gptlite.trace(frame.model(), movie.probe_ids)
    shown = movie.trace(len(movie) - 1)
    np.testing.assert_allclose(shown.steps["logits"], traced.steps["logits"], atol=1e-5)
    np.testing.assert_allclose(shown.layers[-1]["attention"], traced.layers[-1]["attention"], atol=1e-5)


def test_what_a_frame_writes_is_what_its_model_writes_whichever_frame_was_loaded_before(movie):
    half = len(movie.probe_ids) // 2
    prompt = movie.loaded(0).tokenizer.decode(movie.probe_ids[:half])
    for index in (len(movie) - 1, 0, len(movie) // 2):
        written = gptlite.generate(movie.frames[index].model(), prompt, len(movie.probe_ids) - half, temperature=0)
        assert movie.continuation(index) == written[len(prompt):]


def test_the_probe_loss_starts_near_chance_on_both_halves(movie):
    first = movie.probe_loss(0)
    chance = math.log(movie.loaded(0).config.vocab_size)
    # Fresh weights give nearly even odds: each half's loss is near the log of the vocabulary's size.
    assert abs(first.first_half - chance) < 0.5 and abs(first.second_half - chance) < 0.5


def test_the_embedding_s_frames_are_turned_to_follow_one_another_without_changing_their_shape(movie):
    shown = movie.embedding()
    points, tokens = shown["points"], shown["tokens"]
    assert points.shape == (len(movie), len(tokens), 2) and len(shown["groups"]) == len(tokens)
    for index in (1, len(movie) - 1):
        table = np.asarray(movie.loaded(index).embedding.token_embedding.embeddings, np.float64)
        centred = table - table.mean(axis=0)
        raw = centred @ np.linalg.svd(centred, full_matrices=False)[2][:2].T
        distances = lambda p: np.linalg.norm(p[:, None] - p[None], axis=-1)  # noqa: E731
        np.testing.assert_allclose(distances(points[index]), distances(raw), atol=1e-6)  # a turn, no more
        for mirrored in (raw, raw * [1, -1], raw * [-1, 1], -raw):
            assert (np.linalg.norm(points[index] - points[index - 1])
                    <= np.linalg.norm(mirrored - points[index - 1]) + 1e-9)


def test_an_onset_is_the_first_frame_of_the_last_stretch_above_the_label_score_that_reaches_the_end(movie,
                                                                                                     monkeypatch):
    count = len(movie)
    rising = np.zeros((count, 2, 2))
    rising[3:, 0, 0] = 0.5  # above from frame 3 on
    rising[2, 1, 1], rising[5:, 1, 1] = 0.5, 0.5  # above at 2, below at 3 and 4, above from 5 on
    rising[4:-1, 1, 0] = 0.5  # above, then below at the last frame: no onset
    monkeypatch.setattr(movie, "scores", lambda: {"induction": rising, "previous_token": rising * 0,
                                                  "first_token": rising * 0, "current_token": rising * 0,
                                                  "ablation": rising * 0})
    onsets = movie.onsets()["induction"]
    steps = [frame.step for frame in movie.frames]
    assert onsets[0, 0] == steps[3] and onsets[1, 1] == steps[5]
    assert onsets[1, 0] is None and onsets[0, 1] is None
    assert movie.induction_onset() == steps[3]


def test_the_film_as_text_has_a_line_a_frame(movie):
    lines = movie.table().splitlines()
    for frame in movie.frames:
        assert any(line.split()[0] == str(frame.step) for line in lines[2:2 + len(movie)])
    assert lines[-1].startswith("induction heads:")


@pytest.mark.parametrize("token,group", [("a", "vowels"), ("b", "consonants"), ("Q", "capitals"), ("7", "digits"),
                                         (",", "punctuation"), ("\n", "whitespace"), (" ", "whitespace"),
                                         ("the", "other")])
def test_a_character_s_group(token, group):
    assert films.token_group(token) == group


@pytest.mark.slow
@pytest.mark.once("a training dynamic measured once; the film's numbers are checked under each backend above")
def test_on_the_synthetic_induction_task_the_induction_head_forms_as_the_repeated_half_s_loss_falls(tmp_path):
    gptlite.train_on_text(out_dir=tmp_path, synthetic="induction", film=True, verbose=0)
    movie = gptlite.film(tmp_path)
    largest = movie.scores()["induction"].max(axis=(1, 2))
    # A perfect induction head scores 0.5 on the probe (half its positions have an earlier copy to look after).
    assert largest[0] <= 0.1 and largest[-1] >= 0.3
    halves = [movie.probe_loss(index) for index in range(len(movie))]
    assert halves[-1].first_half - halves[-1].second_half >= 1.0
    second = np.array([half.second_half for half in halves])
    fall = int(np.argmax(-np.diff(second))) + 1  # the frame the largest fall ends at
    steps = [frame.step for frame in movie.frames]
    assert movie.induction_onset() is not None
    assert abs(steps.index(movie.induction_onset()) - fall) <= 1
