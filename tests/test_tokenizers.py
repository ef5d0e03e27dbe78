import json

import numpy as np
import pytest

import gptlite
from gptlite.tokenizers import CharTokenizer


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


def test_rejects_repeated_characters():
    with pytest.raises(gptlite.InputError):
        CharTokenizer("aab")
