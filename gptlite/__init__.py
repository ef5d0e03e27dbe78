"""gptlite: train a small GPT on your own text with Keras 3, and sample from it.

    import gptlite
    run = gptlite.train_on_text(["my_text.txt"], "runs/mine")   # what train.py does
    model = gptlite.load("runs/mine/model.keras")                # or keras.saving.load_model(...)
    print(gptlite.generate(model, "ROMEO:", max_new_tokens=100, temperature=0.8, seed=1))

    adder = gptlite.load("adder/model.keras")            # a Seq2Seq, from train.py --synthetic addition
    print(gptlite.generate_target(adder, "123+456"))

    maps = gptlite.attention_maps(model, "ROMEO: What light")  # weights (layers, heads, T, T), tokens
    gptlite.plot_attention(maps, "attention.png")
    steps = gptlite.trace(model, "ROMEO: What light")         # every step's numbers; in Jupyter, the page's view

Importing gptlite does not import Keras, so that a program (gptlite's own
commands among them) can still choose the Keras backend after it, and it
changes nothing in the process: no environment variable, no log level
(`gptlite.quiet()` keeps TensorFlow's start-up notices out, as the commands
do). A saved model it loads, a run, or a first decode program keeps
compiled programs on disk for the next process
(`gptlite.compile_cache`; `use(None)` first for none). Every
name below is loaded on first use. `keras.saving.load_model` rebuilds a saved
model once Keras knows gptlite's classes: at `import gptlite` where Keras was
imported first, or at `gptlite.quiet()`, which starts Keras; `gptlite.load`
loads a model whatever the order.
"""

import importlib
import sys

from gptlite.errors import (  # plain Python: no Keras
    ConfigError,
    GPTLiteError,
    InputError,
    MissingFileError,
    RunExistsError,
    TrainingDiverged,
    TrainingInterrupted,
)
from gptlite.backend import compile_cache  # noqa: F401 (plain Python: gptlite.compile_cache.use() before Keras)
from gptlite.model.config import GPTConfig  # plain Python: no Keras
from gptlite.training.settings import PRESETS, TrainingConfig  # plain Python: no Keras
from gptlite.version import __version__  # noqa: F401


# Each public name that is loaded on first use, and the module that defines it.
_LAZY = {
    # model/
    "GPT": "model.gpt", "Seq2Seq": "model.gpt", "Attention": "model.attention",
    "EncoderBlock": "model.blocks", "TransformerBlock": "model.blocks", "FeedForward": "model.layers",
    "Linear": "model.layers", "RMSNorm": "model.norms", "TokenAndPositionEmbedding": "model.layers",
    # text/, data/
    "BPETokenizer": "text.bpe", "CharTokenizer": "text.tokenizers", "PretrainedTokenizer": "text.bpe",
    "read_conversations": "data.conversations", "chat_ready": "weights.pretrained",
    # decode/
    "generate": "decode.generation", "generate_target": "decode.generation", "stream": "decode.generation",
    "RowsStream": "decode.generation", "SamplingConfig": "decode.settings", "Engine": "decode.engine",
    "reply": "decode.chat", "stream_reply": "decode.chat", "Conversation": "decode.chat",
    # weights/
    "load": "weights.saving", "save": "weights.saving", "from_pretrained": "weights.pretrained",
    "export_hugging_face": "weights.pretrained", "export_kerashub": "weights.gpt2", "export_gguf": "weights.gguf_export",
    # exports.py
    "export": "exports",
    # web/
    "export_web": "web.export",
    # training/, evaluation/, tasks/
    "train": "training.fit", "TrainedRun": "training.run", "train_on_text": "training.run",
    "RunConfig": "training.run_config", "read_run_config": "training.run_config",
    "evaluate": "tasks.task", "Evaluation": "evaluation.scores",
    # inside/
    "AttentionMaps": "inside.inspection", "attention_maps": "inside.inspection", "plot_attention": "inside.inspection",
    "plot_positions": "inside.inspection", "token_report": "inside.inspection",
    "trace": "inside.trace", "trace_target": "inside.trace", "Trace": "inside.trace",
    "heads": "inside.heads", "HeadReport": "inside.heads", "film": "inside.film", "Film": "inside.film", "patching": "inside.patching", "Patching": "inside.patching",
}
__all__ = sorted(["ConfigError", "GPTLiteError", "InputError", "MissingFileError", "RunExistsError",
                  "TrainingDiverged", "TrainingInterrupted", "PRESETS", "GPTConfig", "TrainingConfig", "quiet",
                  *_LAZY])


def __getattr__(name):
    if name not in _LAZY:
        raise AttributeError(f"module 'gptlite' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"gptlite.{_LAZY[name]}"), name)
    globals()[name] = value
    return value


def __dir__():
    return __all__


def quiet():
    """Start Keras without TensorFlow's start-up notices (`gptlite.backend.notices.quiet`), and let it know
    gptlite's classes, so that `keras.saving.load_model` rebuilds a saved model. Call it before importing Keras,
    after choosing the backend."""
    from gptlite.backend import notices

    notices.quiet()
    importlib.import_module("gptlite.model.gpt")


# Keras finds a saved model's classes by their registered names ("gptlite>GPT"). A program that imported Keras
# first can load a model.keras file with keras.saving.load_model once gptlite is imported; one that imports
# gptlite first, once gptlite has started Keras (`quiet`) or imported its models (`load` loads in any order).
if "keras" in sys.modules:
    importlib.import_module("gptlite.model.gpt")
