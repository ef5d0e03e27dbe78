"""Byte-level BPE tokenizers, over the `tokenizers` library: one learned from a run's text (`BPETokenizer`), and
a pretrained model's tokenizer.json (`PretrainedTokenizer`). Each is a `text.tokenizers.Tokenizer`.
"""

import itertools
import json
import re

import keras
import numpy as np

from gptlite.errors import ConfigError, InputError
from gptlite.text import DEFAULT_BPE_VOCABULARY
from gptlite.text.tokenizers import smallest_id_dtype, Tokenizer, with_special_tokens


@keras.saving.register_keras_serializable(package="gptlite")
class BPETokenizer(Tokenizer):
    """Byte-level byte-pair encoding, learned from the training text.

    Text is taken as UTF-8 bytes, so any text encodes, and decodes back to
    exactly itself: there is no unknown token. Merges of frequent byte pairs
    make common words one token. `END_TOKEN` separates documents and ends
    generation. Training and encoding are done by the `tokenizers` library
    (Rust, parallel); its JSON definition is this tokenizer's whole config,
    so `model.keras` carries it.
    """

    name = "bpe"
    tokens_are = "byte-level BPE tokens"
    learns_from_a_sample = True
    END_TOKEN = "<|endoftext|>"
    SMALLEST_VOCABULARY = 257  # the 256 bytes and the end token

    def __init__(self, definition, chat_template=None):
        from tokenizers import Tokenizer

        self.definition = definition
        self.chat_template = chat_template
        self._tokenizer = Tokenizer.from_str(definition)
        self.end_token_id = self._tokenizer.token_to_id(self.END_TOKEN)
        parsed = json.loads(definition)
        self._added_tokens = [token["content"] for token in parsed.get("added_tokens", [])]
        self.added_tokens = tuple(self._added_tokens)
        # Parts of texts met by encode_batch -> their ids; None where whole texts go to the library.
        self._known_ids = {} if _parts_encode_alone(parsed) else None
        self._characters_started = None  # per id, the characters whose first byte it holds; made when needed

    @classmethod
    def check_vocabulary_size(cls, vocabulary_size):
        """Refuse a size that no byte-level BPE vocabulary can have: every byte, and the end token, at least."""
        if isinstance(vocabulary_size, bool) or not isinstance(vocabulary_size, int) or \
                not cls.SMALLEST_VOCABULARY <= vocabulary_size <= 2**20:
            raise ConfigError(f"vocab_size must be from {cls.SMALLEST_VOCABULARY} to {2**20:,} for a byte-level BPE "
                              f"vocabulary (every byte and the end token), got {vocabulary_size!r}")

    @classmethod
    def fitting_words(cls, vocabulary_size, digits_apart):
        return (f"a {vocabulary_size or DEFAULT_BPE_VOCABULARY:,}-token byte-level BPE vocabulary"
                + ("; each digit a token" if digits_apart else ""))

    @classmethod
    def fit(cls, texts, vocabulary_size=None, digits_apart=False, show_progress=False, what="the text"):
        """A vocabulary of `vocabulary_size` tokens (None: DEFAULT_BPE_VOCABULARY) learned from the texts
        (`train`)."""
        return cls.train(texts, vocabulary_size or DEFAULT_BPE_VOCABULARY, show_progress, digits_apart)

    @classmethod
    def from_vocabulary_and_merges(cls, vocabulary, merges):
        """A byte-level BPE tokenizer of GPT-2's kind from its vocabulary (token -> id) and merges ("a b" or
        (a, b)), as GPT-2's files and KerasHub's presets hold them."""
        from tokenizers import Tokenizer as Definition, decoders, models, pre_tokenizers

        merges = [tuple(merge.split(" ")) if isinstance(merge, str) else tuple(merge) for merge in merges]
        tokenizer = Definition(models.BPE(dict(vocabulary), merges))
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        if cls.END_TOKEN in vocabulary:
            tokenizer.add_special_tokens([cls.END_TOKEN])  # keeps its id
        return cls(tokenizer.to_str())

    @classmethod
    def train(cls, texts, vocabulary_size, show_progress=False, digits_apart=False):
        """Learn merges from an iterable of strings until the vocabulary has `vocabulary_size` tokens.

        A text too small to supply that many merges gives a smaller vocabulary. With `digits_apart`, every digit
        is a token of its own (SmolLM2's splitting), as a model that calculates needs them.
        """
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        cls.check_vocabulary_size(vocabulary_size)
        tokenizer = Tokenizer(models.BPE())
        # GPT-2's splitting: merges never cross from a word into the spaces or punctuation around it. Digits kept
        # apart: a number that is one token is a symbol whose value a model must learn number by number;
        # digit by digit, the sums of number pairs never trained on came out right sooner (benchmarks/journal.md,
        # "Chat in words and digits").
        splitting = pre_tokenizers.ByteLevel(add_prefix_space=False)
        if digits_apart:
            splitting = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), splitting])
        tokenizer.pre_tokenizer = splitting
        tokenizer.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocabulary_size, special_tokens=[cls.END_TOKEN], show_progress=show_progress,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte, seen or not
        )
        tokenizer.train_from_iterator(texts, trainer=trainer)
        return cls(tokenizer.to_str())

    @property
    def vocabulary_size(self):
        return self._tokenizer.get_vocab_size()

    def unknown_characters(self, text):
        return []  # every text is bytes, and every byte has a token

    def with_chat_tokens(self, markers, template):
        return BPETokenizer(with_special_tokens(self.definition, markers), template)

    def encode(self, text):
        ids = self._tokenizer.encode(text).ids
        return np.asarray(ids, dtype=smallest_id_dtype(self.vocabulary_size))

    def encode_batch(self, texts):
        """Encode several texts at once; a list of id arrays, the same as `encode` gives.

        Text repeats its words. Each text is cut into parts that encode alone
        as they do inside it, each part is encoded by the library the first
        time it is seen, and its ids are remembered for the next time.
        """
        dtype = smallest_id_dtype(self.vocabulary_size)
        if self._known_ids is None:
            return [np.asarray(ids, dtype=dtype) for ids in self._encode_each(list(texts))]
        parts_of_texts = [self._parts(text) for text in texts]
        known = self._known_ids  # part -> its ids, as the bytes of an array of `dtype`
        new = {part for parts in parts_of_texts for part in parts if part not in known}
        if len(known) + len(new) > KNOWN_PARTS:  # memory stays bounded on text of ever new words
            known.clear()
            new = {part for parts in parts_of_texts for part in parts}
        new = list(new)
        for part, ids in zip(new, self._encode_each(new)):
            known[part] = np.asarray(ids, dtype=dtype).tobytes()
        # Joined into a bytearray, so that the arrays are writable like those `encode` gives.
        return [np.frombuffer(bytearray().join(map(known.__getitem__, parts)), dtype=dtype)
                for parts in parts_of_texts]

    def _parts(self, text):
        """Consecutive parts of a text that each encode alone as they do inside it.

        The library's splitting never joins a character to whitespace after
        it, so a text can be cut into units, runs of whitespace with the run
        of other characters after each. Stretches of ASCII units are cut
        further into the library's own pieces (its splitting pattern is plain
        in ASCII); other units, and units holding an added token, stay whole.
        """
        if any(token in text for token in self._added_tokens):
            def plain(unit):
                return unit.isascii() and not any(token in unit for token in self._added_tokens)
        elif text.isascii():
            return _ASCII_PIECES.findall(text)
        else:
            plain = str.isascii
        parts = []
        for is_plain, units in itertools.groupby(_UNITS.findall(text), plain):
            parts += _ASCII_PIECES.findall("".join(units)) if is_plain else units
        return parts

    def _encode_each(self, texts):
        # The fast variant skips character offsets, which nothing here uses: about twice the speed.
        return [encoding.ids for encoding in self._tokenizer.encode_batch_fast(texts)]

    def decode(self, ids):
        ids = [int(i) for i in np.asarray(ids).reshape(-1)]
        return self._tokenizer.decode(ids, skip_special_tokens=False)

    def character_count(self, ids):
        """How many characters `ids` decode to, counted without decoding: a token
        holding the first byte of a character's UTF-8 bytes counts it; the end token counts none."""
        if self._characters_started is None:
            by_character = _byte_level_bytes()
            counts = np.zeros(self.vocabulary_size, np.int64)
            for token, token_id in self._tokenizer.get_vocab(with_added_tokens=False).items():
                counts[token_id] = sum((by_character[c] & 0xC0) != 0x80 for c in token)
            for token in self._added_tokens:
                counts[self._tokenizer.token_to_id(token)] = 0
            self._characters_started = counts
        return int(self._characters_started[np.asarray(ids, np.int64)].sum())

    def pieces(self, ids):
        """Each token's text, one string per id. A token holding part of a
        character's UTF-8 bytes shows as U+FFFD; the end token as its name.
        """
        return [self._tokenizer.decode([int(i)], skip_special_tokens=False) for i in np.ravel(ids)]

    def get_config(self):
        config = {"definition": self.definition}
        if self.chat_template is not None:  # left out otherwise, as in files written before it existed
            config["chat_template"] = self.chat_template
        return config

    def description(self):
        # Its end token begins a text too, as GPT-2's does, though a text is not given one.
        return {"kind": "tokenizers_json", "definition": self.definition, "learned": True,
                "begin_token": self.END_TOKEN, "begin_id": self.end_token_id, "end_token": self.END_TOKEN,
                "end_id": self.end_token_id, "adds_begin": False, "chat_template": self.chat_template}


# Unicode's White_Space characters, which are what `\s` matches in the library's splitting pattern.
_WHITESPACE = "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
# A run of whitespace and the run of other characters after it (whitespace alone only at the end).
_UNITS = re.compile(f"[{_WHITESPACE}]*[^{_WHITESPACE}]+|[{_WHITESPACE}]+")
# The library's splitting pattern (GPT-2's) written out for ASCII, where letters, digits and
# whitespace are plain classes; outside ASCII its classes follow the library's Unicode tables.
_ASCII_PIECES = re.compile(
    r"'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]+| ?[^\t\n\x0b\x0c\r A-Za-z0-9]+"
    r"|[\t\n\x0b\x0c\r ]+(?![^\t\n\x0b\x0c\r ])|[\t\n\x0b\x0c\r ]+"
)
KNOWN_PARTS = 1 << 20  # parts of texts whose ids a BPE tokenizer remembers; about 150 MB when full


def _parts_encode_alone(definition):
    """Whether the parts `BPETokenizer._parts` cuts a text into encode alone as they do in the text.

    True of the definitions `BPETokenizer.train` makes: GPT-2's splitting
    pattern (no piece of it joins a character to whitespace after it, and
    only a plain space to a word after it), no normalizer, nothing added
    after splitting, no random dropout, and added tokens matched exactly.
    """
    pre_tokenizer = definition.get("pre_tokenizer") or {}
    return (
        pre_tokenizer.get("type") == "ByteLevel" and pre_tokenizer.get("use_regex", True)
        and not pre_tokenizer.get("add_prefix_space")
        and definition.get("normalizer") is None and definition.get("post_processor") is None
        and definition["model"].get("type") == "BPE" and not definition["model"].get("dropout")
        and not any(token["lstrip"] or token["rstrip"] or token["single_word"]
                    for token in definition.get("added_tokens", []))
    )


def _byte_level_bytes():
    """GPT-2's byte-level alphabet, backwards: the byte each character of a token's name stands for.

    Bytes that print as themselves (Latin-1's visible characters) keep their
    character; the others, in order, take the characters from U+0100 on.
    """
    visible = [*range(ord("!"), ord("~") + 1), *range(ord("\xa1"), ord("\xac") + 1), *range(ord("\xae"), 256)]
    hidden = [byte for byte in range(256) if byte not in visible]
    return {**{chr(byte): byte for byte in visible}, **{chr(256 + i): byte for i, byte in enumerate(hidden)}}


@keras.saving.register_keras_serializable(package="gptlite")
class PretrainedTokenizer(Tokenizer):
    """A pretrained model's own tokenizer, whatever its kind: any `tokenizers` definition (a tokenizer.json).

    Byte-level BPE as in SmolLM2 and Qwen, SentencePiece-style BPE with byte
    fallback as in Llama and TinyLlama, or any other the library reads. Text
    is encoded without the special tokens the library would add around it;
    `text_start_ids` says what a text starts with (the beginning-of-text
    token, where the tokenizer puts one there), and `end_token_id` is the
    end-of-text token, which ends generation. Added tokens keep their ids.

    Args:
        definition: the tokenizer.json text.
        vocabulary_size: the model's token ids, which may be more than the
            tokenizer's (Qwen pads its embedding): the rest decode to nothing.
        begin_token, end_token: the beginning- and end-of-text tokens (None: none).
        chat_template: the Jinja chat template the model was trained with
            (None: none), kept for rendering conversations.
    """

    tokens_are = "the pretrained model's tokens"

    def __init__(self, definition, vocabulary_size=None, begin_token=None, end_token=None, chat_template=None):
        from tokenizers import Tokenizer

        self.definition = definition
        self._tokenizer = Tokenizer.from_str(definition)
        own_size = self._tokenizer.get_vocab_size(with_added_tokens=True)
        self.vocabulary_size = own_size if vocabulary_size is None else vocabulary_size
        if self.vocabulary_size < own_size:
            raise InputError(f"the tokenizer has {own_size} tokens, more than the model's {self.vocabulary_size}")
        self.begin_token, self.end_token, self.chat_template = begin_token, end_token, chat_template
        self.begin_token_id = self._id_of(begin_token)
        self.end_token_id = self._id_of(end_token)
        parsed = json.loads(definition)
        self.added_tokens = tuple(token["content"] for token in parsed.get("added_tokens", []))
        self.special_ids = sorted({token["id"] for token in parsed.get("added_tokens", []) if token.get("special")})
        # Where the tokenizer's own processing puts the beginning token before a text, so does generation.
        with_specials = self._tokenizer.encode("a", add_special_tokens=True).ids
        self.text_start_ids = [self.begin_token_id] if self.begin_token_id is not None and with_specials and \
            with_specials[0] == self.begin_token_id else []
        model = parsed.get("model", {})
        pre_tokenizer = json.dumps(parsed.get("pre_tokenizer"))
        # Byte-level splitting or byte fallback: every character has tokens.
        self._every_character = bool(model.get("byte_fallback")) or '"ByteLevel"' in pre_tokenizer
        self._unknown_id = self._id_of(model.get("unk_token"))
        self._anchor = int(self._tokenizer.encode("a", add_special_tokens=False).ids[-1])
        self._anchor_length = len(self.decode([self._anchor]))  # decode_after runs per token: measured once

    def _id_of(self, token):
        if token is None:
            return None
        token_id = self._tokenizer.token_to_id(token)
        if token_id is None:
            raise InputError(f"the tokenizer has no token {token!r}")
        return token_id

    def unknown_characters(self, text):
        if self._every_character or self._unknown_id is None:
            return []
        unknown = []
        for character in dict.fromkeys(text):
            if self._unknown_id in self._tokenizer.encode(character, add_special_tokens=False).ids:
                unknown.append(character)
        return unknown

    def with_chat_tokens(self, markers, template):
        from tokenizers import Tokenizer

        definition = with_special_tokens(self.definition, markers)
        size = max(self.vocabulary_size, Tokenizer.from_str(definition).get_vocab_size(with_added_tokens=True))
        return PretrainedTokenizer(definition, size, self.begin_token, self.end_token, template)

    def encode(self, text):
        ids = self._tokenizer.encode(text, add_special_tokens=False).ids
        return np.asarray(ids, dtype=smallest_id_dtype(self.vocabulary_size))

    def encode_batch(self, texts):
        dtype = smallest_id_dtype(self.vocabulary_size)
        return [np.asarray(encoding.ids, dtype=dtype)
                for encoding in self._tokenizer.encode_batch_fast(list(texts), add_special_tokens=False)]

    def decode(self, ids):
        ids = [int(i) for i in np.asarray(ids).reshape(-1)]
        return self._tokenizer.decode(ids, skip_special_tokens=False)

    def decode_after(self, ids):
        """The text `ids` add after earlier text. SentencePiece-style decoders drop the space a text starts
        with ("▁The" is "The" at the start), which is wrong for a token in the middle of a text: the ids are
        decoded after an anchor token, and its text cut off."""
        return self.decode([self._anchor, *np.asarray(ids).reshape(-1)])[self._anchor_length:]

    def character_count(self, ids):
        """How many characters `ids` decode to, special tokens counting none."""
        ids = np.asarray(ids, np.int64).reshape(-1)
        return len(self._tokenizer.decode([int(i) for i in ids[~np.isin(ids, self.special_ids)]],
                                          skip_special_tokens=False))

    def pieces(self, ids):
        """Each token's text, one string per id."""
        return [self._tokenizer.decode([int(i)], skip_special_tokens=False) for i in np.ravel(ids)]

    def get_config(self):
        return {"definition": self.definition, "vocabulary_size": self.vocabulary_size,
                "begin_token": self.begin_token, "end_token": self.end_token, "chat_template": self.chat_template}

    def description(self):
        return {"kind": "tokenizers_json", "definition": self.definition, "learned": False,
                "begin_token": self.begin_token, "begin_id": self.begin_token_id, "end_token": self.end_token,
                "end_id": self.end_token_id, "adds_begin": bool(self.text_start_ids),
                "chat_template": self.chat_template}


def merges_of(model):
    """A `tokenizers` definition's BPE model's merges as "a b" strings, whichever form it holds them in."""
    return [" ".join(merge) if isinstance(merge, list) else merge for merge in model.get("merges", [])]
