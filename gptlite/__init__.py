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
do; `gptlite.compile_cache.use()` keeps compiled programs on disk). Once Keras
is imported, before or after gptlite, gptlite's layers, models and
tokenizers are registered with it, which is what lets
`keras.saving.load_model` rebuild a saved model; every name below is loaded
on first use.
"""

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
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


def _keras_ready(finished=None):
    """Whether gptlite's classes can be registered with Keras now: Keras is running and no module of gptlite but
    `finished` (a name whose import has just run to its end) is half-way through its own import. One of them may
    be what imported Keras, and importing the models from inside it would meet its names not yet defined."""
    return "keras" in sys.modules and not any(_initializing(module) for name, module in list(sys.modules.items())
                                              if name.startswith("gptlite.") and name != finished)


def _register_with_keras():
    for module in _REGISTERED:
        importlib.import_module(module)


def _initializing(module):
    spec = getattr(module, "__spec__", None)
    return bool(getattr(spec, "_initializing", False))


class _RegisterAfterKeras(importlib.abc.MetaPathFinder):
    """Registers gptlite's classes as soon as Keras has been imported, whoever imports it: after Keras's own
    import, or, where a module of gptlite imported it, after that module's. It then leaves the import system as
    it found it. It finds nothing itself: the specs it returns are the usual finders', their loaders' last step
    followed by the registration."""

    def find_spec(self, name, path=None, target=None):
        if name != "keras" and not name.startswith("gptlite."):
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None and name == "keras":  # installed where only another finder looks
            sys.meta_path.remove(self)
            try:
                spec = importlib.util.find_spec(name)
            finally:
                sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        execute = spec.loader.exec_module

        def exec_module(module):
            execute(module)
            if self in sys.meta_path and _keras_ready(finished=name):
                sys.meta_path.remove(self)
                _register_with_keras()

        spec.loader.exec_module = exec_module
        return spec


if _keras_ready():
    _register_with_keras()
elif not any(isinstance(finder, _RegisterAfterKeras) for finder in sys.meta_path):
    sys.meta_path.insert(0, _RegisterAfterKeras())
