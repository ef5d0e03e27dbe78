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
commands among them) can still choose the Keras backend after it, and it
changes nothing in the process: no environment variable, no log level
(`gptlite.quiet()` keeps TensorFlow's start-up notices out, as the commands
do; `gptlite.compile_cache.use()` keeps compiled programs on disk). Every
name below is loaded on first use. `keras.saving.load_model` rebuilds a saved
model once Keras knows gptlite's classes: at `import gptlite` where Keras was
imported first, else at gptlite's first use of Keras (`gptlite.load` loads a
model whatever the order).
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
from gptlite.settings import PRESETS, GPTConfig, TrainingConfig  # plain Python: no Keras
from gptlite import compile_cache  # noqa: F401 (plain Python: gptlite.compile_cache.use() before Keras)

__version__ = "0.1.0"

# Each public name that is loaded on first use, and the module that defines it.
_LAZY = {
    "generate": "generation", "generate_target": "generation", "stream": "generation", "RowsStream": "generation",
    "SamplingConfig": "sampling", "Engine": "engine",
    "reply": "chat", "stream_reply": "chat", "Conversation": "chat",
    "read_conversations": "conversations", "chat_ready": "conversations",
    "evaluate": "evaluation", "Evaluation": "evaluation",
    "AttentionMaps": "inspection", "attention_maps": "inspection", "plot_attention": "inspection",
    "plot_positions": "inspection", "token_report": "inspection",
    "Attention": "attention", "EncoderBlock": "blocks", "TransformerBlock": "blocks",
    "FeedForward": "layers", "Linear": "layers", "RMSNorm": "layers", "TokenAndPositionEmbedding": "layers",
    "GPT": "model", "Seq2Seq": "model",
    "TrainedRun": "training_run", "train_on_text": "training_run",
    "RunConfig": "run_config", "read_run_config": "run_config",
    "from_pretrained": "pretrained", "export_hugging_face": "pretrained", "export_kerashub": "gpt2",
    "export_gguf": "gguf_export",
    "load": "saving", "save": "saving",
    "BPETokenizer": "tokenizers", "CharTokenizer": "tokenizers", "PretrainedTokenizer": "tokenizers",
    "train": "training",
    "quiet": "notices",
}
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


# Keras finds a saved model's classes by their registered names ("gptlite>GPT"): a program that imported Keras
# first can load a model.keras file with keras.saving.load_model once gptlite is imported; otherwise Keras knows
# them once gptlite's models are imported (gptlite.load, which loads a model whatever the order, imports them).
if "keras" in sys.modules:
    importlib.import_module("gptlite.model")
