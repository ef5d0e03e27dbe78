"""gptlite.heads: TransformerLens's similarity score on patterns made by hand, the probe, the ablation's loss, the
labels and their calibration, the table and the refusals."""

import keras
import numpy as np
import pytest

import gptlite
from conftest import REPO
from gptlite.inside import heads as scoring

FIXTURES = REPO / "tests" / "fixtures"


def _causal_uniform(length):
    """Attention that spreads each query evenly over itself and every earlier token: (T, T)."""
    weights = np.tril(np.ones((length, length)))
    return weights / weights.sum(-1, keepdims=True)


def test_a_perfect_head_scores_its_share_of_the_positions_and_an_even_one_the_mean_of_its_weights():
    length = 8
    previous = np.eye(length, k=-1)
    previous[0, 0] = 1  # the first query has nothing before it: it attends to itself
    assert scoring.similarity(previous, np.eye(length, k=-1)) == pytest.approx((length - 1) / length)
    assert scoring.similarity(np.eye(length), np.eye(length)) == pytest.approx(1)
    even = _causal_uniform(length)
    assert scoring.similarity(even, np.eye(length)) == pytest.approx(np.mean(1 / np.arange(1, length + 1)))
    # Scores of several heads at once, (L, H, T, T) -> (L, H).
    stacked = np.stack([np.stack([previous, even])])
    assert scoring.similarity(stacked, np.eye(length, k=-1)).shape == (1, 2)


def test_the_induction_pattern_looks_just_after_the_earlier_copy_of_the_token():
    probe = np.array([7, 3, 5, 9, 3, 5, 9])  # a start token, then 3 5 9 twice
    pattern = scoring.induction_pattern(probe)
    # The second 3 (position 4) looks at position 2, the token after the first 3; the second 5 at 3, the second 9 at 4.
    expected = np.zeros((7, 7))
    expected[4, 2] = expected[5, 3] = expected[6, 4] = 1
    np.testing.assert_array_equal(pattern, expected)
    # An induction head attending there alone scores the share of the positions with an earlier copy.
    perfect = _causal_uniform(7)
    perfect[4:] = expected[4:]
    assert scoring.similarity(perfect, pattern) == pytest.approx(3 / 7)


def test_scores_are_the_similarity_of_the_models_own_attention_on_the_text_and_the_probe(fluent_model):
    text = "the cat sat on"  # within the fluent model's 16 tokens of context
    report = gptlite.heads(fluent_model, text, seed=3)
    ids = report.ids
    assert list(ids) == list(fluent_model.tokenizer.encode(text))  # a char model's prompt: no start token
    weights = keras.ops.convert_to_numpy(fluent_model.attention_weights(ids[None]))[:, 0].astype(np.float64)
    np.testing.assert_allclose(report.previous_token, scoring.similarity(weights, np.eye(len(ids), k=-1)), atol=1e-6)
    np.testing.assert_allclose(report.current_token, scoring.similarity(weights, np.eye(len(ids))), atol=1e-6)
    np.testing.assert_allclose(report.first_token, weights[..., 0].mean(-1), atol=1e-6)
    probe = report.probe
    half = (len(probe)) // 2
    assert len(probe) == 2 * half and np.array_equal(probe[:half], probe[half:]) and len(set(probe[:half])) == half
    assert len(probe) < fluent_model.config.block_size
    on_probe = keras.ops.convert_to_numpy(fluent_model.attention_weights(probe[None]))[:, 0].astype(np.float64)
    np.testing.assert_allclose(report.induction, scoring.similarity(on_probe, scoring.induction_pattern(probe)),
                               atol=1e-6)
    assert np.array_equal(gptlite.heads(fluent_model, text, seed=3, calibrate=False).probe, probe)


def _next_token_loss(logits, ids):
    """The mean cross-entropy of each next token of ids (T,) under logits (T, V), by hand."""
    logits = logits.astype(np.float64)
    shifted = logits - logits.max(-1, keepdims=True)
    logs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    return -logs[np.arange(len(ids) - 1), ids[1:]].mean()


def test_ablation_is_the_loss_with_the_head_zeroed_less_the_models_own(fluent_model):
    text = "the dog ran to a"
    report = gptlite.heads(fluent_model, text, calibrate=False)
    ids = report.ids
    assert report.loss == pytest.approx(_next_token_loss(gptlite.trace(fluent_model, text).steps["logits"], ids),
                                        abs=1e-5)
    for layer, head in ((0, 0), (1, 1)):
        ablated = gptlite.trace(fluent_model, ids.tolist(), ablate=[(layer, head)]).steps["logits"]
        assert report.ablation[layer, head] == pytest.approx(_next_token_loss(ablated, ids) - report.loss, abs=1e-5)


def test_labels_need_the_stated_score_and_twice_what_the_shape_scores_at_initialisation(fluent_model):
    report = gptlite.heads(fluent_model, "the big red hat")
    assert set(report.initial) == set(scoring.PATTERNS)
    runs = scoring.Runs(fluent_model, report.ids, report.probe, 2)
    fresh = scoring.attention_scores(runs.scored(scoring.initialised(fluent_model), [(), ()])[0], report.ids,
                                     report.probe)
    for pattern in scoring.PATTERNS:
        np.testing.assert_allclose(report.initial[pattern], fresh[pattern], atol=1e-6)  # the same fresh weights
    labels = report.labels()
    for pattern in scoring.PATTERNS:
        least = max(scoring.LABEL_SCORES[pattern], 2 * report.initial[pattern].max())
        for layer in range(2):
            for head in range(2):
                labelled = scoring.LABELS[pattern] in labels.get((layer, head), [])
                assert labelled == (getattr(report, pattern)[layer, head] >= least)
    # A made-up report: a clear previous-token head is labelled, an even one is not.
    made = scoring.HeadReport(report.ids, report.tokens, report.probe, previous_token=np.array([[0.9, 0.2]]),
                              first_token=np.zeros((1, 2)), current_token=np.zeros((1, 2)),
                              induction=np.zeros((1, 2)), ablation=np.zeros((1, 2)), loss=1.0,
                              initial={pattern: np.full((1, 2), 0.1) for pattern in scoring.PATTERNS})
    assert made.labels() == {(0, 0): ["previous-token"]}
    table = made.table()
    assert "previous-token" in table and len(table.splitlines()) == 5
    assert made.to_json()["labels"] == [{"layer": 0, "head": 0, "labels": ["previous-token"]}]


def test_calibration_draws_fresh_weights_from_its_own_seed_and_leaves_keras_random_state_alone(fluent_model):
    keras.utils.set_random_seed(5)
    expected = keras.ops.convert_to_numpy(keras.random.uniform((3,)))
    keras.utils.set_random_seed(5)
    first = scoring.initialised(fluent_model)
    assert np.array_equal(keras.ops.convert_to_numpy(keras.random.uniform((3,))), expected)
    second = scoring.initialised(fluent_model)
    for a, b in zip(first.weights, second.weights):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(a), keras.ops.convert_to_numpy(b))


def test_what_heads_cannot_score_is_refused_in_a_line(fluent_model, tiny_seq2seq):
    with pytest.raises(gptlite.InputError, match="at least 2 tokens"):
        gptlite.heads(fluent_model, "t")
    with pytest.raises(gptlite.ConfigError, match="head scores and patching read a GPT"):
        gptlite.heads(tiny_seq2seq, "12+3")
    with pytest.raises(gptlite.InputError, match="never saw"):
        gptlite.heads(fluent_model, "the Ω")
    short = gptlite.GPT(vocab_size=fluent_model.config.vocab_size, tokenizer=fluent_model.tokenizer, n_layer=1,
                        n_head=1, n_embd=8, block_size=4)
    short.build((None, 4))
    with pytest.raises(gptlite.InputError, match="context is 4 tokens"):
        gptlite.heads(short, "the cat")
