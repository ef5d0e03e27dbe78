"""`evaluate` and `gptlite eval`: a model's loss, perplexity and bits per character and byte on any text."""

import json
import math

import keras
import numpy as np
import pytest

import gptlite
from gptlite.data import lm
from conftest import make_text


def _brute_force_nats(model, ids):
    """The summed loss of tokens 1.. of `ids`, each from the context the strided windows give it.

    Each token's context goes in a row of its own, right-padded: attention is
    causal, so the padding after it changes nothing.
    """
    size = model.config.block_size
    stride = size - size // 2
    rows = np.zeros((len(ids) - 1, size), "int32")
    last = np.zeros(len(ids) - 1, int)
    for row, target in enumerate(range(1, len(ids))):
        start = max(0, math.ceil((target - size) / stride)) * stride
        assert target - start >= min(target, size - stride + 1)  # at least half a window of context
        rows[row, :target - start] = ids[start:target]
        last[row] = target - start - 1
    logits = keras.ops.convert_to_numpy(model(rows))[np.arange(len(rows)), last]
    losses = keras.ops.sparse_categorical_crossentropy(np.asarray(ids[1:]), logits, from_logits=True)
    return float(np.sum(keras.ops.convert_to_numpy(losses).astype(np.float64)))


def test_every_token_is_scored_once_from_at_least_half_a_window(tmp_path, tiny_model):
    text = make_text(40, seed=3)  # about 150 characters: ten windows of 16
    (tmp_path / "a.txt").write_text(text)
    result = gptlite.evaluate(tiny_model, [tmp_path / "a.txt"])
    score = result.sources[0]
    # A char tokenizer has no end token: the first character is context only.
    assert (score.tokens, score.characters, score.bytes) == (len(text) - 1,) * 3
    np.testing.assert_allclose(score.nats, _brute_force_nats(tiny_model, tiny_model.tokenizer.encode(text)),
                               rtol=1e-4)
    assert score.loss == pytest.approx(score.nats / score.tokens)
    assert score.perplexity == pytest.approx(math.exp(score.loss))
    assert score.bits_per_character == pytest.approx(score.loss / math.log(2))  # one ASCII byte per token
    assert score.bits_per_byte == pytest.approx(score.bits_per_character)


def test_text_read_in_many_pieces_scores_as_in_one(tmp_path, tiny_model, monkeypatch):
    (tmp_path / "a.txt").write_text(make_text(200, seed=4))
    whole = gptlite.evaluate(tiny_model, [tmp_path / "a.txt"]).total
    monkeypatch.setattr(lm, "PIECE_BYTES", 37)
    pieces = gptlite.evaluate(tiny_model, [tmp_path / "a.txt"]).total
    assert pieces.tokens == whole.tokens
    np.testing.assert_allclose(pieces.nats, whole.nats, rtol=1e-5)


def test_a_bpe_model_predicts_every_token_after_its_end_token(tmp_path):
    text = "naïve café — ünïcode text, " * 20
    tokenizer = gptlite.BPETokenizer.train([text], 300)
    keras.utils.set_random_seed(0)
    model = gptlite.GPT(vocab_size=tokenizer.vocabulary_size, n_layer=1, n_head=2, n_embd=16, block_size=16,
                        tokenizer=tokenizer)
    (tmp_path / "a.txt").write_text(text)
    score = gptlite.evaluate(model, tmp_path / "a.txt").sources[0]
    assert score.tokens == len(tokenizer.encode(text))
    assert (score.characters, score.bytes) == (len(text), len(text.encode("utf-8")))
    assert score.bits_per_byte < score.bits_per_character  # several bytes to some characters
    ids = [tokenizer.end_token_id, *tokenizer.encode(text)]
    np.testing.assert_allclose(score.nats, _brute_force_nats(model, ids), rtol=1e-4)


def test_several_files_give_a_score_each_and_a_total(tmp_path, tiny_model):
    for name, seed in (("a.txt", 1), ("b.txt", 2)):
        (tmp_path / name).write_text(make_text(100, seed=seed))
    result = gptlite.evaluate(tiny_model, [tmp_path / "a.txt", tmp_path / "b.txt"])
    assert [score.name for score in result.sources] == [str(tmp_path / "a.txt"), str(tmp_path / "b.txt")]
    assert result.total.tokens == sum(score.tokens for score in result.sources)
    assert result.total.nats == pytest.approx(sum(score.nats for score in result.sources))
    lowest, highest = sorted(score.loss for score in result.sources)
    assert lowest <= result.total.loss <= highest


def test_the_eval_command_prints_a_table_or_json_and_refuses_bad_input(tmp_path, capsys, tiny_model):
    from gptlite.cli import main

    gptlite.save(tiny_model, tmp_path / "model.keras")
    (tmp_path / "a.txt").write_text(make_text(100, seed=5))
    assert main(["eval", str(tmp_path / "model.keras"), str(tmp_path / "a.txt"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    direct = gptlite.evaluate(tiny_model, [tmp_path / "a.txt"]).total
    assert report["total"]["tokens"] == direct.tokens
    assert report["total"]["bits_per_character"] == pytest.approx(direct.bits_per_character, rel=1e-5)
    assert main(["eval", str(tmp_path / "model.keras"), str(tmp_path / "a.txt")]) == 0
    assert "bits/char" in capsys.readouterr().out

    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "odd.txt").write_text("the cat sät")
    (tmp_path / "not_a_model.keras").write_text("text")
    (tmp_path / "binary.txt").write_bytes(bytes(range(256)) * 4)
    for args, message in [
        ([str(tmp_path / "model.keras"), str(tmp_path / "binary.txt")], "binary.txt"),
        ([str(tmp_path / "model.keras"), str(tmp_path / "empty.txt")], "too little text"),
        ([str(tmp_path / "model.keras"), str(tmp_path / "odd.txt")], "'ä'"),
        ([str(tmp_path / "not_a_model.keras"), str(tmp_path / "a.txt")], "not a .keras model file"),
        ([str(tmp_path / "model.keras"), str(tmp_path / "missing.txt")], "no such file"),
    ]:
        assert main(["eval", *args]) == 2
        error = capsys.readouterr().err
        assert message in error and error.count("\n") == 1
    assert main(["eval", str(tmp_path / "model.keras"), str(tmp_path / "odd.txt"), "--unknown", "replace"]) == 0


@pytest.mark.slow
def test_a_seq2seq_model_is_scored_on_pairs_by_exact_match_and_loss_per_target_token(tmp_path, reverser, capsys):
    from conftest import reversal_pairs
    from gptlite.cli import main
    from gptlite.data import pairs
    from gptlite.decode import generation

    held_out = reversal_pairs(70, seed=9)  # a batch of 64 and one of 6
    (tmp_path / "pairs.tsv").write_text("".join(f"{s}\t{t}\n" for s, t in zip(held_out.sources, held_out.targets)))
    score = gptlite.evaluate(reverser, tmp_path / "pairs.tsv").total

    assert score.pairs == 70
    decoded = generation.generate_target(reverser, held_out.sources, temperature=0.0)
    assert score.exact == sum(got == want for got, want in zip(decoded, held_out.targets)) > 0
    encoded = pairs.encode(held_out, reverser.tokenizer, reverser.config.block_size)
    logits = reverser({"source_ids": encoded.source_ids, "target_ids": encoded.target_ids[:, :-1]})
    losses = keras.ops.convert_to_numpy(keras.ops.sparse_categorical_crossentropy(
        encoded.target_ids[:, 1:], logits, from_logits=True)).astype(np.float64)
    predicted = encoded.target_ids[:, 1:] != reverser.tokenizer.pad_token_id
    assert score.tokens == predicted.sum() == sum(len(t) + 1 for t in held_out.targets)
    assert score.loss == pytest.approx(losses[predicted].mean(), rel=1e-5)
    assert score.bits_per_character == pytest.approx(losses[predicted].sum() / math.log(2) /
                                                     sum(len(t) for t in held_out.targets), rel=1e-5)

    gptlite.save(reverser, tmp_path / "reverser.keras")
    assert main(["eval", str(tmp_path / "reverser.keras"), str(tmp_path / "pairs.tsv"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)["total"]
    assert report["exact_match"] == score.exact_match and report["tokens"] == score.tokens
    (tmp_path / "long.tsv").write_text("ab\tba\nabcdeabcde\tedcbaedcba\n")
    (tmp_path / "tabless.tsv").write_text("ab ba\n")
    for file, message in [("long.tsv", "long.tsv, line 2: the source is 10 tokens long"),
                          ("tabless.tsv", "tabless.tsv, line 1: expected source<TAB>target")]:
        assert main(["eval", str(tmp_path / "reverser.keras"), str(tmp_path / file)]) == 2
        error = capsys.readouterr().err
        assert message in error and error.count("\n") == 1


@pytest.mark.slow
def test_a_chat_model_is_scored_on_its_answers_and_their_exactness(tmp_path, tiny_model, capsys, monkeypatch):
    from gptlite.cli import main
    from gptlite.data import conversations
    from gptlite.decode import chat
    from gptlite.evaluation import scores

    model = gptlite.chat_ready(tiny_model)
    chats = [[{"role": "user", "content": "the cat"}, {"role": "assistant", "content": "sat"}],
             [{"role": "user", "content": "a"}, {"role": "assistant", "content": "ran"},
              {"role": "user", "content": "to"}, {"role": "assistant", "content": "mat"}]]  # 17 tokens: the context
    path = tmp_path / "chats.jsonl"
    path.write_text("".join(json.dumps({"messages": messages}) + "\n" for messages in chats))
    asked = []

    def answers(model, questions, sampling):  # the first answer right, the second wrong
        asked.extend(questions)
        return [" sat ", "a hat"]

    monkeypatch.setattr(chat, "answers", answers)
    score = gptlite.evaluate(model, [path]).total
    assert isinstance(score, scores.ChatScore) and score.conversations == 2 and score.exact == 1
    assert asked == [chats[0][:1], chats[1][:3]]  # each conversation up to its last answer
    rows = conversations.pack(model.tokenizer, chats, model.config.block_size)
    assert score.tokens == int(rows.trained[:, 1:].sum())  # the answers' tokens, their end markers among them
    assert score.characters == len("sat") + len("ran") + len("mat") and math.isfinite(score.loss)
    monkeypatch.undo()
    gptlite.save(model, tmp_path / "chat.keras")
    assert main(["eval", str(tmp_path / "chat.keras"), str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["total"]["conversations"] == 2
    assert main(["eval", str(tmp_path / "chat.keras")]) == 2
    assert "give at least one file to evaluate on, or --synthetic" in capsys.readouterr().err
