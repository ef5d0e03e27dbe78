import itertools
import json

import numpy as np
import pytest

import gptlite
from gptlite.text.bpe import BPETokenizer
from gptlite.text.tokenizers import CharTokenizer
from conftest import make_text, run_python

pytestmark = pytest.mark.once("tokenizers do not depend on the backend (models saved under each: test_saving)")

TRICKY = [
    "Héllo,\twörld!\r\n  你好 🙂 e\u0301\n", "👩🏽‍🚀🇫🇷 family: 👨‍👩‍👧", "\t\t  \r\n\r\n     end  ",
    "", " ", "ﷺ ẞ Ꙫ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "\x00\x01\x7f ÿ", "a<|endoftext|>b",
]


@pytest.fixture(scope="module")
def bpe():
    return BPETokenizer.train([make_text()] * 2, 300)


def test_byte_level_bpe_gives_back_exactly_any_text(bpe):
    assert 257 < bpe.vocabulary_size <= 300  # the 14-word text runs out of merges a little before 300
    for text in TRICKY:
        assert bpe.decode(bpe.encode(text)) == text
        assert bpe.unknown_characters(text) == []
    assert [bpe.decode(ids) for ids in bpe.encode_batch(TRICKY)] == TRICKY
    # It learned merges: its own words take fewer tokens than bytes.
    assert len(bpe.encode("the cat sat on a mat")) < len("the cat sat on a mat") / 2
    assert bpe.decode([bpe.end_token_id]) == bpe.END_TOKEN


def test_character_counts_match_the_decoded_text_without_special_tokens(bpe):
    for text in TRICKY:
        without_end_token = text.replace(BPETokenizer.END_TOKEN, "")
        assert bpe.character_count(bpe.encode(text)) == len(without_end_token), text
    characters = CharTokenizer("ab", special_tokens=("pad", "start", "end"))
    assert characters.character_count([1, 3, 4, 3, 2, 0]) == 3


def test_a_bpe_vocabulary_size_outside_the_range_is_refused():
    with pytest.raises(gptlite.ConfigError, match="257 to"):
        BPETokenizer.train(["abc"], 100)


LOAD_AND_ENCODE = """
import json, sys
import gptlite
model = gptlite.load(sys.argv[1])
texts = json.loads(sys.argv[2])
print(json.dumps([[int(i) for i in model.tokenizer.encode(t)] for t in texts]))
print(json.dumps([model.tokenizer.decode(model.tokenizer.encode(t)) for t in texts]))
"""


@pytest.mark.slow
def test_a_bpe_tokenizer_comes_back_with_the_model_in_a_new_process(bpe, tmp_path):
    model = gptlite.GPT(vocab_size=bpe.vocabulary_size, n_layer=1, n_head=1, n_embd=8, block_size=8, tokenizer=bpe)
    model.build((None, 8))
    gptlite.save(model, tmp_path / "model.keras")
    result = run_python("-c", LOAD_AND_ENCODE, str(tmp_path / "model.keras"), json.dumps(TRICKY))
    assert result.returncode == 0, result.stderr[-2000:]
    ids, texts = (json.loads(line) for line in result.stdout.splitlines()[-2:])
    assert ids == [[int(i) for i in bpe.encode(t)] for t in TRICKY]
    assert texts == TRICKY


def test_pieces_show_each_tokens_text_and_name_special_tokens(bpe):
    characters = CharTokenizer("ab", special_tokens=("pad", "start", "end"))
    assert characters.pieces([1, 3, 4, 2]) == ["<start>", "a", "b", "<end>"]
    ids = bpe.encode("the cat")
    assert "".join(bpe.pieces(ids)) == "the cat" and len(ids) < len("the cat")
    assert bpe.pieces([bpe.end_token_id]) == [BPETokenizer.END_TOKEN]


def random_texts(count, seed=0):
    """Short texts from characters that test where the library splits words, the end token among them."""
    alphabet = [" ", "  ", "\t", "\n", "\r\n", "\x1c", "\x00", "\xa0", "\u3000", "a", "B", "é", "e\u0301", "7",
                "3.5", "'s", "'re", "'", "''", "!", ",", "_", "你", "🙂", "\u200b", BPETokenizer.END_TOKEN,
                "the", " cat", "mat."]
    rng = np.random.default_rng(seed)
    return ["".join(rng.choice(alphabet, size=rng.integers(0, 12))) for _ in range(count)]


def test_texts_are_cut_into_parts_only_where_the_library_cuts_them(bpe):
    split = bpe._tokenizer.pre_tokenizer.pre_tokenize_str
    ascii_texts = 0
    for text in TRICKY + random_texts(3000) + [make_text()]:
        if BPETokenizer.END_TOKEN in text:
            continue  # the library takes added tokens out before it splits; the test below covers them
        library = [text[start:end] for _, (start, end) in split(text)]
        parts = bpe._parts(text)
        assert "".join(parts) == text
        if text.isascii():  # there, the library's own pieces
            assert parts == library
            ascii_texts += 1
        else:
            cuts = set(itertools.accumulate(len(piece) for piece in library))
            assert set(itertools.accumulate(len(part) for part in parts)) <= cuts, repr(text)
    assert ascii_texts > 500


def test_batch_encoding_by_remembered_parts_equals_the_librarys_encoding(bpe, monkeypatch):
    texts = TRICKY + random_texts(3000) + [make_text()]
    expected = [list(bpe.encode(text)) for text in texts]
    assert bpe._known_ids is not None  # the definitions `train` makes take this path
    assert [list(ids) for ids in bpe.encode_batch(texts)] == expected
    remembered = bpe.encode_batch(texts)
    assert [list(ids) for ids in remembered] == expected  # now from the remembered parts
    assert remembered[-1].dtype == bpe.encode("a").dtype and remembered[-1].flags.writeable
    # A full memory of parts starts again, with the same results.
    remembered = len(bpe._known_ids)
    monkeypatch.setattr(gptlite.text.bpe, "KNOWN_PARTS", 50)
    assert [list(ids) for ids in bpe.encode_batch(texts[:40])] == expected[:40]
    assert len(bpe._known_ids) < remembered


def test_each_character_that_starts_a_unit_is_whitespace_to_the_library(bpe):
    # A unit starts at whitespace after other characters; were that not whitespace to the library, a
    # piece of the library's could straddle two units. Two of a whitespace character before a letter
    # split into three pieces (a space and a letter join, so two there).
    split = bpe._tokenizer.pre_tokenizer.pre_tokenize_str
    whitespace = [chr(c) for c in range(0x3001) if gptlite.text.bpe._UNITS.fullmatch("a" + chr(c) + "a") is None]
    assert " " in whitespace and "\n" in whitespace
    for character in whitespace:
        pieces = [piece for piece, _ in split(character + character + "a")]
        assert len(pieces) == (2 if character == " " else 3), repr(character)


def test_definitions_made_elsewhere_are_encoded_by_the_library_alone(bpe):
    definition = json.loads(bpe.definition)
    definition["pre_tokenizer"]["add_prefix_space"] = True
    other = BPETokenizer(json.dumps(definition))
    assert other._known_ids is None
    texts = TRICKY + random_texts(200, seed=1)
    assert [list(ids) for ids in other.encode_batch(texts)] == [list(other.encode(text)) for text in texts]


def test_a_vocabulary_with_digits_apart_gives_each_digit_a_token_and_back_any_text():
    numbers = " ".join(f"{a} plus {b} is {a + b}." for a in range(10, 60) for b in range(20, 25))
    apart = BPETokenizer.train([numbers] * 2, 400, digits_apart=True)
    together = BPETokenizer.train([numbers] * 2, 400)
    text = "What is 57 plus 123? 180."
    # GPT-2's splitting learns numbers as tokens of their own; apart, a number of n digits is n tokens.
    assert any(piece.strip().isdigit() and len(piece.strip()) > 1 for piece in together.pieces(together.encode(text)))
    assert [piece for piece in apart.pieces(apart.encode(text)) if piece.strip().isdigit()] == list("57123180")
    assert len(apart.encode(" plus")) == 1  # words still merge
    texts = TRICKY + random_texts(100, seed=2) + [text]
    assert apart._known_ids is None  # encoded by the library, text by text
    assert [apart.decode(ids) for ids in apart.encode_batch(texts)] == texts
    again = BPETokenizer.from_config(json.loads(json.dumps(apart.get_config())))
    assert again.encode(text).tolist() == apart.encode(text).tolist()


@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_chat_markers_are_one_token_each_wherever_they_stand_and_survive_saving(kind, bpe):
    from gptlite.text import templates

    plain = CharTokenizer.from_text("the cat sat <|| on a mat") if kind == "char" else bpe
    tokenizer = plain.with_chat_tokens(templates.TURN_MARKERS, templates.DEFAULT_TEMPLATE)
    assert tokenizer.vocabulary_size == plain.vocabulary_size + len(templates.TURN_MARKERS)
    text = "<|user|>the cat<|end|><|assistant|><|| sat<|end|>"
    ids = tokenizer.encode(text)
    marker_ids = {int(tokenizer.encode(marker)[0]) for marker in templates.TURN_MARKERS}
    assert marker_ids == set(range(plain.vocabulary_size, tokenizer.vocabulary_size))  # after the others' ids
    assert sum(int(i) in marker_ids for i in ids) == 4 and tokenizer.decode(ids) == text
    assert tokenizer.encode("the cat").tolist() == plain.encode("the cat").tolist()  # plain text as before
    assert tokenizer.encode_batch([text, "the cat"])[0].tolist() == ids.tolist()
    assert tokenizer.character_count(ids) == len("the cat<|| sat")  # markers stand for no character
    again = type(tokenizer).from_config(json.loads(json.dumps(tokenizer.get_config())))
    assert again.encode(text).tolist() == ids.tolist() and again.chat_template == templates.DEFAULT_TEMPLATE
