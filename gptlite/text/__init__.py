"""Text and tokens: tokenizers, chat templates, and token ids back to text with stop strings.

Nothing here imports Keras: the command line reads the choices below before it starts a backend.
"""

import importlib

# What becomes of text characters a char vocabulary lacks: an error, left out, or spaces.
UNKNOWN_CHOICES = ("error", "skip", "replace")

# The tokenizers a new run can fit to its text, by the value of its `tokenizer` setting: (the module of text/, the
# class, what it is, for the commands' help), a `text.tokenizers.Tokenizer`. A new tokenizer is one class in text/
# and one line here: the runs, the command line's choices, saved models and the exports all read it from here.
TOKENIZERS = {
    "char": ("tokenizers", "CharTokenizer", "one token per character (the default)"),
    "bpe": ("bpe", "BPETokenizer", "byte-level byte-pair encoding learned from the text, for large or many-language "
                                   "corpora (a chat run's keeps each digit apart)"),
}
DEFAULT_TOKENIZER = "char"
DEFAULT_BPE_VOCABULARY = 4096  # a new BPE vocabulary's size, where the run gives none


def tokenizer_class(name):
    """The class of the tokenizer that the `tokenizer` setting `name` names (one of TOKENIZERS)."""
    module, class_name, _ = TOKENIZERS[name]
    return getattr(importlib.import_module(f"gptlite.text.{module}"), class_name)


def load_tokenizer_classes():
    """Import every module of TOKENIZERS, so that Keras knows each tokenizer class a saved model may hold (a
    pretrained model's among them: `text.bpe` holds it)."""
    for module in sorted({module for module, *_ in TOKENIZERS.values()} | {"bpe"}):
        importlib.import_module(f"gptlite.text.{module}")
