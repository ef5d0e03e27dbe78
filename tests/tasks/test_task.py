import dataclasses

import pytest

import gptlite
from gptlite.data import conversations, pairs
from gptlite.tasks import task as tasks
from gptlite.tasks.chat import Chat
from gptlite.tasks.language import LanguageModel
from gptlite.tasks.pairs import Pairs

pytestmark = pytest.mark.once("which task a run or a model is: plain Python over the model's own answers")


def test_a_runs_task_follows_its_task_and_synthetic_settings():
    assert type(tasks.named()) is LanguageModel and type(tasks.named("lm")) is LanguageModel
    assert type(tasks.named("seq2seq")) is Pairs and type(tasks.named(synthetic="addition")) is Pairs
    assert type(tasks.named("chat")) is Chat and type(tasks.named(synthetic="recall")) is Chat
    for task, synthetic, message in (("poems", None, "task must be one of lm, seq2seq, chat"),
                                     ("lm", "addition", "trains a seq2seq model"),
                                     ("seq2seq", "arithmetic", "trains a chat model"),
                                     (None, "juggling", "synthetic must be one of")):
        with pytest.raises(gptlite.ConfigError, match=message):
            tasks.named(task, synthetic)


def test_a_models_task_is_what_it_does(tiny_model, tiny_seq2seq):
    chat_model = gptlite.chat_ready(tiny_model)
    assert [type(tasks.of_model(model)) for model in (tiny_model, chat_model, tiny_seq2seq)] == [
        LanguageModel, Chat, Pairs]
    language, chat, seq2seq = (tasks.of_model(model) for model in (tiny_model, chat_model, tiny_seq2seq))
    # What each reads of a command's text, refusing the other kind's.
    assert language.given_text(prompt="the") == chat.given_text(prompt="the") == "the"
    assert seq2seq.given_text(source="abc") == "abc" and language.given_text() is None
    with pytest.raises(gptlite.InputError, match="m.keras is a seq2seq model: give it `source` TEXT, not `prompt`"):
        seq2seq.given_text(prompt="the", model_name="m.keras")
    with pytest.raises(gptlite.InputError, match="is a language model: give it `prompt` TEXT, not `source`"):
        language.given_text(source="abc")
    # What a request to the server may hold for each.
    fields = ("messages", "echo", "logprobs", "attention")
    assert [chat.request_refusal(field) for field in fields] == [None] * 4
    assert [language.request_refusal(field) is None for field in fields] == [False, True, True, True]
    assert [seq2seq.request_refusal(field) is None for field in fields] == [False, False, False, False]
    assert language.cuts_long_texts("left") and not language.cuts_long_texts("none")
    assert not seq2seq.cuts_long_texts("left")


def test_a_run_resumes_only_as_the_kind_of_model_it_trained():
    tasks.named("lm").check_checkpoint({"model_class": "GPT"}, "runs/a")
    tasks.named("chat").check_checkpoint({}, "runs/a")  # a checkpoint from before the model's class was written
    with pytest.raises(gptlite.ConfigError, match="the run in runs/a trains a seq2seq model; resume it with "
                                                  "`task='seq2seq'`"):
        tasks.named("lm").check_checkpoint({"model_class": "Seq2Seq"}, "runs/a")
    with pytest.raises(gptlite.ConfigError, match="trains a language model; resume it with `task='lm'`"):
        tasks.named("seq2seq").check_checkpoint({"model_class": "GPT"}, "runs/a")



def test_a_checkpoint_names_its_task_and_a_run_resumes_only_as_that_task():
    tasks.named("chat").check_checkpoint({"task": "chat"}, "runs/a")
    with pytest.raises(gptlite.ConfigError, match="^the run in runs/a trains a chat model; resume it with "
                                                  "`task='chat'`$"):
        tasks.named("lm").check_checkpoint({"task": "chat", "model_class": "GPT"}, "runs/a")
    with pytest.raises(gptlite.InputError, match=r"of a task this version does not know \(.poetry.\)"):
        tasks.named("lm").check_checkpoint({"task": "poetry"}, "runs/a")


def test_each_task_batches_its_data_and_says_what_the_loss_leaves_out(tiny_model, tiny_seq2seq, seq2seq_tokenizer):
    rows = conversations.pack(gptlite.chat_ready(tiny_model).tokenizer,
                              [[{"role": "user", "content": "the cat"}, {"role": "assistant", "content": "sat"}]], 15)
    pair_set = pairs.encode(pairs.Pairs(["ab", "ba"], ["ba", "ab"]), seq2seq_tokenizer, 8)
    assert LanguageModel().ignored_class(tiny_model) is None
    assert Chat().ignored_class(tiny_model) == conversations.IGNORED
    assert Pairs().ignored_class(tiny_seq2seq) == tiny_seq2seq.PAD_ID
    inputs, targets = Pairs().batches(pair_set, 8, 2, 1, seed=0)[0]
    assert set(inputs) == {"source_ids", "target_ids"} and targets.shape == (2, 8)
    inputs, targets = Chat().batches(rows, 15, 1, 1, seed=0)[0]
    assert targets.shape == (1, 15) and all(part.shape[0] == 1 for part in inputs.values())


def test_a_seq2seq_servers_rows_read_their_sources_and_write_within_the_context(seq2seq_tokenizer):
    task = Pairs()
    rows_ids, sources, lengths = task.decoding_rows(seq2seq_tokenizer, 8, ["abc", "d"])
    assert rows_ids == [[seq2seq_tokenizer.start_token_id]] * 2 and lengths == [3, 1]
    assert sources.shape == (2, 8) and list(sources[1]) == [*seq2seq_tokenizer.encode("d"), *[0] * 7]
    with pytest.raises(gptlite.InputError, match="reads sources of up to 8"):
        task.decoding_rows(seq2seq_tokenizer, 8, ["abcdeabcde"])
    assert task.bounded(gptlite.SamplingConfig(max_new_tokens=50), 8).max_new_tokens == 7
    assert LanguageModel().bounded(gptlite.SamplingConfig(max_new_tokens=50), 8).max_new_tokens == 50
    assert dataclasses.is_dataclass(tasks.Sizing({"block_size": 8}))


def test_a_task_describes_a_models_blocks_post_norm_or_not(tokenizer, seq2seq_tokenizer):
    shape = dict(vocab_size=None, n_layer=1, n_head=2, n_embd=8, block_size=8)  # the tokenizer's vocabulary
    for where, norm_words in (("pre", "learned positions, LayerNorm, GELU"),
                              ("post", "learned positions, post-norm LayerNorm, GELU")):
        model = gptlite.GPT(tokenizer=tokenizer, norm_position=where, **shape)
        model.build((None, 8))
        assert norm_words in tasks.of_model(model).describe(model)
        seq2seq = gptlite.Seq2Seq(tokenizer=seq2seq_tokenizer, norm_position=where, **shape)
        seq2seq.build()
        assert ("post-norm layers" in tasks.of_model(seq2seq).describe(seq2seq)) == (where == "post")


def _poems_module():
    """A module that only this test imports, holding a new kind of run: a language model's, under its own name."""
    import types

    class Poems(LanguageModel):
        """A GPT on poems."""

        name = "poems"
        called = "a model of poems"

        def owns(self, model):
            return False  # its models continue text as any GPT does: `lm` owns them

    module = types.ModuleType("gptlite.tasks.poems_for_a_test")
    module.Poems = Poems
    return module


@pytest.mark.slow
def test_a_task_added_as_one_class_and_one_registry_line_is_offered_trained_and_resumed_as_itself(tmp_path,
                                                                                                    monkeypatch):
    import sys

    from gptlite.cli import train
    from gptlite.tasks import Declared, TASKS
    from gptlite.training.checkpoints import read_checkpoint

    monkeypatch.setitem(sys.modules, "gptlite.tasks.poems_for_a_test", _poems_module())
    monkeypatch.setitem(TASKS, "poems", Declared("poems_for_a_test", "Poems", "a GPT on poems"))
    parser = train.make_parser("gptlite-train")
    assert "poems" in next(action.choices for action in parser._actions if action.dest == "task")
    (tmp_path / "poem.txt").write_text("the moon is high, the sea is wide; the night is long. " * 40)
    gptlite.train_on_text([tmp_path / "poem.txt"], tmp_path / "run", {"max_iters": 2, "eval_interval": 2},
                          preset="tiny", task="poems", verbose=0)
    assert read_checkpoint(tmp_path / "run")["task"] == "poems"
    with pytest.raises(gptlite.ConfigError, match="trains a model of poems; resume it with `task='poems'`"):
        gptlite.train_on_text([tmp_path / "poem.txt"], tmp_path / "run", {"max_iters": 4}, resume=True, verbose=0)
    gptlite.train_on_text([tmp_path / "poem.txt"], tmp_path / "run", {"max_iters": 4}, task="poems", resume=True,
                          verbose=0)
    assert read_checkpoint(tmp_path / "run")["step"] == 4
    assert type(tasks.of_model(gptlite.load(tmp_path / "run" / "model.keras"))) is LanguageModel
