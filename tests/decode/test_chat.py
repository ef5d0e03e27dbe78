"""Chat: templates, conversations as training data and their loss mask, replies, the terminal chat."""

import dataclasses
import io
import json
import os
import pathlib
import pty
import re
import select
import signal
import subprocess
import sys
import time

import keras
import numpy as np
import pytest

import gptlite
from conftest import REPO
from gptlite.data import conversations
from gptlite.decode import chat
from gptlite.errors import InputError
from gptlite.text import templates
from gptlite.tasks import chat_sizing

# For what the chat's own code decides (sizing, reports, templates, files): the same on every backend, whose training
# on conversations test_a_chat_run_trains_on_a_conversations_file_and_keeps_its_template checks in every suite.
ONCE = pytest.mark.once("chat data, sizing and templates are the same on every backend")

# In the words of the test text, whose characters the tiny models know.
CONVERSATION = [{"role": "system", "content": "be a cat"}, {"role": "user", "content": "the cat"},
                {"role": "assistant", "content": "sat on a mat"}, {"role": "user", "content": "and the dog"},
                {"role": "assistant", "content": "ran"}]


@pytest.fixture(scope="module")
def chat_model(tiny_model):
    return gptlite.chat_ready(tiny_model)


def test_a_model_without_a_template_gets_the_default_one_and_its_markers_as_tokens(tiny_model, chat_model):
    tokenizer = chat_model.tokenizer
    assert tokenizer.chat_template == templates.DEFAULT_TEMPLATE
    assert chat_model.config.vocab_size == tiny_model.config.vocab_size + len(templates.TURN_MARKERS)
    ids = tokenizer.encode("<|user|>the<|end|>")
    assert len(ids) == 5 and tokenizer.decode(ids) == "<|user|>the<|end|>"
    assert tokenizer.character_count(ids) == 3  # the markers stand for no character of the text
    # The old rows are kept, and each new row is its own.
    old = tiny_model.embedding.token_embedding.embeddings.numpy()
    new = chat_model.embedding.token_embedding.embeddings.numpy()
    np.testing.assert_array_equal(new[:len(old)], old)
    assert len({tuple(row) for row in new[len(old):]}) == len(templates.TURN_MARKERS)
    assert gptlite.chat_ready(chat_model) is chat_model  # it has a template now


def test_a_grown_model_computes_what_it_did_on_text_without_markers(tokenizer):
    import keras

    # A BPE tokenizer and an untied output layer (GPT-2 ties it; Llama's do not): both grow.
    bpe = gptlite.BPETokenizer.train(["the cat sat on a mat and the dog ran to a big red hat"] * 20, 300)
    model = gptlite.GPT(vocab_size=bpe.vocabulary_size, n_layer=1, n_head=2, n_embd=16, block_size=16,
                        tie_weights=False, tokenizer=bpe)
    model.build((None, 16))
    grown = gptlite.chat_ready(model)
    assert grown.config.vocab_size == model.config.vocab_size + len(templates.TURN_MARKERS)
    ids = np.asarray([bpe.encode("the cat sat on a mat")], "int32")
    before = keras.ops.convert_to_numpy(model(ids))
    after = keras.ops.convert_to_numpy(grown(ids))
    np.testing.assert_allclose(after[..., :model.config.vocab_size], before, rtol=1e-5, atol=1e-6)
    assert grown.tokenizer.encode("<|assistant|>").tolist() == [model.config.vocab_size + 2]


def test_the_default_template_round_trips(chat_model):
    text = templates.render_for(chat_model.tokenizer, CONVERSATION)
    ids = chat_model.tokenizer.encode(text)
    assert templates.parse_default(chat_model.tokenizer.decode(ids)) == CONVERSATION


def test_the_tokenizer_and_its_template_survive_saving(chat_model, tmp_path):
    gptlite.save(chat_model, tmp_path / "chat.keras")
    loaded = gptlite.load(tmp_path / "chat.keras")
    assert loaded.tokenizer.chat_template == templates.DEFAULT_TEMPLATE
    assert loaded.tokenizer.added_tokens == chat_model.tokenizer.added_tokens
    assert templates.answer_prompt_ids(loaded.tokenizer, CONVERSATION[:2]) == \
        templates.answer_prompt_ids(chat_model.tokenizer, CONVERSATION[:2])


@ONCE
def test_rendering_matches_transformers_apply_chat_template(tmp_path):
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["<s>", "</s>", "<unk>", "the", "cat", "sat"]
    definition = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    definition.pre_tokenizer = pre_tokenizers.Whitespace()
    # A Llama-2-like template: the beginning token, a system message folded into the first user turn, the
    # end token after each answer, and a refusal of turns out of order.
    template = (
        "{{ bos_token }}{% for message in messages %}"
        "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) and message['role'] != 'system' %}"
        "{{ raise_exception('turns must alternate') }}{% endif %}"
        "{% if message['role'] == 'system' %}<<SYS>>\n{{ message['content'] | trim }}\n<</SYS>>\n"
        "{% elif message['role'] == 'user' %}[INST] {{ message['content'] }} [/INST]"
        "{% else %} {{ message['content'] }} {{ eos_token }}{% endif %}\n"
        "{% endfor %}"
    )
    hugging_face = transformers.PreTrainedTokenizerFast(tokenizer_object=definition, bos_token="<s>",
                                                        eos_token="</s>", unk_token="<unk>")
    hugging_face.chat_template = template
    ours = gptlite.PretrainedTokenizer(definition.to_str(), begin_token="<s>", end_token="</s>",
                                       chat_template=template)
    for messages in ([CONVERSATION[1], CONVERSATION[2]], [{"role": "user", "content": "the cat"}]):
        for opening in (False, True):
            expected = hugging_face.apply_chat_template(messages, tokenize=False, add_generation_prompt=opening)
            assert templates.render_for(ours, messages, add_generation_prompt=opening) == expected
    with pytest.raises(InputError, match="turns must alternate"):
        templates.render_for(ours, [CONVERSATION[1], CONVERSATION[1]])


def test_the_loss_counts_the_answers_tokens_alone(chat_model):
    import keras

    rows = conversations.pack(chat_model.tokenizer, [CONVERSATION], chat_model.config.block_size * 4)
    inputs, targets = conversations.targets(rows)
    trained = rows.trained[:, 1:]
    # The answers' tokens, their end markers among them, are the trained ones; nothing else is.
    answers = chat_model.tokenizer.decode(rows.ids[:, 1:][trained])
    assert answers == "sat on a mat<|end|>ran<|end|>"
    logits = keras.ops.convert_to_numpy(_windowed_logits(chat_model, inputs["token_ids"]))  # (1, T, V)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True, ignore_class=conversations.IGNORED)

    def value(targets):
        return float(keras.ops.convert_to_numpy(loss(targets, logits)))

    baseline = value(targets)
    log_softmax = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) \
        - logits.max(-1, keepdims=True)
    picked = np.take_along_axis(log_softmax, np.maximum(targets, 0)[..., None], -1)[..., 0]
    np.testing.assert_allclose(baseline, -picked[trained].mean(), rtol=1e-4)
    user_position = int(np.flatnonzero(~trained[0])[3])
    answer_position = int(np.flatnonzero(trained[0])[0])
    other = (int(rows.ids[0, answer_position + 1]) + 1) % chat_model.config.vocab_size
    changed = rows.ids.copy()
    changed[0, user_position + 1] = other  # a user's token as a target: not counted
    assert value(conversations.targets(dataclasses.replace(rows, ids=changed))[1]) == baseline
    changed = rows.ids.copy()
    changed[0, answer_position + 1] = other  # an answer's token: counted
    assert value(conversations.targets(dataclasses.replace(rows, ids=changed))[1]) != baseline


def _windowed_logits(model, inputs):
    """The model's logits over inputs longer than its context, a window at a time (the mask test packs one row
    of four contexts so that the whole conversation fits)."""
    import keras

    size = model.config.block_size
    parts = [model(inputs[:, start:start + size]) for start in range(0, inputs.shape[1], size)]
    return keras.ops.concatenate(parts, axis=1)


def test_long_conversations_are_cut_or_refused_with_a_count(chat_model):
    rows = conversations.pack(chat_model.tokenizer, [CONVERSATION, CONVERSATION[:3]], 16)
    assert rows.cut == 2 and rows.ids.shape == (2, 17)
    with pytest.raises(InputError, match="2 of 2 conversations are longer than the context of 16 tokens"):
        conversations.pack(chat_model.tokenizer, [CONVERSATION, CONVERSATION[:3]], 16, "refuse")
    short = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    packed = conversations.pack(chat_model.tokenizer, [short] * 5, 16)
    assert packed.cut == 0 and len(packed) == 3  # two of 6 tokens to a row of 17, whole
    # Each token's position in its own conversation; the padding after them counts as one more.
    np.testing.assert_array_equal(packed.positions[0], [*range(6), *range(6), *range(5)])


@pytest.mark.parametrize("line, message", [
    ("{not json", "line 2: not JSON"),
    ('{"text": "hi"}', 'line 2: expected an object with "messages"'),
    ('{"messages": [{"role": "robot", "content": "hi"}]}', "line 2: message 1 has role 'robot'"),
    ('{"messages": [{"role": "user", "content": "hi"}]}', "line 2: the conversation has no assistant message"),
    ('{"messages": [{"role": "user", "content": 3}, {"role": "assistant", "content": "a"}]}',
     "line 2: message 1 has no text"),
])
def test_a_malformed_conversation_is_refused_naming_its_file_and_line(tmp_path, line, message):
    path = tmp_path / "chats.jsonl"
    path.write_text(json.dumps({"messages": CONVERSATION}) + "\n" + line + "\n")
    with pytest.raises(InputError, match=f"{path}, {message}"):
        conversations.read_conversations(path)


def test_a_reply_ends_at_the_end_of_turn_and_a_conversation_keeps_to_the_context(chat_model):
    text = chat.reply(chat_model, CONVERSATION[:2], max_new_tokens=12, seed=1)
    assert templates.END_OF_TURN not in text and len(chat_model.tokenizer.encode(text)) <= 12
    conversation = chat.Conversation(chat_model, system="be a cat", sampling=gptlite.SamplingConfig(
        max_new_tokens=4, seed=2))
    for question in ("the cat sat on the mat", "and the dog ran", "and a red hat"):
        answer = "".join(conversation.ask(question))
        assert conversation.turns[-1] == {"role": "assistant", "content": answer}
    # The context (16 tokens) holds little: the oldest turns went, the last question and the system stayed.
    assert conversation.dropped >= 2 and conversation.messages[0]["role"] == "system"
    assert conversation.turns[-2]["content"] == "and a red hat"
    conversation.reset()
    assert conversation.messages == [{"role": "system", "content": "be a cat"}]


def test_a_model_without_a_template_cannot_chat(tiny_model, tmp_path, capsys):
    from gptlite.cli import main

    with pytest.raises(InputError, match="has no chat template"):
        chat.reply(tiny_model, CONVERSATION[:2])
    gptlite.save(tiny_model, tmp_path / "plain.keras")
    assert main(["chat", str(tmp_path / "plain.keras")]) == 2
    error = capsys.readouterr().err
    assert "has no chat template" in error and error.count("\n") == 1


@pytest.mark.slow
def test_a_chat_run_trains_on_a_conversations_file_and_keeps_its_template(tmp_path, text):
    lines = text.splitlines()
    path = tmp_path / "chats.jsonl"
    with open(path, "w") as file:
        for index in range(0, 40, 2):
            file.write(json.dumps({"messages": [{"role": "user", "content": lines[index][:12]},
                                                {"role": "assistant", "content": lines[index + 1][:12]}]}) + "\n")
    run = gptlite.train_on_text([path], tmp_path / "run", {"max_iters": 4, "eval_interval": 2, "eval_iters": 1},
                                preset="tiny", task="chat", verbose=0)
    saved = gptlite.load(tmp_path / "run" / "model.keras")
    assert saved.tokenizer.chat_template == templates.DEFAULT_TEMPLATE
    assert all(np.isfinite(row["val_loss"]) for row in run.history)
    with pytest.raises(InputError, match="longer than the context"):
        gptlite.train_on_text([path], tmp_path / "refused", {"block_size": 8}, preset="tiny", task="chat",
                              long_conversations="refuse", verbose=0)
    assert not (tmp_path / "refused").exists()


def test_the_sizing_counts_the_tokens_and_rows_that_packing_makes(chat_model):
    chats = [CONVERSATION[1:3], CONVERSATION, CONVERSATION[3:], CONVERSATION[:2]] * 5
    lengths = conversations.default_template_lengths(chats)
    assert lengths == [len(conversations.encode(chat_model.tokenizer, messages)[0]) for messages in chats]
    for block_size in (16, 64):
        rows = conversations.pack(chat_model.tokenizer, chats, block_size)
        assert len(rows) == chat_sizing.packed_rows(lengths, block_size)


@ONCE
def test_a_bpe_runs_sizing_counts_its_own_tokens():
    chats = [[{"role": "user", "content": f"what is {a} plus {b}?"}, {"role": "assistant", "content": f"it is {a + b}"}]
             for a in range(10, 40) for b in (3, 17)]
    tokenizer = gptlite.BPETokenizer.train([json.dumps(chats)], 400, digits_apart=True).with_chat_tokens(
        templates.TURN_MARKERS, templates.DEFAULT_TEMPLATE)
    lengths = conversations.default_template_lengths(chats, tokenizer)
    assert lengths == [len(conversations.encode(tokenizer, messages)[0]) for messages in chats]
    assert max(lengths) < min(conversations.default_template_lengths(chats))  # fewer than their characters
    assert len(conversations.pack(tokenizer, chats, 32)) == chat_sizing.packed_rows(lengths, 32)


@pytest.mark.slow
@ONCE
def test_a_chat_run_on_a_file_is_sized_from_it_and_reports_its_held_out_answers(tmp_path, text, capsys):
    from gptlite.cli.train import main

    lines = text.splitlines()
    path = tmp_path / "chats.jsonl"
    path.write_text("".join(json.dumps({"messages": [{"role": "user", "content": lines[index][:20]},
                                                     {"role": "assistant", "content": lines[index + 1][:6]}]}) + "\n"
                            for index in range(0, 80, 2)))
    small = ["--n-layer", "1", "--n-head", "2", "--n-kv-head", "1", "--n-embd", "16", "--batch-size", "4",
             "--max-iters", "4", "--eval-interval", "2", "--eval-iters", "1"]
    assert main([str(path), "--task", "chat", *small, "--out", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    # 36 of the 40 conversations train (a tenth is held out), each of at most 32 tokens: the shortest context. The
    # answers' words are in few of them: characters.
    assert "chat settings sized from 36 conversations: characters, since " in out
    assert "; context 64 (100% fit whole" in out and " steps of batch 4 by Muon (" in out
    # The line names what the flags changed of what it chose.
    given = re.search(r"a setting given overrides these \(given: (.*)\)\n", out).group(1).split(", ")
    assert {"n_layer 1", "n_embd 16", "batch_size 4", "max_iters 4", "eval_iters 1"} <= set(given)
    assert re.search(r"the final model answers \d+ of 4 held-out questions exactly \(\d+%, greedy\); a few:", out)
    assert f"talk with it: gptlite chat {tmp_path / 'run' / 'model.keras'}" in out
    history = (tmp_path / "run" / "history.csv").read_text()
    assert "exact_answers" in history.splitlines()[0]
    # Another file to validate on: its conversations are the held-out ones, and all of the first file trains.
    (tmp_path / "val.jsonl").write_text(path.read_text().split("\n", 3)[-1])
    assert main([str(path), "--task", "chat", "--preset", "tiny", "--max-iters", "2", "--eval-interval", "2",
                 "--eval-iters", "1", "--val-file", str(tmp_path / "val.jsonl"), "--out", str(tmp_path / "val")]) == 0
    out = capsys.readouterr().out
    assert "40 conversations" in out and "37 held out" in out and "of 37 held-out questions" in out


@pytest.mark.slow
@ONCE
def test_a_run_on_answers_in_repeated_words_reads_bpe_tokens_with_digits_apart_and_is_sized_by_them(tmp_path, capsys):
    from gptlite.cli.train import main

    path = tmp_path / "chats.jsonl"
    path.write_text("".join(json.dumps({"messages": [
        {"role": "user", "content": f"Please add {a} and {b} for me, thank you."},
        {"role": "assistant", "content": f"The sum of the two is {a + b}."}]}) + "\n" for a in range(10, 50)
        for b in (7, 8)))
    small = ["--n-layer", "1", "--n-head", "2", "--n-kv-head", "1", "--n-embd", "16", "--batch-size", "4",
             "--max-iters", "2", "--eval-interval", "2", "--eval-iters", "1"]
    assert main([str(path), "--task", "chat", *small, "--out", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if line.startswith("chat settings"))
    assert "byte-level BPE tokens with each digit apart, since 100% of the answers' words" in line
    # Each conversation is over 64 characters, and fewer BPE tokens: sized by the tokens, context 64.
    assert "; context 64 (100% fit whole" in line
    tokenizer = gptlite.load(tmp_path / "run" / "model.keras").tokenizer
    assert isinstance(tokenizer, gptlite.BPETokenizer)
    assert [piece for piece in tokenizer.pieces(tokenizer.encode(" 1234")) if piece.strip()] == list("1234")
    # The same run again into its folder is refused before a vocabulary is learned for it.
    assert main([str(path), "--task", "chat", *small, "--out", str(tmp_path / "run")]) != 0
    refused = capsys.readouterr()
    assert "already exists" in refused.err and "learning" not in refused.out
    # Named, a tokenizer stands: characters, sized by them.
    assert main([str(path), "--task", "chat", *small, "--tokenizer", "char", "--out", str(tmp_path / "char")]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("chat settings"))
    assert line.startswith("chat settings sized from 72 conversations: context 128 (")


@pytest.mark.slow
@ONCE
def test_a_saved_model_fine_tunes_on_conversations_with_lora_and_a_bad_file_touches_nothing(tmp_path, tiny_model,
                                                                                             capsys):
    gptlite.save(tiny_model, tmp_path / "base.keras")
    before = (tmp_path / "base.keras").read_bytes()
    path = tmp_path / "chats.jsonl"
    path.write_text(json.dumps({"messages": CONVERSATION[1:3]}) + "\n" + json.dumps({"messages": CONVERSATION[3:]})
                    + "\n")
    settings = {"max_iters": 2, "eval_interval": 2, "eval_iters": 1, "lora_rank": 2, "batch_size": 2}
    run = gptlite.train_on_text([path], tmp_path / "run", settings, init_from=tmp_path / "base.keras", task="chat")
    assert all(weight.name in ("lora_a", "lora_b") for weight in run.model.trainable_weights)
    # The new turn markers' rows would stay as made: the run says how to train them.
    assert "add embedding to lora_targets" in capsys.readouterr().out
    run = gptlite.train_on_text([path], tmp_path / "whole", {**settings, "lora_targets": "qkv,embedding"},
                                init_from=tmp_path / "base.keras", task="chat")
    assert "lora_targets" not in capsys.readouterr().out
    assert {id(weight) for weight in run.model.embedding.token_embedding.weights} <= {
        id(weight) for weight in run.model.trainable_weights}
    assert gptlite.load(tmp_path / "run" / "model.keras").tokenizer.chat_template == templates.DEFAULT_TEMPLATE
    (tmp_path / "bad.jsonl").write_text(json.dumps({"messages": CONVERSATION}) + "\n{oops\n")
    with pytest.raises(InputError, match="bad.jsonl, line 2"):
        gptlite.train_on_text([tmp_path / "bad.jsonl"], tmp_path / "run", init_from=tmp_path / "base.keras",
                              task="chat", overwrite=True, verbose=0)
    assert (tmp_path / "base.keras").read_bytes() == before  # the source is only read
    assert (tmp_path / "run" / "model.keras").exists()  # the earlier run is left as it was


# Runs a command, as a terminal does, as the leader of a session whose controlling terminal is the pty on its standard
# input, so that Ctrl-C written to the pty reaches it as SIGINT; and with SIGINT's default action even where the
# tests run with SIGINT ignored (as a background job they do).
# Python's fault handler is on in it: a chat that hangs is sent SIGABRT, and writes every thread's stack.
IN_A_TERMINAL = ("import os, signal, sys; os.close(os.open(os.ttyname(0), os.O_RDWR)); "
                 "signal.signal(signal.SIGINT, signal.SIG_DFL); "
                 "os.execv(sys.executable, [sys.executable, '-X', 'faulthandler', *sys.argv[1:]])")


def process_state(pid):
    """What a process is doing, from /proc: its state letter, CPU seconds and threads (for a test's failure)."""
    try:
        fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError as error:
        return f"no state ({error})"
    ticks = os.sysconf("SC_CLK_TCK")
    return f"state {fields[0]}, {(int(fields[11]) + int(fields[12])) / ticks:.1f} CPU s, {fields[17]} threads"


@pytest.mark.slow
def test_the_terminal_chat_streams_answers_resets_and_survives_ctrl_c(chat_model, tmp_path):
    path = tmp_path / "chat.keras"
    gptlite.save(chat_model, path)
    leader, follower = pty.openpty()
    process = subprocess.Popen([sys.executable, "-c", IN_A_TERMINAL, "-m", "gptlite", "chat", str(path),
                                "--max-new-tokens", "500", "--seed", "1", "--system", "be a cat"],
                               stdin=follower, stdout=follower, stderr=follower, cwd=REPO, start_new_session=True,
                               env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    os.close(follower)
    seen = b""

    def read_until(marker, after=b"", timeout=120):
        """Read until `marker` shows, after the first `after` where one is given; what came after the marker is kept
        for the next call (a short answer and the prompt after it can come in the same read as "model> ")."""
        nonlocal seen
        deadline = time.monotonic() + timeout
        while after not in seen or marker not in seen[seen.index(after) + len(after):]:
            if time.monotonic() > deadline:
                state = process_state(process.pid)
                process.send_signal(signal.SIGABRT)  # its threads' stacks, to tell where it waits
                stacks = b""
                while select.select([leader], [], [], 5)[0]:
                    try:
                        stacks += os.read(leader, 65536)
                    except OSError:
                        break
                raise AssertionError(f"waited for {marker!r}; got {seen[-500:]!r}; the chat: {state}; its stacks:\n"
                                     f"{stacks.decode(errors='replace')[:6000]}")
            if select.select([leader], [], [], 0.5)[0]:
                try:
                    seen += os.read(leader, 4096)
                except OSError:
                    break
        start = seen.index(after) + len(after)
        seen = seen[seen.index(marker, start) + len(marker):]

    try:
        read_until(b"you> ")
        os.write(leader, b"the cat\n")
        read_until(b"model> ")
        read_until(b"you> ")  # the answer came and the prompt is back
        os.write(leader, b"/reset\n")
        read_until(b"(a new conversation)")
        os.write(leader, b"a big red hat\n")
        read_until(b"model> ")
        os.write(leader, b"\x03")  # Ctrl-C while it answers, or just after: the chat goes on
        # The terminal echoes ^C after sending SIGINT, so a prompt written after the echo comes once the chat has
        # had the signal: the next line typed is not taken for one typed before Ctrl-C, which Ctrl-C clears.
        read_until(b"you> ", after=b"^C")
        assert process.poll() is None, seen
        os.write(leader, b"the dog\n")
        read_until(b"model> ")
        read_until(b"you> ")
        os.write(leader, b"\x04")  # Ctrl-D leaves
        assert process.wait(timeout=60) == 0
    finally:
        process.kill()
        os.close(leader)


@pytest.fixture
def sigint_as_in_a_terminal():
    """SIGINT raising KeyboardInterrupt, as Python sets it up in a terminal (a background job's tests ignore it)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def chat_in_process(model_path, lines, monkeypatch, interrupts_at_first_piece):
    """Run `gptlite chat` here on `lines` of input, sending this process `interrupts_at_first_piece` SIGINTs as the
    first piece of an answer shows, as a user's Ctrl-C; what it printed after each prompt but the last."""
    from gptlite.cli import chat as terminal_chat

    written = []
    answering = [False]

    def print_piece(text):
        written.append(text)
        if text == terminal_chat.ANSWER:
            answering[0] = True
        elif answering[0] and text:
            answering[0] = False
            for _ in range(interrupts_at_first_piece.pop(0) if interrupts_at_first_piece else 0):
                os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(terminal_chat, "print_piece", print_piece)
    monkeypatch.setattr(sys, "stdin", io.StringIO("".join(line + "\n" for line in lines)))
    args = terminal_chat.make_parser("gptlite-chat").parse_args([str(model_path), "--seed", "3"])
    terminal_chat.run(args)
    return "".join(written).split(terminal_chat.PROMPT)[1:-1]


def test_ctrl_c_stops_an_answer_at_its_next_piece_and_the_conversation_goes_on(chat_model, tmp_path, monkeypatch,
                                                                               capsys, sigint_as_in_a_terminal):
    gptlite.save(chat_model, tmp_path / "chat.keras")
    questions = ["the cat", "a big red hat", "the dog ran", "sat on a mat", "and the sun"]
    answers = chat_in_process(tmp_path / "chat.keras", questions, monkeypatch, [1])
    stopped = [answer for answer in answers if answer.endswith(" (stopped)")]
    # The first answer that writes anything stops after its first piece (an answer may end before it writes any).
    assert len(stopped) == 1 and len(stopped[0]) > len("model>  (stopped)"), answers
    assert len(answers) == len(questions) and all(answer.startswith("model> ") for answer in answers)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # Ctrl-C at the prompt is as before


def test_a_second_ctrl_c_during_an_answer_leaves_the_chat(chat_model, tmp_path, monkeypatch, capsys,
                                                           sigint_as_in_a_terminal):
    gptlite.save(chat_model, tmp_path / "chat.keras")
    with pytest.raises(KeyboardInterrupt):
        chat_in_process(tmp_path / "chat.keras", ["the cat", "a big red hat", "the dog ran", "sat on a mat"],
                        monkeypatch, [2])
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_message_the_model_cannot_read_is_refused_and_the_chat_goes_on_until_bye(chat_model, tmp_path, monkeypatch,
                                                                                     capsys):
    conversation = chat.Conversation(chat_model, sampling=gptlite.SamplingConfig(max_new_tokens=3, seed=1))
    "".join(conversation.ask("the cat"))
    history = [dict(turn) for turn in conversation.turns]
    with pytest.raises(InputError, match="characters the model's vocabulary lacks"):
        conversation.ask("the cat~")
    assert conversation.turns == history  # the refused message left nothing behind
    gptlite.save(chat_model, tmp_path / "chat.keras")
    answers = chat_in_process(tmp_path / "chat.keras", ["the cat~", "the dog", "/bye", "sat on a mat"], monkeypatch,
                              [])
    # The unreadable message got no answer but a line saying why; the next got one; /bye left before the last.
    assert len(answers) == 2 and answers[0] == "" and answers[1].startswith("model> ")
    assert "vocabulary lacks" in capsys.readouterr().err


def test_help_lists_the_chats_commands_and_an_unknown_command_is_named_not_sent(chat_model, tmp_path, monkeypatch,
                                                                                 capsys):
    gptlite.save(chat_model, tmp_path / "chat.keras")
    answers = chat_in_process(tmp_path / "chat.keras", ["/help", "/nosuch", "the dog", "/exit", "the cat"],
                              monkeypatch, [])
    # Neither command went to the model (whose vocabulary lacks '/'): no answer, no refusal; the message did.
    assert len(answers) == 3 and answers[0] == answers[1] == "" and answers[2].startswith("model> ")
    shown = capsys.readouterr()
    assert all(name in shown.out for name in ("/help", "/reset", "/bye")), shown.out
    assert "no command /nosuch; /help lists the commands" in shown.err and "vocabulary" not in shown.err
