"""GPT-2's layout: its weights by name to and from a gptlite GPT, its Hugging Face configuration, its
tokenizer's form (vocabulary and merges), and KerasHub's GPT-2 presets in and out.

gptlite's GPT has, by default, GPT-2's layout: pre-norm blocks, learned
positions, one fused query/key/value projection with the heads side by side
in each of its three parts, tanh-approximated GELU, LayerNorm epsilon 1e-5
and the output head tied to the token embedding. So GPT-2's weights fit it
as they are; only KerasHub's attention, which keeps query, key and value
apart with a heads axis, is reshaped. Every GPT-2 format goes through one
form, GPT-2's own names for its weights (`wte.weight`,
`h.0.attn.c_attn.weight`, ...) with Hugging Face's shapes, which are
Keras's Dense shapes (inputs first). `gptlite.weights.pretrained` chooses between
this family and the Llama family (`gptlite.weights.llama`).
"""

import json
import pathlib

import numpy as np

from gptlite.errors import ConfigError, first_line, InputError, MissingFileError
from gptlite.files import atomic_directory
from gptlite.model.config import MLP_KINDS
from gptlite.model.layers import weight_array
from gptlite.text.bpe import BPETokenizer, merges_of
from gptlite.weights import decoder_only

# The activations Hugging Face names for the tanh approximation of GELU, which gptlite uses.
_TANH_GELU = ("gelu_new", "gelu_pytorch_tanh")
LAYER_NORM_EPSILON = 1e-5


def shape_of(config, folder):
    """The shape settings of a Hugging Face GPT-2 folder's config.json (`config`), or an InputError naming what
    gptlite's GPT cannot express."""
    missing = [key for key in ("n_layer", "n_head", "n_embd", "vocab_size") if key not in config]
    if missing:
        raise InputError(f"{folder}/config.json lacks {', '.join(missing)}")
    n_embd = config["n_embd"]
    unsupported = [
        (config.get("activation_function", "gelu_new") not in _TANH_GELU,
         f"activation {config.get('activation_function')!r} (gptlite uses tanh GELU, 'gelu_new')"),
        (config.get("layer_norm_epsilon", LAYER_NORM_EPSILON) != LAYER_NORM_EPSILON,
         f"LayerNorm epsilon {config.get('layer_norm_epsilon')} (gptlite's is {LAYER_NORM_EPSILON})"),
        (config.get("n_inner") not in (None, 4 * n_embd), f"a feed-forward width of {config.get('n_inner')}"),
        (not config.get("tie_word_embeddings", True), "an output head apart from the token embedding"),
        (config.get("scale_attn_by_inverse_layer_idx", False), "attention scaled by layer number"),
        (not config.get("scale_attn_weights", True), "unscaled attention"),
    ]
    reasons = [reason for failed, reason in unsupported if failed]
    if reasons:
        raise InputError(f"{folder}: gptlite's GPT cannot express {'; '.join(reasons)}")
    shape = dict(n_layer=config["n_layer"], n_head=config["n_head"], n_embd=n_embd,
                 block_size=config.get("n_positions", config.get("n_ctx", 1024)), bias=True, tie_weights=True,
                 position="learned", dropout=0.0)
    return shape


def hugging_face_config(model):
    """A GPT's config.json as a Hugging Face GPT-2 folder has it."""
    config = model.config
    end = model.tokenizer.end_token_id
    return {
        "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
        "vocab_size": config.vocab_size, "n_positions": config.block_size, "n_ctx": config.block_size,
        "n_embd": config.n_embd, "n_layer": config.n_layer, "n_head": config.n_head, "n_inner": None,
        "activation_function": "gelu_new", "layer_norm_epsilon": LAYER_NORM_EPSILON,
        "resid_pdrop": config.dropout, "embd_pdrop": config.dropout, "attn_pdrop": config.attention_dropout,
        "initializer_range": 0.02, "scale_attn_weights": True, "tie_word_embeddings": True, "use_cache": True,
        "bos_token_id": end, "eos_token_id": end,
    }


@decoder_only("GPT-2's layout")
def gpt2_arrays(model):
    """A GPT's weights under GPT-2's names, as float32 numpy arrays.

    Layers without biases give zero biases, which is what they compute; an
    untied output head has no GPT-2 name, so such a model is refused. LoRA
    adapters, where enabled, come merged into their kernels.
    """
    _check_exportable(model)
    return layout_arrays(model)


def layout_arrays(model):
    """Any GPT with GPT-2's kind of block (LayerNorm, fused query/key/value, GELU) by GPT-2's names, float32,
    unchecked: zero biases where it has none, its position table (learned or sinusoidal) as wpe, LoRA merged.
    `gpt2_arrays` first checks that GPT-2's own layout holds the model; GGUF's gpt2 holds more."""
    arrays = {}
    for name, (layer, attribute) in _gpt2_names(model).items():
        weight = getattr(layer, attribute)
        arrays[name] = _zero_bias(layer) if weight is None else weight_array(layer, attribute)
    return arrays


def _gpt2_names(model):
    """GPT-2's name for each weight of a GPT: name -> (layer, attribute)."""
    names = {"wte.weight": (model.embedding.token_embedding, "embeddings"),
             "wpe.weight": (model.embedding, "position_embeddings")}
    for index, block in enumerate(model.blocks):
        layers = {"ln_1": block.attention_norm, "attn.c_attn": block.attention.qkv_projection,
                  "attn.c_proj": block.attention.output_projection, "ln_2": block.feed_forward_norm,
                  "mlp.c_fc": block.feed_forward.expand, "mlp.c_proj": block.feed_forward.contract}
        for name, layer in layers.items():
            norm = name.startswith("ln")
            names[f"h.{index}.{name}.weight"] = (layer, "gamma" if norm else "kernel")
            names[f"h.{index}.{name}.bias"] = (layer, "beta" if norm else "bias")
    names["ln_f.weight"], names["ln_f.bias"] = (model.final_norm, "gamma"), (model.final_norm, "beta")
    return names


def _zero_bias(layer):
    """The bias that a layer built without one has in effect: zeros."""
    return np.zeros(layer.units if hasattr(layer, "units") else layer.gamma.shape[0], np.float32)


def _value(weight):
    from keras import ops

    return ops.convert_to_numpy(weight)


def load_gpt2_arrays(model, arrays):
    """Set a built GPT's weights from GPT-2's names (as `gpt2_arrays` gives).

    The position table is cut to the model's block size; a missing, extra or
    misshapen array is an `InputError` naming it. A model without biases
    takes only arrays whose biases are all zero.
    """
    arrays = dict(arrays)
    block_size = model.config.block_size
    if "wpe.weight" in arrays:
        positions = arrays["wpe.weight"]
        if len(positions) < block_size:
            raise InputError(f"the weights hold {len(positions)} positions; the model needs {block_size}")
        arrays["wpe.weight"] = positions[:block_size]
    targets = {name: getattr(layer, attribute) for name, (layer, attribute) in _gpt2_names(model).items()}
    missing = sorted(name for name, weight in targets.items() if name not in arrays and weight is not None)
    if missing:
        raise InputError(f"the weights lack {', '.join(missing[:3])}{' and more' if len(missing) > 3 else ''}")
    extra = sorted(set(arrays) - set(targets))
    if extra:
        raise InputError(f"the weights hold {', '.join(extra[:3])}, which this model has no place for")
    for name, weight in targets.items():
        value = np.asarray(arrays.get(name, 0))
        if weight is None:  # a bias or norm shift the model does without
            if np.any(value):
                raise InputError(f"{name} is not zero, but the model has no biases (`bias=False`)")
            continue
        if tuple(value.shape) != tuple(weight.shape):
            raise InputError(f"{name} has shape {tuple(value.shape)}; the model needs {tuple(weight.shape)}")
        weight.assign(value.astype(weight.dtype))


def not_gpt2(config):
    """What of a GPT's settings GPT-2's layout cannot hold, as a list of reasons (none: it is GPT-2's)."""
    return [reason for failed, reason in [
        (config.position != "learned", f"{config.position} positions (GPT-2 learns a table)"),
        (config.norm != "layer", "RMSNorm (GPT-2 uses LayerNorm)"),
        (config.norm_position != "pre", "post-norm blocks (GPT-2's normalise before each sublayer)"),
        (config.norm_epsilon != LAYER_NORM_EPSILON, f"a norm epsilon of {config.norm_epsilon}"),
        (config.mlp != "gelu", f"a {MLP_KINDS[config.mlp].name} feed-forward (GPT-2's is GELU)"),
        (config.mlp_hidden_size not in (None, 4 * config.n_embd), f"a feed-forward width of {config.mlp_hidden_size}"),
        (config.kv_heads != config.n_head, "grouped-query attention"),
        (config.head_dim not in (None, config.n_embd // config.n_head), f"heads {config.head_dim} wide"),
        (config.qk_norm, "QK-norm"),
        (config.qkv_bias not in (None, config.bias), "biases on some projections only"),
        (not config.tie_weights, "an output head of its own (`tie_weights=False`)"),
    ] if failed]


def _check_exportable(model):
    problems = not_gpt2(model.config)
    if problems:
        raise ConfigError(f"GPT-2's layout cannot hold {'; '.join(problems)}")


# --- KerasHub presets

def read_kerashub(preset):
    """(shape settings, tokenizer, GPT-2's arrays) of a KerasHub GPT-2 preset (a name or a folder)."""
    import keras_hub

    known = sorted(keras_hub.models.GPT2Backbone.presets)
    if not pathlib.Path(preset).exists() and str(preset) not in known:
        raise MissingFileError(f"no such model: {preset} is not a gptlite .keras file, a Hugging Face GPT-2, "
                               f"Llama, Qwen2 or Qwen3 folder, a KerasHub preset folder or a KerasHub GPT-2 preset "
                               f"name ({', '.join(known)})")
    try:
        backbone = keras_hub.models.Backbone.from_preset(str(preset))
        hub_tokenizer = keras_hub.models.GPT2Tokenizer.from_preset(str(preset))
    except Exception as error:  # keras-hub raises many kinds for a folder it cannot read or a name it cannot fetch
        reason = first_line(error)
        if pathlib.Path(preset).exists():
            raise InputError(f"cannot load the KerasHub preset {preset}: {reason}") from None
        raise MissingFileError(f"cannot download the KerasHub preset {preset} (is a network reachable?): {reason}; "
                               f"where one is, keras-hub keeps it in its cache, or save it as a folder with "
                               f"save_to_preset and give the folder") from None
    if not isinstance(backbone, keras_hub.models.GPT2Backbone):
        raise InputError(f"{preset} holds a {type(backbone).__name__}; gptlite reads GPT-2 models")
    shape = dict(n_layer=backbone.num_layers, n_head=backbone.num_heads, n_embd=backbone.hidden_dim,
                 block_size=backbone.max_sequence_length, bias=True, tie_weights=True, position="learned",
                 dropout=0.0)
    if backbone.intermediate_dim != 4 * backbone.hidden_dim:
        raise InputError(f"{preset}: gptlite's GPT cannot express a feed-forward width of "
                         f"{backbone.intermediate_dim}")
    tokenizer = BPETokenizer.from_vocabulary_and_merges(hub_tokenizer.vocabulary, hub_tokenizer.merges)
    return shape, tokenizer, _kerashub_arrays(backbone)


def _kerashub_arrays(backbone):
    """A GPT2Backbone's weights under GPT-2's names."""
    return {name: np.concatenate([np.asarray(_value(part), np.float32).reshape(shape) for part in parts], axis=-1)
            for name, (parts, shape) in _kerashub_parts(backbone).items()}


# Where a GPT2Backbone keeps each of GPT-2's weights, by the variables' names (Keras's public `Variable.path`, the
# names a preset's weights file keeps them under), rather than through keras-hub's private layer attributes: a
# GPT-2 name -> (the names of the variables that make it, joined along the last axis; its shape in GPT-2), "{i}"
# standing for a block's number. GPT-2's fused query/key/value kernel (C, 3C) and bias (3C,) are KerasHub's three
# (C, H, D) kernels and (H, D) biases; its attention output kernel (C, C) is KerasHub's (H, D, C); every other
# weight is one variable as it is. Checked with keras-hub 0.32.
_KERASHUB_NAMES = {
    "wte.weight": (["token_embedding/embeddings"], None),
    "wpe.weight": (["position_embedding/embeddings"], None),
    "ln_f.weight": (["layer_norm/gamma"], None),
    "ln_f.bias": (["layer_norm/beta"], None),
    "h.{i}.attn.c_attn.weight": ([f"transformer_layer_{{i}}/self_attention/{part}/kernel"
                                  for part in ("query", "key", "value")], "C, C"),
    "h.{i}.attn.c_attn.bias": ([f"transformer_layer_{{i}}/self_attention/{part}/bias"
                                for part in ("query", "key", "value")], "C"),
    "h.{i}.attn.c_proj.weight": (["transformer_layer_{i}/self_attention/attention_output/kernel"], "C, C"),
    "h.{i}.attn.c_proj.bias": (["transformer_layer_{i}/self_attention/attention_output/bias"], None),
    "h.{i}.ln_1.weight": (["transformer_layer_{i}/self_attention_layer_norm/gamma"], None),
    "h.{i}.ln_1.bias": (["transformer_layer_{i}/self_attention_layer_norm/beta"], None),
    "h.{i}.ln_2.weight": (["transformer_layer_{i}/feedforward_layer_norm/gamma"], None),
    "h.{i}.ln_2.bias": (["transformer_layer_{i}/feedforward_layer_norm/beta"], None),
    "h.{i}.mlp.c_fc.weight": (["transformer_layer_{i}/feedforward_intermediate_dense/kernel"], None),
    "h.{i}.mlp.c_fc.bias": (["transformer_layer_{i}/feedforward_intermediate_dense/bias"], None),
    "h.{i}.mlp.c_proj.weight": (["transformer_layer_{i}/feedforward_output_dense/kernel"], None),
    "h.{i}.mlp.c_proj.bias": (["transformer_layer_{i}/feedforward_output_dense/bias"], None),
}


def _kerashub_parts(backbone):
    """Where a GPT2Backbone keeps each of GPT-2's weights: name -> (variables, the shape each has in GPT-2), found
    by their names (`_KERASHUB_NAMES`); a backbone that names them otherwise is an InputError saying so."""
    import keras_hub

    variables = {variable.path: variable for variable in backbone.weights}

    def named(name):
        # A backbone inside a task model names its variables under the task's name too.
        found = [variable for path, variable in variables.items() if path == name or path.endswith("/" + name)]
        if len(found) != 1:
            raise InputError(f"this KerasHub GPT-2 has {len(found)} weights named {name}, where gptlite reads one "
                             f"(checked with keras-hub 0.32; this is {keras_hub.__version__})")
        return found[0]

    width, parts = backbone.hidden_dim, {}
    shapes = {"C": (width,), "C, C": (width, width)}
    for name, (paths, shape) in _KERASHUB_NAMES.items():
        for block in range(backbone.num_layers) if "{i}" in name else [None]:
            found = [named(path.format(i=block)) for path in paths]
            parts[name.format(i=block)] = found, shapes[shape] if shape else tuple(found[0].shape)
    return parts


@decoder_only("a KerasHub GPT-2 preset")
def export_kerashub(model, directory):
    """Write a GPT as a KerasHub GPT-2 preset folder, which `keras_hub.models.GPT2CausalLM.from_preset` loads.

    KerasHub's GPT-2 tokenizer is byte-level BPE: a model with a char
    tokenizer is refused. The folder appears whole or not at all.
    """
    import keras_hub

    _check_exportable(model)
    vocabulary, merges = byte_level_bpe(model.tokenizer)
    if BPETokenizer.END_TOKEN not in vocabulary:
        raise ConfigError(f"KerasHub's GPT-2 tokenizer needs the {BPETokenizer.END_TOKEN} token, which this "
                          f"vocabulary lacks")
    config = model.config
    arrays = gpt2_arrays(model)
    backbone = keras_hub.models.GPT2Backbone(
        vocabulary_size=config.vocab_size, num_layers=config.n_layer, num_heads=config.n_head,
        hidden_dim=config.n_embd, intermediate_dim=4 * config.n_embd, dropout=config.dropout,
        max_sequence_length=config.block_size)
    for name, (parts, _) in _kerashub_parts(backbone).items():
        for part, piece in zip(parts, np.split(arrays[name], len(parts), axis=-1)):
            part.assign(piece.reshape(part.shape))
    tokenizer = keras_hub.models.GPT2Tokenizer(vocabulary=vocabulary, merges=merges)
    preprocessor = keras_hub.models.GPT2CausalLMPreprocessor(tokenizer, sequence_length=config.block_size)
    causal_lm = keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=preprocessor)
    with atomic_directory(directory) as folder:
        causal_lm.save_to_preset(str(folder))


def byte_level_bpe(tokenizer):
    """A byte-level BPE tokenizer learned here, as GPT-2's files hold it: its vocabulary (token -> id) and merges
    ("a b"). Any other is a ConfigError: a GPT-2 tokenizer is byte-level BPE."""
    try:
        described = tokenizer.description()
    except ConfigError:  # a tokenizer that does not describe itself has no GPT-2 form either
        described = {"kind": None}
    if described["kind"] != "tokenizers_json" or not described["learned"]:
        raise ConfigError(f"a GPT-2 tokenizer is byte-level BPE; this model's tokens are {tokenizer.tokens_are}")
    return vocabulary_and_merges(described)


def vocabulary_and_merges(described):
    """A `tokenizers` definition's (a tokenizer's description of itself) BPE vocabulary and merges."""
    model = json.loads(described["definition"])["model"]
    if model.get("type") != "BPE":
        raise ConfigError("this model's tokenizer is not byte-level BPE")
    return model["vocab"], merges_of(model)
