"""Writing and reading `model.keras` files; exporting a model as a TensorFlow SavedModel."""

import pathlib

import keras
import numpy as np

from gptlite.backend.runtime import backends_where, running
from gptlite.errors import ConfigError, InputError
from gptlite.files import atomic_directory, atomic_path, check_model_file
from gptlite.model.gpt import check_use
from gptlite.model.layers import layers_within
from gptlite.weights import decoder_only


def save(model, path, writer=None, sync=True):
    """Save a GPT or Seq2Seq (weights, shape and tokenizer; no optimizer state) to a `.keras` file.

    With `writer` (a `training.background.FileWriter`), the file is written on the
    writer's thread from a copy of the model made now, synced as `sync` says
    (`FileWriter.write`); training may go on.
    """
    copy = inference_copy(model)
    if writer is not None:
        writer.write(path, copy.save, sync=sync)
        return
    with atomic_path(path) as temporary:
        copy.save(temporary)


def inference_copy(model):
    """A fresh, uncompiled model of the same config with `model`'s weights (LoRA adapters merged): what a
    saved file holds, and loads without rebuilding an optimizer."""
    copy = type(model).from_config(model.get_config())
    copy.build((None, model.config.block_size))
    copy_weights(model, copy)
    return copy


def copy_weights(source, target):
    """Give `target`, a model of the same config, `source`'s weights, layer by layer as a saved file holds them.

    A Dense layer with LoRA adapters (`enable_lora`) gives its kernel with the
    adapters merged in, so `target` needs none. The values are copied: a
    JAX training step may reuse the buffers of `source`'s weights.
    """
    load_weights_by_layer(target, weights_by_layer(source))


def weights_by_layer(model):
    """`model`'s weights as a saved file holds them (LoRA adapters merged), copied now: {"LAYER/NAME": array}, LAYER
    the layer's place in `layers_within(model)`, NAME its own name for the weight."""
    arrays = {}
    for index, layer in enumerate(layers_within(model)):
        store = {}
        layer.save_own_variables(store)
        arrays.update({f"{index}/{key}": np.array(keras.ops.convert_to_numpy(value), copy=True)
                       for key, value in store.items()})
    return arrays


def load_weights_by_layer(model, arrays):
    """Give `model` the weights `weights_by_layer` took of a model of the same config; a ValueError where they are
    another model's (a layer's weights that do not fit it, or layers it has not)."""
    by_layer = {}
    for key, value in arrays.items():
        index, name = key.split("/", 1)
        by_layer.setdefault(int(index), {})[name] = value
    layers = layers_within(model)  # both models are built from one config: their layers come in the same order
    if by_layer and max(by_layer) >= len(layers):
        raise ValueError(f"the weights are of a model of {max(by_layer) + 1} layers or more; this one has "
                         f"{len(layers)}")
    for index, layer in enumerate(layers):
        layer.load_own_variables(by_layer.get(index, {}))


def load(path):
    """Load a gptlite model (GPT or Seq2Seq), with its tokenizer, from a `.keras` file.

    Loading runs in Keras's safe mode: nothing in the file can run code.
    """
    path = pathlib.Path(path)
    check_model_file(path)
    try:
        model = keras.saving.load_model(path, compile=False)
    except Exception as error:  # Keras raises many types for a damaged file.
        raise InputError(f"cannot load {path}: {str(error).splitlines()[0]}") from error
    refusal = InputError(f"{path} holds a {type(model).__name__}, not a gptlite model")
    if check_use(model, "be loaded", refusal).tokenizer is None:
        raise refusal
    return model


@decoder_only("a SavedModel of gptlite's")
def export_saved_model(model, directory):
    """Write the model as a TensorFlow SavedModel that needs neither gptlite nor Keras to run.

    Its "serve" signature takes `token_ids` (batch, length <= block_size,
    int32) and returns `logits` (batch, vocabulary), the scores of the token
    after each sequence. `tokenizer.json` beside it holds the tokenizer's
    configuration (for the char tokenizer, its vocabulary in id order). The
    folder appears whole or not at all; an existing one is never replaced.
    """
    import json

    import tensorflow as tf

    check_export_backend()
    options = running().saved_model_options(model.config.block_size)
    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint(
        name="serve",
        fn=lambda token_ids: {"logits": model(token_ids)[:, -1, :]},
        input_signature=[tf.TensorSpec((None, None), tf.int32, name="token_ids")],
        **options,
    )
    with atomic_directory(directory) as written:
        written.rmdir()  # Keras writes the folder itself
        archive.write_out(str(written), verbose=False)
        (written / "tokenizer.json").write_text(json.dumps(keras.saving.serialize_keras_object(model.tokenizer)))


def check_export_backend():
    """Keras writes SavedModels from TensorFlow and JAX only (torch would need torch_xla)."""
    runtime = running()
    if not runtime.exports_saved_model:
        writers = backends_where(lambda each: each.exports_saved_model)
        raise ConfigError(f"exporting a SavedModel needs the {writers} backend, not {runtime.name}; run it with "
                          f"KERAS_BACKEND=tensorflow (a model.keras file loads under every backend)")
