"""gptlite: train a small GPT on your own text with Keras 3, and sample from it.

    import gptlite
    run = gptlite.train_on_text(["my_text.txt"], "runs/mine")   # what train.py does
    model = gptlite.load("runs/mine/model.keras")                # or keras.saving.load_model(...)
    print(gptlite.generate(model, "ROMEO:", max_new_tokens=100, temperature=0.8, seed=1))

    adder = gptlite.load("adder/model.keras")            # a Seq2Seq, from train.py --synthetic addition
    print(gptlite.generate_target(adder, "123+456"))

    maps = gptlite.attention_maps(model, "ROMEO: What light")  # weights (layers, heads, T, T), tokens
    gptlite.plot_attention(maps, "attention.png")

Importing gptlite does not import Keras, so that a program (gptlite's own
commands among them) can still choose the Keras backend after it. Once Keras
is imported, before or after gptlite, gptlite's layers, models and tokenizers
are registered with it, which is what lets `keras.saving.load_model` rebuild
a saved model; every name below is loaded on first use.
"""

import importlib
import importlib.abc
import importlib.util
import os
import sys

# TensorFlow's C++ start-up notices would bury the progress bar; a value the
# user has set is kept. Must happen before TensorFlow is first imported.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from gptlite.errors import (  # noqa: E402 (plain Python: no Keras)
    ConfigError,
    GPTLiteError,
    InputError,
    MissingFileError,
    RunExistsError,
    TrainingDiverged,
    TrainingInterrupted,
)
from gptlite.settings import PRESETS, GPTConfig, TrainingConfig  # noqa: E402 (plain Python: no Keras)
from gptlite import compile_cache  # noqa: E402 (plain Python: no Keras)

# Before TensorFlow's first operation, which reads XLA's flags (see compile_cache).
compile_cache._apply()

__version__ = "0.1.0"

# Each public name that needs Keras, and the module that defines it.
_LAZY = {
    "generate": "generation", "generate_target": "generation", "stream": "generation", "RowsStream": "generation",
    "SamplingConfig": "sampling", "Engine": "engine",
    "reply": "chat", "stream_reply": "chat", "Conversation": "chat",
    "read_conversations": "conversations", "chat_ready": "conversations",
    "evaluate": "evaluation", "Evaluation": "evaluation",
    "AttentionMaps": "inspection", "attention_maps": "inspection", "plot_attention": "inspection",
    "plot_positions": "inspection", "token_report": "inspection",
    "Attention": "layers", "EncoderBlock": "layers", "FeedForward": "layers", "Linear": "layers", "RMSNorm": "layers",
    "TokenAndPositionEmbedding": "layers", "TransformerBlock": "layers",
    "GPT": "model", "Seq2Seq": "model",
    "TrainedRun": "pipeline", "train_on_text": "pipeline",
    "RunConfig": "run_config", "read_run_config": "run_config",
    "from_pretrained": "pretrained", "export_hugging_face": "pretrained", "export_kerashub": "pretrained",
    "load": "saving", "save": "saving",
    "BPETokenizer": "tokenizers", "CharTokenizer": "tokenizers", "PretrainedTokenizer": "tokenizers",
    "train": "training",
}
# The modules whose classes Keras must know to load a model.keras file.
_REGISTERED = ("gptlite.model", "gptlite.tokenizers")

__all__ = sorted(["ConfigError", "GPTLiteError", "InputError", "MissingFileError", "RunExistsError",
                  "TrainingDiverged", "TrainingInterrupted", "PRESETS", "GPTConfig", "TrainingConfig", *_LAZY])


def __getattr__(name):
    if name not in _LAZY:
        raise AttributeError(f"module 'gptlite' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"gptlite.{_LAZY[name]}"), name)
    globals()[name] = value
    return value


def __dir__():
    return __all__


def _register_with_keras():
    for module in _REGISTERED:
        importlib.import_module(module)


class _RegisterAfterKeras(importlib.abc.MetaPathFinder):
    """Registers gptlite's classes as soon as Keras has been imported, whoever imports it."""

    def find_spec(self, name, path, target=None):
        if name != "keras":
            return None
        sys.meta_path.remove(self)  # from here on, Keras is found as usual
        spec = importlib.util.find_spec("keras")
        if spec is None or spec.loader is None:
            return spec
        execute = spec.loader.exec_module

        def exec_module(module):
            execute(module)
            _register_with_keras()

        spec.loader.exec_module = exec_module
        return spec


if "keras" in sys.modules:
    _register_with_keras()
elif not any(isinstance(finder, _RegisterAfterKeras) for finder in sys.meta_path):
    sys.meta_path.insert(0, _RegisterAfterKeras())
