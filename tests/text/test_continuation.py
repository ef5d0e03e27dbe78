import pytest

from gptlite.text.continuation import Continuation, TextBuilder
from gptlite.text.tokenizers import CharTokenizer

pytestmark = pytest.mark.once("building text from tokens is plain Python")


def test_held_back_text_is_released_unless_it_completes_a_stop():
    tokenizer = CharTokenizer.from_text("abcdENDxy")

    def pieces(characters, stops):
        row = Continuation(tokenizer, stops)
        return [row.add(token) for token in tokenizer.encode(characters)] + [row.finish()]

    assert pieces("abcENDxy", ["END"]) == ["a", "b", "c", "", "", "", "", "", ""]
    assert "".join(pieces("aENb", ["END"])) == "aENb"  # a near miss is released
    assert pieces("aENb", ["END"])[1:3] == ["", ""]  # held back while it might begin one


def test_tokens_that_split_a_character_wait_for_the_rest():
    from gptlite.text.bpe import BPETokenizer

    bpe = BPETokenizer.train(["the cat sat on the mat\n"] * 10, 270)
    ids = bpe.encode("a 🙂 é")
    assert len(ids) > len("a 🙂 é")  # the emoji and the accent take a token per byte
    # Decoded a token at a time, the emoji would come out as four U+FFFD.
    builder = TextBuilder(bpe)
    pieces = [builder.add(token) for token in ids] + [builder.finish()]
    assert "".join(pieces) == "a 🙂 é" and "\ufffd" not in "".join(pieces)
