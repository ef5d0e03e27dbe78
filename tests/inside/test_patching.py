"""gptlite.patching: the share of a logit difference a copied activation restores, against runs edited by hand, its two
ends, and the refusals."""

import keras
import numpy as np
import pytest

import gptlite
from gptlite.model.hooks import Hooks


def _difference(logits, answer, wrong):
    last = np.asarray(keras.ops.convert_to_numpy(logits), np.float64)[0, -1]
    return last[answer] - last[wrong]


def test_a_patched_heads_share_is_the_corrupted_run_with_that_heads_clean_values_by_hand(fluent_model):
    clean, corrupted = "the cat sat", "the dog sat"
    answer, wrong = " ", "a"
    found = gptlite.patching(fluent_model, clean, corrupted, answer, wrong)
    tokenizer = fluent_model.tokenizer
    ids = {text: tokenizer.encode(text)[None].astype("int32") for text in (clean, corrupted)}
    answer_id, wrong_id = int(tokenizer.encode(answer)[0]), int(tokenizer.encode(wrong)[0])
    assert (found.answer, found.wrong) == (answer_id, wrong_id) and found.tokens == list(corrupted)
    kept = Hooks(keep=True)
    clean_difference = _difference(fluent_model(ids[clean], hooks=kept), answer_id, wrong_id)
    corrupted_difference = _difference(fluent_model(ids[corrupted]), answer_id, wrong_id)
    assert found.clean_difference == pytest.approx(clean_difference, abs=1e-4)
    assert found.corrupted_difference == pytest.approx(corrupted_difference, abs=1e-4)
    layer, head = 1, 0

    def clean_head(values):  # head 0's values from the clean run, the others the corrupted run's own
        clean_values = kept.kept[f"layer_{layer}.heads"]
        return keras.ops.concatenate([clean_values[:, :1], values[:, 1:]], axis=1)

    patched = _difference(fluent_model(ids[corrupted], hooks=Hooks(edits={f"layer_{layer}.heads": clean_head})),
                          answer_id, wrong_id)
    expected = (patched - corrupted_difference) / (clean_difference - corrupted_difference)
    assert found.heads[layer, head] == pytest.approx(expected, abs=1e-3 * max(1, abs(expected)))


def test_copying_everything_restores_everything_and_copying_what_agrees_restores_nothing(fluent_model):
    found = gptlite.patching(fluent_model, "the cat sat", "the cot sat", " ", "a")
    # The texts differ at position 5 alone: the first block's input there carries all of the difference, and
    # where they agree it carries none.
    assert found.residual.shape == (2, 11)
    assert found.residual[0, 5] == pytest.approx(1, abs=1e-3)
    assert np.abs(np.delete(found.residual[0], 5)).max() < 1e-3
    assert found.to_json()["residual"][0][5] == pytest.approx(1, abs=1e-3)


@pytest.mark.parametrize("clean,corrupted,answer,message", [
    ("the cat sat", "the cat s", " ", "as many tokens long.*11 and 9"),
    ("the cat sat", "the dog sat", "ab", "is 2 tokens"),
    ("the cat sat", "the dog sat", "Ω", "characters the vocabulary lacks"),
    ("the cat sat", "the dog sat", 999, "there is no token 999"),
    ("the cat sat", "the cat sat", " ", "nothing for a patch to restore"),
    ("the cat sat on a mat", "the dog sat on a mat", " ", "at most 16 tokens")])
def test_what_patching_cannot_do_is_refused_in_a_line(fluent_model, clean, corrupted, answer, message):
    with pytest.raises(gptlite.InputError, match=message):
        gptlite.patching(fluent_model, clean, corrupted, answer, "a")


def test_a_seq2seqs_heads_are_not_patched(tiny_seq2seq):
    with pytest.raises(gptlite.ConfigError, match="head scores and patching read a GPT"):
        gptlite.patching(tiny_seq2seq, "12", "13", "1", "2")
