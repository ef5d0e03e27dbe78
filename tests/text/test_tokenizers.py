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
