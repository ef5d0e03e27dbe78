"""Tokenizers: text to integer ids and back.

Every tokenizer is a `Tokenizer`: the interface below is all that the model, data, decoding, tasks and exports
ask of one, so that none of them asks which kind it holds. A tokenizer is serialized into the model's config, so
`model.keras` carries it. Here: the interface, `CharTokenizer`, and the pieces every tokenizer shares (added
tokens, the smallest id dtype); `text.bpe`: the byte-level BPE tokenizers, learned here (`BPETokenizer`) or a
pretrained model's (`PretrainedTokenizer`). A tokenizer that a run can fit (`fit`) has a `name`, and a line in
`text.TOKENIZERS`. Nothing here knows another program's form of a tokenizer: each format translates a tokenizer's
`description` of itself, in the format's own module (`weights.gguf_export`, `weights.pretrained`, `weights.gpt2`,
`web.tokenizer_form`).
"""

import re

import keras
import numpy as np

from gptlite.errors import ConfigError, InputError
from gptlite.text import UNKNOWN_CHOICES


class Tokenizer:
    """What every tokenizer offers. A new one subclasses this, implements each method that raises
    NotImplementedError, and registers with Keras (`keras.saving.register_keras_serializable(package="gptlite")`).

        vocabulary_size                -> int
        end_token_id                   -> int, or None without one (generation then runs to its length)
        start_token_id, pad_token_id   -> the same (a Seq2Seq needs both, and pad_token_id 0)
        text_start_ids                 -> ids a text starts with (a pretrained model's beginning-of-text token)
        added_tokens                   -> texts that are one token each wherever they appear (turn markers)
        chat_template                  -> the Jinja chat template it renders conversations with, or None
        tokens_are                     -> what its tokens are, in a few words ("characters"), for what runs say
        unknown_characters(text)       -> the characters of text it cannot encode
        encode(text), encode_batch(texts), decode(ids)
        decode_after(ids)              -> the text ids add after earlier text
        character_count(ids)           -> how many characters the ids stand for (special tokens: none)
        pieces(ids)                    -> each token's text, one string per id (for reports and the server's page)
        with_chat_tokens(markers, template) -> a copy with the markers added (new ids after the others)
        get_config(), from_config(config)

    A run fits a new one to its text with `fit` (where the class has a `name`, its `tokenizer` setting); the
    formats that translate tokenizers (GGUF, Hugging Face's files, GPT-2's, the web page's) read its
    `description` of itself. One that does not describe itself refuses with a ConfigError that says so.
    """

    name = None  # the `tokenizer` setting that fits a new one to a run's text; None: no run fits one
    tokens_are = "tokens"
    start_token_id = pad_token_id = end_token_id = None
    text_start_ids = []
    added_tokens = ()
    chat_template = None

    # --- a new one, fitted to a run's text

    # Whether fitting learns from a sample of the text (`fitting_words` says what it learns), rather than reading
    # all of it.
    learns_from_a_sample = False

    @classmethod
    def check_vocabulary_size(cls, vocabulary_size):
        """Refuse a `vocab_size` this kind cannot have (by default, any: its vocabulary is what its text holds)."""
        raise ConfigError(f"`vocab_size` sets the size of a learned vocabulary (`tokenizer='bpe'`); a {cls.name} "
                          f"tokenizer's is what its text holds")

    @classmethod
    def fitting_words(cls, vocabulary_size, digits_apart):
        """What fitting learns, in words ("a 4,096-token byte-level BPE vocabulary"), or None: it only reads."""
        return None

    @classmethod
    def fit(cls, texts, vocabulary_size=None, digits_apart=False, show_progress=False, what="the text"):
        """A tokenizer fitted to an iterable of strings (`what` names them in errors): `vocabulary_size` tokens
        (None: the kind's default), each digit a token of its own with `digits_apart`."""
        raise NotImplementedError

    # --- reading and writing text

    def unknown_characters(self, text):
        raise NotImplementedError

    def encode(self, text):
        raise NotImplementedError

    def encode_batch(self, texts):
        return [self.encode(text) for text in texts]

    def decode(self, ids):
        raise NotImplementedError

    def decode_after(self, ids):
        return self.decode(ids)

    def character_count(self, ids):
        raise NotImplementedError

    def pieces(self, ids):
        raise NotImplementedError

    def with_chat_tokens(self, markers, template):
        raise NotImplementedError

    def get_config(self):
        raise NotImplementedError

    @classmethod
    def from_config(cls, config):
        return cls(**config)

    # --- itself, for the formats that translate tokenizers

    def description(self):
        """What it is, in a form no other program's, from which each format that translates tokenizers (GGUF's,
        Hugging Face's, the web page's) makes its own: {"kind": "characters", "specials": [...], "characters":
        [...], "added": [...], "end_id": ...} (the names of its special tokens, then its characters, then its added
        tokens, in id order), or {"kind": "tokenizers_json", "definition": the `tokenizers` library's JSON,
        "learned": whether it was learned here (else a pretrained model's own), "begin_token", "end_token" and
        their ids, "adds_begin": whether a text starts with the beginning token, "chat_template"}."""
        raise ConfigError(f"a tokenizer of {self.tokens_are} does not describe itself")


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
class CharTokenizer(Tokenizer):
    """One token per Unicode character seen in the training text.

    Ids are given in code-point order, so the same text always gives the
    same vocabulary. `special_tokens` names tokens that stand for no
    character, from "pad", "start" and "end"; they take the first ids, in
    the order given, and decode to nothing. The seq2seq model needs all
    three; a language model needs none, and without an end token its
    generation runs to its length or a stop string.
    """

    name = "char"
    tokens_are = "characters"
    SPECIAL_TOKENS = ("pad", "start", "end")

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

    @classmethod
    def fit(cls, texts, vocabulary_size=None, digits_apart=False, show_progress=False, what="the text"):
        """The characters of the texts (a character is a token whatever `digits_apart` says); text of nothing but
        white space is refused."""
        if vocabulary_size is not None:
            cls.check_vocabulary_size(vocabulary_size)
        characters = set()
        for text in texts:
            characters.update(text)
        if not "".join(characters).strip():
            raise InputError(f"{what} has no text in it")
        return cls("".join(sorted(characters)))

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

    def description(self):
        return {"kind": "characters", "specials": [f"<{name}>" for name in self.special_tokens],
                "characters": list(self.vocabulary), "added": list(self.added_tokens), "end_id": self.end_token_id}


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
