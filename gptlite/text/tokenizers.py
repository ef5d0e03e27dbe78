"""Tokenizers: text to integer ids and back.

Every tokenizer offers the same small interface, so the model, data and
generation code never ask which kind they hold:

    tokenizer.vocabulary_size          -> int
    tokenizer.end_token_id             -> int, or None without one
    tokenizer.start_token_id, .pad_token_id  -> the same (the seq2seq model needs them)
    tokenizer.unknown_characters(text) -> the characters of text it cannot encode
    tokenizer.encode(text)             -> 1-D numpy integer array
    tokenizer.encode_batch(texts)      -> a list of them
    tokenizer.decode(ids)              -> str
    tokenizer.decode_after(ids)        -> str, the text ids add after earlier text (a tokenizer that drops
                                          the space a text starts with keeps it here)
    tokenizer.character_count(ids)     -> int, the characters the ids stand for (special tokens: none)
    tokenizer.text_start_ids           -> list of ids a text starts with (a pretrained model's
                                          beginning-of-text token; none for the others)
    tokenizer.added_tokens             -> texts that are one token each wherever they appear (turn markers)
    tokenizer.chat_template            -> the Jinja chat template it renders conversations with, or None
    tokenizer.with_chat_tokens(markers, template) -> a copy with the markers added (new ids after the others)
                                          and the template
    tokenizer.get_config() / from_config(config)

A tokenizer is serialized into the model's config, so `model.keras` carries it. Here: `CharTokenizer`, and
the pieces every tokenizer shares (added tokens, the smallest id dtype); `text.bpe`: the byte-level BPE
tokenizers, learned here (`BPETokenizer`) or a pretrained model's (`PretrainedTokenizer`).
"""

import re

import keras
import numpy as np

from gptlite.errors import ConfigError, InputError
from gptlite.text import UNKNOWN_CHOICES


def known_text(tokenizer, text, unknown, what):
    """`text` with the characters the tokenizer lacks refused ("error"), left out ("skip") or spaces ("replace").

    `what` names the text in the error ("prompt", "source").
    """
    if unknown not in UNKNOWN_CHOICES:
        raise ConfigError(f"unknown must be 'error', 'skip' or 'replace', got {unknown!r}")
    missing = tokenizer.unknown_characters(text)
    if missing and unknown == "error":
        raise InputError(
            f"the {what} has characters the model never saw in training: {''.join(missing)!r} "
            f"(`unknown='skip'` or `unknown='replace'` lets it run anyway)"
        )
    if missing:
        replacement = " " if unknown == "replace" and not tokenizer.unknown_characters(" ") else ""
        text = "".join(replacement if c in missing else c for c in text)
    return text


@keras.saving.register_keras_serializable(package="gptlite")
class CharTokenizer:
    """One token per Unicode character seen in the training text.

    Ids are given in code-point order, so the same text always gives the
    same vocabulary. `special_tokens` names tokens that stand for no
    character, from "pad", "start" and "end"; they take the first ids, in
    the order given, and decode to nothing. The seq2seq model needs all
    three; a language model needs none, and without an end token its
    generation runs to its length or a stop string.
    """

    SPECIAL_TOKENS = ("pad", "start", "end")
    start_token_id = pad_token_id = None
    text_start_ids = []

    def __init__(self, vocabulary, special_tokens=(), added_tokens=(), chat_template=None):
        if isinstance(vocabulary, (list, tuple)):
            vocabulary = "".join(vocabulary)
        if len(set(vocabulary)) != len(vocabulary) or not vocabulary:
            raise InputError("a character vocabulary must be a non-empty string of distinct characters")
        special_tokens = tuple(special_tokens)
        if len(set(special_tokens)) != len(special_tokens) or set(special_tokens) - set(self.SPECIAL_TOKENS):
            raise ConfigError(f"special tokens must be distinct names from {', '.join(self.SPECIAL_TOKENS)}; "
                              f"got {special_tokens!r}")
        self.vocabulary = "".join(sorted(vocabulary))
        self.special_tokens = special_tokens
        ids = {name: index for index, name in enumerate(special_tokens)}
        self.pad_token_id, self.start_token_id, self.end_token_id = (ids.get(n) for n in self.SPECIAL_TOKENS)
        self._code_points = code_points(self.vocabulary)  # sorted, for searchsorted
        self.added_tokens = checked_added_tokens(added_tokens)
        self.chat_template = chat_template
        # Added tokens take the ids after the characters', and decode to their own text.
        self._characters = np.array([""] * len(special_tokens) + list(self.vocabulary) + list(self.added_tokens),
                                    dtype=object)
        self._added_pattern = added_pattern(self.added_tokens)

    @classmethod
    def from_text(cls, text, special_tokens=()):
        return cls.from_texts([text], special_tokens)

    @classmethod
    def from_texts(cls, texts, special_tokens=()):
        """The vocabulary of an iterable of strings (a corpus's pieces), read once."""
        characters = set()
        for text in texts:
            characters.update(text)
        if not characters:
            raise InputError("cannot build a vocabulary from empty text")
        return cls("".join(sorted(characters)), special_tokens)

    @property
    def vocabulary_size(self):
        return len(self.special_tokens) + len(self.vocabulary) + len(self.added_tokens)

    def unknown_characters(self, text):
        """The characters of `text` that have no id, sorted."""
        if self._added_pattern is not None:
            text = "".join(self._added_pattern.split(text)[::2])
        return sorted(set(text) - set(self.vocabulary))

    def with_chat_tokens(self, markers, template):
        added = self.added_tokens + tuple(marker for marker in markers if marker not in self.added_tokens)
        return CharTokenizer(self.vocabulary, self.special_tokens, added, template)

    def encode(self, text):
        if self._added_pattern is not None and self._added_pattern.search(text):
            return encode_around_added(text, self._added_pattern, self._encode_characters,
                                        len(self.special_tokens) + len(self.vocabulary), self.added_tokens,
                                        smallest_id_dtype(self.vocabulary_size))
        return self._encode_characters(text)

    def _encode_characters(self, text):
        points = code_points(text)
        ids = np.searchsorted(self._code_points, points)
        ids = np.minimum(ids, len(self._code_points) - 1)
        if not np.array_equal(self._code_points[ids], points):
            unknown = "".join(self.unknown_characters(text))
            raise InputError(
                f"the text has characters the model's vocabulary lacks: {unknown!r}"
            )
        return (ids + len(self.special_tokens)).astype(smallest_id_dtype(self.vocabulary_size))

    def encode_batch(self, texts):
        # One lookup for all of them: many short texts (a task's pairs) cost a call each otherwise.
        texts = list(texts)
        if not texts:
            return []
        if self._added_pattern is not None and any(self._added_pattern.search(text) for text in texts):
            return [self.encode(text) for text in texts]
        ends = np.cumsum([len(text) for text in texts])
        return np.split(self.encode("".join(texts)), ends[:-1])

    def decode(self, ids):
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        return "".join(self._characters[ids])

    def decode_after(self, ids):
        return self.decode(ids)

    def character_count(self, ids):
        """How many characters `ids` decode to: one for each id but the special and added tokens'."""
        ids = np.asarray(ids)
        return int(np.count_nonzero((ids >= len(self.special_tokens))
                                    & (ids < len(self.special_tokens) + len(self.vocabulary))))

    def pieces(self, ids):
        """Each token's text, one string per id; special tokens as their names in angle brackets."""
        names = [f"<{name}>" for name in self.special_tokens]
        return [names[i] if i < len(names) else str(self._characters[i]) for i in (int(i) for i in np.ravel(ids))]

    def get_config(self):
        config = {"vocabulary": self.vocabulary}
        # Each left out when empty, as in files written before they existed.
        if self.special_tokens:
            config["special_tokens"] = list(self.special_tokens)
        if self.added_tokens:
            config["added_tokens"] = list(self.added_tokens)
        if self.chat_template is not None:
            config["chat_template"] = self.chat_template
        return config

    @classmethod
    def from_config(cls, config):
        return cls(**config)


def code_points(text):
    # UTF-32 gives one fixed-width integer per character: no Python loop.
    return np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)


def checked_added_tokens(tokens):
    tokens = tuple(tokens)
    if len(set(tokens)) != len(tokens) or not all(isinstance(token, str) and len(token) > 1 for token in tokens):
        raise ConfigError(f"added tokens must be distinct texts of two characters or more, got {tokens!r}")
    return tokens


def added_pattern(tokens):
    """A pattern that splits a text around the added tokens (the longest first), keeping them; None for none."""
    if not tokens:
        return None
    return re.compile("(" + "|".join(re.escape(token) for token in sorted(tokens, key=len, reverse=True)) + ")")


def encode_around_added(text, pattern, encode_plain, first_added_id, added_tokens, dtype):
    """Ids of a text holding added tokens: each added token its own id, the text between encoded plainly."""
    ids = []
    for index, part in enumerate(pattern.split(text)):
        if index % 2:
            ids.append(np.asarray([first_added_id + added_tokens.index(part)]))
        elif part:
            ids.append(encode_plain(part))
    return np.concatenate(ids).astype(dtype) if ids else np.zeros(0, dtype)


def with_special_tokens(definition, tokens):
    """A `tokenizers` definition with `tokens` added as special tokens (those it lacks), each one token."""
    from tokenizers import AddedToken, Tokenizer

    tokenizer = Tokenizer.from_str(definition)
    missing = [token for token in tokens if tokenizer.token_to_id(token) is None]
    tokenizer.add_special_tokens([AddedToken(token, special=True, normalized=False) for token in missing])
    return tokenizer.to_str()


def smallest_id_dtype(vocabulary_size):
    if vocabulary_size <= np.iinfo(np.uint8).max + 1:
        return np.uint8
    if vocabulary_size <= np.iinfo(np.uint16).max + 1:
        return np.uint16
    return np.uint32
