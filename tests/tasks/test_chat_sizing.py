import pytest

import gptlite
from gptlite.data import conversations
from gptlite.tasks import chat_sizing
from gptlite.tasks.chat_sizing import chat_settings

pytestmark = pytest.mark.once("chat sizing is plain Python")


def test_a_chat_run_is_sized_from_its_conversations():
    # A small file of short conversations: the shortest context, the fewest steps.
    short, line = chat_settings([30] * 500)
    assert short == {"optimizer": "muon", "batch_size": chat_sizing.CHAT_BATCH_SIZE, "block_size": 64,
                     "max_iters": chat_sizing.CHAT_MIN_STEPS, "eval_interval": 100, "checkpoint_interval": 100,
                     "eval_iters": 80}
    assert "context 64 (100% fit whole" in line and "1,000 steps of 8 rows" in line
    # Longer conversations: the shortest context that holds 99% of them whole; one longer than any is cut.
    assert chat_settings([100] * 990 + [2000] * 10)[0]["block_size"] == 128
    assert chat_settings([100] * 980 + [2000] * 20)[0]["block_size"] == 256
    assert [chat_settings([length] * 100)[0]["block_size"] for length in (129, 130, 161, 162, 193, 194)] == \
        [128, 160, 160, 192, 192, 256]
    long, line = chat_settings([400] * 100)
    assert long["block_size"] == 256 and "0% fit whole" in line
    # Steps: twenty passes over the packed rows (conversations of 30 tokens fill a 65-token row 2 at a time),
    # rounded up to a hundred...
    middle, line = chat_settings([30] * 4_000)
    assert chat_sizing.packed_rows([30] * 4_000, 64) == 2_000 and chat_sizing.CHAT_EPOCHS == 20
    assert middle["max_iters"] == 5_000 and "5,000 steps of 8 rows (20.0 passes over 2,000 packed rows)" in line
    # ... up to about 14 minutes' worth of tokens on 2 cores, evaluated and saved about ten times a run; a context
    # under 128 gets the steps of 128, whose steps take nearly as long.
    large, line = chat_settings([60] * 20_000)
    assert large["max_iters"] == chat_sizing.CHAT_MAX_TOKENS // (8 * 128) and "about 14 minutes on 2 cores" in line
    assert large["eval_interval"] == large["checkpoint_interval"] == large["max_iters"] // 1000 * 100
    # A longer context's token takes longer (its attention grows with it): fewer of them fit the same time.
    steps = {length: chat_settings([length] * 20_000)[0]["max_iters"] for length in (100, 150, 250)}
    assert steps[100] == chat_sizing.CHAT_MAX_TOKENS // (8 * 128)
    assert steps[100] * 128 > steps[150] * 160 > steps[250] * 256 > steps[100] * 128 / 2
    with pytest.raises(gptlite.ConfigError, match="no conversations"):
        chat_settings([])


def test_the_tokenizer_a_run_from_scratch_reads_with_follows_the_words_its_answers_repeat():
    def chats(answer, count=30):
        return [[{"role": "user", "content": f"what is {n} and {n + 3}?"}, {"role": "assistant", "content": answer(n)}]
                for n in range(count)]

    sentences = chats(lambda n: f"The sum is {2 * n + 3}.")
    made_up = chats(lambda n: "".join("abcdefgh"[(n * 7 + i * 3) % 8] for i in range(5)) + "!")
    numbers = chats(lambda n: str(2 * n + 3))
    assert conversations.repeated_answer_words(sentences, 10) == 1.0
    assert conversations.repeated_answer_words(made_up, 10) < 0.5  # each made-up word in a few conversations
    assert conversations.repeated_answer_words(numbers, 10) is None
    assert conversations.repeated_answer_words(sentences, 31) == 0.0  # no word is in more than all 30
    assert chat_sizing.chat_tokenizer(1.0)[0] == "bpe"
    assert chat_sizing.chat_tokenizer(chat_sizing.CHAT_BPE_SHARE)[0] == "bpe"
    assert chat_sizing.chat_tokenizer(chat_sizing.CHAT_BPE_SHARE - 0.01)[0] == "char"
    assert chat_sizing.chat_tokenizer(None) == ("char", "characters, since the answers hold no words")
    assert "98% of the answers' words are in 10 conversations or more" in chat_sizing.chat_tokenizer(0.98)[1]
