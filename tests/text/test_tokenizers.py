import json

import numpy as np
import pytest

import gptlite
from gptlite.text.tokenizers import CharTokenizer, known_text

pytestmark = pytest.mark.once("tokenizers do not depend on the backend (models saved under each: test_saving)")


def test_round_trip_of_mixed_scripts_and_whitespace():
    text = "Héllo,\twörld!\r\n  你好 🙂 e\u0301\n"
    tokenizer = CharTokenizer.from_text(text)
    ids = tokenizer.encode(text)
    assert len(ids) == len(text)
    assert tokenizer.decode(ids) == text


def test_ids_follow_code_point_order_and_use_a_compact_dtype():
    tokenizer = CharTokenizer.from_text("cabba")
    assert tokenizer.vocabulary == "abc"
    np.testing.assert_array_equal(tokenizer.encode("cab"), [2, 0, 1])
    assert tokenizer.encode("cab").dtype == np.uint8
    wide = CharTokenizer("".join(chr(0x4E00 + i) for i in range(300)))
    assert wide.encode(chr(0x4E00 + 299)).dtype == np.uint16


def test_a_batch_of_texts_encodes_as_each_text_alone():
    texts = ["Héllo", "", "\t你好 🙂\n", "e\u0301", ""]
    tokenizer = CharTokenizer.from_texts(texts)
    batch = tokenizer.encode_batch(texts)
    assert [ids.tolist() for ids in batch] == [tokenizer.encode(text).tolist() for text in texts]
    assert tokenizer.encode_batch([]) == []
    with pytest.raises(gptlite.InputError, match="'x'"):
        tokenizer.encode_batch(["Héllo", "xH"])


def test_unknown_characters_are_named():
    tokenizer = CharTokenizer.from_text("abc")
    assert tokenizer.unknown_characters("abzxz") == ["x", "z"]
    with pytest.raises(gptlite.InputError, match="'xz'"):
        tokenizer.encode("abzxz")


def test_config_round_trip_through_json():
    tokenizer = CharTokenizer.from_text("zeta\nalpha\"'\\")
    clone = CharTokenizer.from_config(json.loads(json.dumps(tokenizer.get_config())))
    assert clone.vocabulary == tokenizer.vocabulary
    assert clone.decode(clone.encode("alpha")) == "alpha"


def test_special_tokens_take_the_first_ids_and_decode_to_nothing():
    tokenizer = CharTokenizer.from_text("cab", special_tokens=("pad", "start", "end"))
    assert (tokenizer.pad_token_id, tokenizer.start_token_id, tokenizer.end_token_id) == (0, 1, 2)
    assert tokenizer.vocabulary_size == 6
    np.testing.assert_array_equal(tokenizer.encode("cab"), [5, 3, 4])
    assert tokenizer.decode([1, 5, 3, 4, 2, 0, 0]) == "cab"
    clone = CharTokenizer.from_config(json.loads(json.dumps(tokenizer.get_config())))
    assert clone.special_tokens == ("pad", "start", "end") and clone.encode("b")[0] == 4
    plain = CharTokenizer.from_text("cab")
    assert plain.end_token_id is None and plain.pad_token_id is None and "special_tokens" not in plain.get_config()


@pytest.mark.parametrize("special_tokens", [("pad", "pad"), ("unknown",)])
def test_special_tokens_must_be_distinct_known_names(special_tokens):
    with pytest.raises(gptlite.ConfigError, match="special tokens"):
        CharTokenizer("ab", special_tokens=special_tokens)


def test_rejects_repeated_characters():
    with pytest.raises(gptlite.InputError):
        CharTokenizer("aab")


def test_unknown_characters_are_refused_skipped_or_replaced():
    tokenizer = CharTokenizer.from_text("abc ")
    with pytest.raises(gptlite.InputError, match="'xy'"):
        known_text(tokenizer, "axyb", "error", "prompt")
    assert known_text(tokenizer, "axyb", "skip", "prompt") == "ab"
    assert known_text(tokenizer, "axyb", "replace", "prompt") == "a  b"
    with pytest.raises(gptlite.ConfigError, match="unknown"):
        known_text(tokenizer, "ab", "ignore", "prompt")


def _byte_tokenizer_module():
    """A module holding a tokenizer written as a new one is: one class implementing `Tokenizer` (a token per
    UTF-8 byte, for the sake of the test), registered with Keras."""
    import types

    import keras

    from gptlite.text.tokenizers import Tokenizer

    @keras.saving.register_keras_serializable(package="gptlite-tests")
    class BytesTokenizer(Tokenizer):
        name = "bytes"
        tokens_are = "UTF-8 bytes"
        vocabulary_size = 256

        @classmethod
        def fit(cls, texts, vocabulary_size=None, digits_apart=False, show_progress=False, what="the text"):
            return cls()

        def unknown_characters(self, text):
            return []

        def encode(self, text):
            return np.frombuffer(text.encode("utf-8"), np.uint8).copy()

        def decode(self, ids):
            return bytes(int(i) for i in np.ravel(ids)).decode("utf-8", errors="replace")

        def character_count(self, ids):
            return int(np.count_nonzero((np.asarray(ids) & 0xC0) != 0x80))

        def pieces(self, ids):
            return [self.decode([i]) for i in np.ravel(ids)]

        def get_config(self):
            return {}

    module = types.ModuleType("gptlite.text.bytes_for_a_test")
    module.BytesTokenizer = BytesTokenizer
    return module


@pytest.mark.slow
def test_a_tokenizer_added_as_one_class_and_one_registry_line_trains_saves_and_writes(tmp_path, monkeypatch):
    import sys

    from gptlite import text
    from gptlite.weights import gpt2

    monkeypatch.setitem(sys.modules, "gptlite.text.bytes_for_a_test", _byte_tokenizer_module())
    monkeypatch.setitem(text.TOKENIZERS, "bytes", ("bytes_for_a_test", "BytesTokenizer", "one token per byte"))
    (tmp_path / "words.txt").write_text("the cat sat on the mat, the dog ran to the sun. " * 40)
    run = gptlite.train_on_text([tmp_path / "words.txt"], tmp_path / "run", {"max_iters": 4, "eval_interval": 4},
                                preset="tiny", tokenizer="bytes", verbose=0)
    model = gptlite.load(tmp_path / "run" / "model.keras")
    assert type(model.tokenizer).__name__ == "BytesTokenizer" and model.config.vocab_size == 256
    assert run.model.tokenizer.tokens_are == "UTF-8 bytes"
    assert gptlite.generate(model, "the ", max_new_tokens=5, temperature=0).startswith("the ")
    with pytest.raises(gptlite.ConfigError, match="tokens are UTF-8 bytes"):  # no GPT-2 form: it says so
        gpt2.byte_level_bpe(model.tokenizer)
