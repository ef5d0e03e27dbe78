"""gptlite: train a small GPT on your own text with Keras 3, and sample from it.

    import keras, gptlite
    model = keras.saving.load_model("out/model.keras")   # or gptlite.load(...)
    print(gptlite.generate(model, "ROMEO:", max_new_tokens=100, temperature=0.8, seed=1))

    adder = gptlite.load("adder/model.keras")            # a Seq2Seq, from train.py --synthetic addition
    print(gptlite.generate_target(adder, "123+456"))

    maps = gptlite.attention_maps(model, "ROMEO: What light")  # weights (layers, heads, T, T), tokens
    gptlite.plot_attention(maps, "attention.png")

Importing gptlite registers its layers, model and tokenizers with Keras, which
is what lets `keras.saving.load_model` rebuild a saved model.
"""

import os

# TensorFlow's C++ start-up notices would bury the progress bar; a value the
# user has set is kept. Must happen before TensorFlow is first imported.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from gptlite.errors import (
    ConfigError,
    GPTLiteError,
    InputError,
    MissingFileError,
    RunExistsError,
    TrainingDiverged,
    TrainingInterrupted,
)
from gptlite.generation import generate, generate_target, stream
from gptlite.inspection import AttentionMaps, attention_maps, plot_attention, plot_positions, token_report
from gptlite.layers import (
    Attention,
    CausalSelfAttention,
    EncoderBlock,
    FeedForward,
    TokenAndPositionEmbedding,
    TransformerBlock,
)
from gptlite.model import GPT, GPTConfig, Seq2Seq
from gptlite.saving import load, save
from gptlite.tokenizers import BPETokenizer, CharTokenizer
from gptlite.training import PRESETS, TrainingConfig, train

__version__ = "0.1.0"

__all__ = [
    "GPT",
    "GPTConfig",
    "Attention",
    "AttentionMaps",
    "CausalSelfAttention",
    "BPETokenizer",
    "CharTokenizer",
    "ConfigError",
    "EncoderBlock",
    "FeedForward",
    "GPTLiteError",
    "InputError",
    "MissingFileError",
    "PRESETS",
    "RunExistsError",
    "Seq2Seq",
    "TokenAndPositionEmbedding",
    "TrainingConfig",
    "TrainingDiverged",
    "TrainingInterrupted",
    "TransformerBlock",
    "attention_maps",
    "generate",
    "generate_target",
    "load",
    "plot_attention",
    "plot_positions",
    "save",
    "stream",
    "token_report",
    "train",
]
