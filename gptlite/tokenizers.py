"""Tokenizers: text to integer ids and back.

Every tokenizer offers the same small interface, so the model, data and
generation code never ask which kind they hold:

    tokenizer.vocabulary_size          -> int
    tokenizer.end_token_id             -> int, or None without one
    tokenizer.encode(text)             -> 1-D numpy integer array
    tokenizer.decode(ids)              -> str
    tokenizer.get_config() / from_config(config)

A tokenizer is serialized into the model's config, so `model.keras` carries it.
"""

import keras
import numpy as np

from gptlite.errors import InputError


@keras.saving.register_keras_serializable(package="gptlite")
class CharTokenizer:
    """One token per Unicode character seen in the training text.

    Ids are given in code-point order, so the same text always gives the
    same vocabulary. It has no end-of-text token: generation runs to its
    length or a stop string.
    """

    end_token_id = None

    def __init__(self, vocabulary):
        if isinstance(vocabulary, (list, tuple)):
            vocabulary = "".join(vocabulary)
        if len(set(vocabulary)) != len(vocabulary) or not vocabulary:
            raise InputError("a character vocabulary must be a non-empty string of distinct characters")
        self.vocabulary = "".join(sorted(vocabulary))
        self._code_points = _code_points(self.vocabulary)  # sorted, for searchsorted
        self._characters = np.array(list(self.vocabulary))

    @classmethod
    def from_text(cls, text):
        if not text:
            raise InputError("cannot build a vocabulary from empty text")
        return cls("".join(sorted(set(text))))

    @property
    def vocabulary_size(self):
        return len(self.vocabulary)

    def unknown_characters(self, text):
        """The characters of `text` that have no id, sorted."""
        return sorted(set(text) - set(self.vocabulary))

    def encode(self, text):
        code_points = _code_points(text)
        ids = np.searchsorted(self._code_points, code_points)
        ids = np.minimum(ids, len(self._code_points) - 1)
        if not np.array_equal(self._code_points[ids], code_points):
            unknown = "".join(self.unknown_characters(text))
            raise InputError(
                f"the text has characters the model's vocabulary lacks: {unknown!r}"
            )
        return ids.astype(_smallest_id_dtype(self.vocabulary_size))

    def decode(self, ids):
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        return "".join(self._characters[ids])

    def get_config(self):
        return {"vocabulary": self.vocabulary}

    @classmethod
    def from_config(cls, config):
        return cls(**config)


def _code_points(text):
    # UTF-32 gives one fixed-width integer per character: no Python loop.
    return np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)


def _smallest_id_dtype(vocabulary_size):
    if vocabulary_size <= np.iinfo(np.uint8).max + 1:
        return np.uint8
    if vocabulary_size <= np.iinfo(np.uint16).max + 1:
        return np.uint16
    return np.uint32
