"""Pretrained weights in and out: a Hugging Face GPT-2, Llama, Qwen2 or Qwen3
folder, a KerasHub GPT-2 preset or a saved gptlite model becomes a gptlite `GPT`,
and a gptlite GPT is written back as a Hugging Face folder or a KerasHub
preset. Llama and Qwen2 folders are `gptlite.llama`'s; this module reads
the rest and chooses.

gptlite's GPT has, by default, GPT-2's layout: pre-norm blocks, learned
positions, one fused query/key/value projection with the heads side by side
in each of its three parts, tanh-approximated GELU, LayerNorm epsilon 1e-5
and the output head tied to the token embedding. So GPT-2's weights fit it
as they are; only KerasHub's attention, which keeps query, key and value
apart with a heads axis, is reshaped. Every GPT-2 format goes through one
form, GPT-2's own names for its weights (`wte.weight`,
`h.0.attn.c_attn.weight`, ...) with Hugging Face's shapes, which are
Keras's Dense shapes (inputs first).

A GPT-2 tokenizer (vocabulary and merges) becomes gptlite's byte-level BPE
tokenizer with the same ids.
"""

import dataclasses
import json
import pathlib

import numpy as np

from gptlite import llama, saving
from gptlite.errors import ConfigError, InputError, MissingFileError
from gptlite.files import atomic_directory, read_json
from gptlite.model import GPT, is_model
from gptlite.tokenizers import BPETokenizer, CharTokenizer, PretrainedTokenizer

# The activations Hugging Face names for the tanh approximation of GELU, which gptlite uses.
_TANH_GELU = ("gelu_new", "gelu_pytorch_tanh")
LAYER_NORM_EPSILON = 1e-5


def from_pretrained(name_or_path, block_size=None, dropout=None, dtype=None):
    """A gptlite `GPT` from pretrained weights, with its tokenizer.

    name_or_path: a gptlite `GPT` or `.keras` file; a Hugging Face GPT-2 folder
        (config.json, model.safetensors or pytorch_model.bin, and vocab.json
        with merges.txt or a tokenizer.json); a Hugging Face Llama, Qwen2 or Qwen3
        folder (config.json, model.safetensors or its shards, tokenizer.json;
        see `gptlite.llama`); a KerasHub GPT-2 preset folder; or a KerasHub
        preset name such as "gpt2_base_en" (downloaded by keras-hub where a
        network is reachable).
    block_size: a shorter context than the model's: the position table, if any, is cut.
    dropout: the dropout to train with (default: a gptlite model's own, 0 for GPT-2).
    dtype: the Keras dtype policy to build it with (default: Keras's, float32).
    """
    source = name_or_path if is_model(name_or_path) else None
    path = pathlib.Path(name_or_path) if source is None else None
    if path is not None and (path.is_file() or path.suffix == ".keras"):
        source = saving.load(path)
    if source is not None and source.writes_targets:
        raise ConfigError(f"{path or 'the model'} holds a {type(source).__name__}; only a GPT can be fine-tuned")
    if source is not None:
        settings = {name: value for name, value in dataclasses.asdict(source.config).items() if name != "vocab_size"}
        tokenizer = source.tokenizer
    elif path.is_dir() and _is_hugging_face_folder(path):
        settings, tokenizer, arrays, load_arrays = _read_hugging_face(path)
    else:
        settings, tokenizer, arrays = _read_kerashub(name_or_path)
        load_arrays = load_gpt2_arrays
    if dropout is not None:
        settings["dropout"] = dropout
    if block_size is not None:
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
            raise ConfigError(f"block_size must be a positive whole number, got {block_size!r}")
        if block_size > settings["block_size"]:
            raise ConfigError(f"`block_size={block_size}` is longer than the pretrained model's context, "
                              f"{settings['block_size']}; it may only shrink")
        settings["block_size"] = block_size
    model = GPT(vocab_size=tokenizer.vocabulary_size, tokenizer=tokenizer, dtype=dtype, **settings)
    model.build((None, model.config.block_size))
    if source is None:
        load_arrays(model, arrays)
    else:  # every weight as it is, but the position table, cut to the new context
        from keras import ops

        table = source.embedding.position_embeddings
        for weight, target in zip(source.weights, model.weights):
            value = ops.convert_to_numpy(weight)
            target.assign(value[:model.config.block_size] if weight is table else value)
    return model


def with_tokenizer(model, tokenizer, seed=0):
    """A copy of the GPT `model` that reads `tokenizer`: the same one with tokens added after the others.

    The token embedding (and an untied output projection) grows by a row
    (column) per added token, drawn around the existing rows: their mean plus
    normal noise of their spread per dimension, so that each new token starts
    as an ordinary one, distinct from the others. Every other weight is copied.
    """
    from keras import ops

    grown = tokenizer.vocabulary_size - model.config.vocab_size
    if grown < 0:
        raise ConfigError(f"the tokenizer has {tokenizer.vocabulary_size} tokens, fewer than the model's "
                          f"{model.config.vocab_size}")
    settings = {name: value for name, value in dataclasses.asdict(model.config).items() if name != "vocab_size"}
    copy = GPT(vocab_size=tokenizer.vocabulary_size, tokenizer=tokenizer, dtype=model.dtype_policy, **settings)
    copy.build((None, copy.config.block_size))
    random = np.random.default_rng(seed)
    for weight, target in zip(model.weights, copy.weights):
        value = ops.convert_to_numpy(weight)
        if value.shape != tuple(target.shape):
            axis = 0 if value.shape[0] == model.config.vocab_size else -1  # the embedding's rows, or the head's
            rows = np.moveaxis(value, axis, 0).astype(np.float32)
            new = rows.mean(axis=0) + random.standard_normal((grown, rows.shape[1])) * rows.std(axis=0)
            value = np.moveaxis(np.concatenate([rows, new.astype(np.float32)]), 0, axis).astype(value.dtype)
        target.assign(value)
    return copy


# --- GPT-2's weights by name, to and from a gptlite GPT

def gpt2_arrays(model):
    """A GPT's weights under GPT-2's names, as float32 numpy arrays.

    Layers without biases give zero biases, which is what they compute; an
    untied output head has no GPT-2 name, so such a model is refused. LoRA
    adapters, where enabled, come merged into their kernels.
    """
    _check_exportable(model)
    arrays = {}
    for name, (layer, attribute) in _gpt2_names(model).items():
        weight = getattr(layer, attribute)
        arrays[name] = _zero_bias(layer) if weight is None else llama.weight_array(layer, attribute)
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


# --- tokenizers

def bpe_tokenizer(vocabulary, merges):
    """gptlite's byte-level BPE tokenizer from GPT-2's vocabulary (token -> id) and merges ("a b" or (a, b))."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    merges = [tuple(merge.split(" ")) if isinstance(merge, str) else tuple(merge) for merge in merges]
    tokenizer = Tokenizer(models.BPE(dict(vocabulary), merges))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    if BPETokenizer.END_TOKEN in vocabulary:
        tokenizer.add_special_tokens([BPETokenizer.END_TOKEN])  # keeps its id
    return BPETokenizer(tokenizer.to_str())


def vocabulary_and_merges(tokenizer):
    """A byte-level BPE tokenizer's vocabulary (token -> id) and merges ("a b"), as GPT-2's files hold them."""
    if not isinstance(tokenizer, BPETokenizer):
        raise ConfigError(f"a GPT-2 tokenizer is byte-level BPE; this model's is a {type(tokenizer).__name__}")
    model = json.loads(tokenizer.definition)["model"]
    if model.get("type") != "BPE":
        raise ConfigError("this model's tokenizer is not byte-level BPE")
    merges = [" ".join(merge) if isinstance(merge, list) else merge for merge in model["merges"]]
    return model["vocab"], merges


# --- Hugging Face folders

def _is_hugging_face_folder(path):
    """A Hugging Face folder's config.json names its model_type; a KerasHub preset's names a Keras class.
    A folder without a readable config.json is neither, and is refused."""
    config_file = path / "config.json"
    if not config_file.is_file():
        raise MissingFileError(f"{path} has no config.json: a Hugging Face folder or a KerasHub preset "
                               f"folder holds one beside its weights")
    config = read_json(config_file)
    if not isinstance(config, dict):
        raise InputError(f"{config_file} is not a JSON object")
    return "model_type" in config


def _read_hugging_face(folder):
    """(shape settings, tokenizer, arrays, the function that loads the arrays into a GPT) of a Hugging Face
    GPT-2, Llama, Qwen2 or Qwen3 folder."""
    config = read_json(folder / "config.json")
    model_type = config.get("model_type", "gpt2")
    if model_type in llama.ARCHITECTURES:
        return (*llama.read_folder(folder, config), llama.load_hugging_face_arrays)
    if model_type != "gpt2":
        raise InputError(f"{folder} holds a {model_type} model; gptlite reads GPT-2, Llama, Qwen2 and Qwen3 models")
    return (*_read_gpt2_folder(folder, config), load_gpt2_arrays)


def _read_gpt2_folder(folder, config):
    """(shape settings, tokenizer, GPT-2's arrays) of a Hugging Face GPT-2 folder whose config.json is `config`."""
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
    tokenizer = _read_hugging_face_tokenizer(folder, config["vocab_size"])
    arrays = _read_hugging_face_weights(folder)
    return shape, tokenizer, arrays


def _read_hugging_face_tokenizer(folder, vocabulary_size):
    if (folder / "vocab.json").exists() and (folder / "merges.txt").exists():
        vocabulary = json.loads((folder / "vocab.json").read_text(encoding="utf-8"))
        lines = (folder / "merges.txt").read_text(encoding="utf-8").splitlines()
        merges = [line for line in lines if line and not line.startswith("#version")]
    elif (folder / "tokenizer.json").exists():
        definition = read_json(folder / "tokenizer.json")
        model = definition.get("model") if isinstance(definition, dict) else None
        if not isinstance(model, dict) or model.get("type") != "BPE":
            raise InputError(f"{folder}/tokenizer.json is not a BPE tokenizer")
        tokenizer = _char_tokenizer(definition, folder)
        if tokenizer is not None:
            return _checked_size(tokenizer, vocabulary_size, folder)
        # Tokens added to the model, GPT-2's end of text among them, as transformers 5 writes them.
        added = {token["content"]: token["id"] for token in definition.get("added_tokens", [])}
        vocabulary = {**model["vocab"], **added}
        merges = model["merges"]
    else:
        raise MissingFileError(f"{folder} has no tokenizer: vocab.json and merges.txt, or tokenizer.json")
    return _checked_size(bpe_tokenizer(vocabulary, merges), vocabulary_size, folder)


def _checked_size(tokenizer, vocabulary_size, folder):
    if tokenizer.vocabulary_size != vocabulary_size:
        raise InputError(f"{folder}: the tokenizer has {tokenizer.vocabulary_size} tokens but the model "
                         f"{vocabulary_size}")
    return tokenizer


def _char_tokenizer(definition, folder):
    """The CharTokenizer that a tokenizer.json written by `export_hugging_face` for a char model stands for,
    or None where the definition is not of that form (a BPE model without merges or pre-tokenizer, one
    character a token, the special tokens first)."""
    model = definition["model"]
    if model.get("merges") or definition.get("pre_tokenizer") is not None:
        return None
    specials = {token["id"]: token["content"] for token in definition.get("added_tokens", []) if token.get("special")}
    names = [specials[index][1:-1] for index in range(len(specials)) if index in specials]
    characters = [token for token, _ in sorted(model["vocab"].items(), key=lambda item: item[1])
                  if token not in specials.values()]
    if len(names) != len(specials) or any(len(character) != 1 for character in characters) or \
            set(names) - set(CharTokenizer.SPECIAL_TOKENS):
        return None
    if characters != sorted(characters):
        raise InputError(f"{folder}/tokenizer.json holds one character a token, but not in character order as "
                         f"gptlite's character tokenizer numbers them")
    return CharTokenizer("".join(characters), special_tokens=names)


def _read_hugging_face_weights(folder):
    """GPT-2's arrays by name, from model.safetensors (no torch needed) or pytorch_model.bin (torch needed)."""
    if (folder / "model.safetensors").exists():
        from safetensors.numpy import load_file

        try:
            tensors = load_file(str(folder / "model.safetensors"))
        except Exception as error:  # safetensors raises its own error for a damaged or truncated file
            raise InputError(f"{folder / 'model.safetensors'} cannot be read ({_first_line(error)}): is it "
                             f"damaged or cut short?") from None
    elif (folder / "pytorch_model.bin").exists():
        try:
            import torch
        except ImportError:
            raise InputError(f"{folder} holds pytorch_model.bin, which needs torch to read; install torch, or "
                             f"save the model as model.safetensors") from None
        state = torch.load(folder / "pytorch_model.bin", map_location="cpu", weights_only=True)
        tensors = {name: tensor.float().numpy() for name, tensor in state.items()}
    else:
        raise MissingFileError(f"{folder} has no weights: model.safetensors or pytorch_model.bin")
    arrays = {}
    for name, tensor in tensors.items():
        name = name.removeprefix("transformer.")
        # The causal-mask buffers of older files, and the head tied to wte.
        if name.endswith((".attn.bias", ".attn.masked_bias")) or name == "lm_head.weight":
            continue
        arrays[name] = np.asarray(tensor, dtype=np.float32)
    return arrays


def export_hugging_face(model, directory):
    """Write a GPT as a Hugging Face folder: config.json, model.safetensors and the tokenizer's files.

    GPT-2's layout (learned positions, LayerNorm, GELU, full heads) is
    written as a GPT-2 folder, which `transformers.GPT2LMHeadModel` loads; a
    Llama-family layout (rotary positions, RMSNorm, SwiGLU) as a Llama or
    Qwen2 folder (`llama.export_folder`), which `AutoModelForCausalLM` loads;
    any other is refused, naming what neither can hold. A byte-level BPE
    tokenizer is written as GPT-2's vocab.json and merges.txt (and
    tokenizer.json); a char tokenizer as a tokenizer.json with one token per
    character; a pretrained model's tokenizer as its own tokenizer.json, with
    its special tokens and chat template. `AutoTokenizer.from_pretrained`
    loads each. The folder appears whole or not at all; an existing one is
    never replaced.
    """
    from safetensors.numpy import save_file

    if model.writes_targets:
        raise ConfigError(f"only a GPT has a Hugging Face form here, not a {type(model).__name__}")
    config = model.config

    def write_tokenizer(folder):
        if isinstance(model.tokenizer, PretrainedTokenizer):
            llama.write_pretrained_tokenizer(model.tokenizer, folder, config.block_size)
        else:
            _write_hugging_face_tokenizer(model.tokenizer, folder, config.block_size)

    gpt2_problems = _not_gpt2(config)
    if gpt2_problems:
        try:
            llama.family_of(config)
        except ConfigError as error:
            raise ConfigError(f"neither GPT-2 nor a Llama-family folder can hold this model: GPT-2 cannot hold "
                              f"{'; '.join(gpt2_problems)}, and {error}") from None
        llama.export_folder(model, directory, write_tokenizer)
        return
    arrays = gpt2_arrays(model)
    end = model.tokenizer.end_token_id
    hf_config = {
        "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
        "vocab_size": config.vocab_size, "n_positions": config.block_size, "n_ctx": config.block_size,
        "n_embd": config.n_embd, "n_layer": config.n_layer, "n_head": config.n_head, "n_inner": None,
        "activation_function": "gelu_new", "layer_norm_epsilon": LAYER_NORM_EPSILON,
        "resid_pdrop": config.dropout, "embd_pdrop": config.dropout, "attn_pdrop": config.attention_dropout,
        "initializer_range": 0.02, "scale_attn_weights": True, "tie_word_embeddings": True, "use_cache": True,
        "bos_token_id": end, "eos_token_id": end,
    }
    with atomic_directory(directory) as folder:
        (folder / "config.json").write_text(json.dumps(hf_config, indent=2))
        save_file({name: np.ascontiguousarray(array) for name, array in arrays.items()},
                  str(folder / "model.safetensors"), metadata={"format": "pt"})
        write_tokenizer(folder)


def _not_gpt2(config):
    """What of a GPT's settings GPT-2's layout cannot hold, as a list of reasons (none: it is GPT-2's)."""
    return [reason for failed, reason in [
        (config.position != "learned", f"{config.position} positions (GPT-2 learns a table)"),
        (config.norm != "layer", "RMSNorm (GPT-2 uses LayerNorm)"),
        (config.norm_epsilon != LAYER_NORM_EPSILON, f"a norm epsilon of {config.norm_epsilon}"),
        (config.mlp != "gelu", "a SwiGLU feed-forward (GPT-2's is GELU)"),
        (config.mlp_hidden_size not in (None, 4 * config.n_embd), f"a feed-forward width of {config.mlp_hidden_size}"),
        (config.kv_heads != config.n_head, "grouped-query attention"),
        (config.head_dim not in (None, config.n_embd // config.n_head), f"heads {config.head_dim} wide"),
        (config.qk_norm, "QK-norm"),
        (config.qkv_bias not in (None, config.bias), "biases on some projections only"),
        (not config.tie_weights, "an output head of its own (`tie_weights=False`)"),
    ] if failed]


def _check_exportable(model):
    if model.writes_targets:
        raise ConfigError(f"only a GPT has GPT-2's form, not a {type(model).__name__}")
    problems = _not_gpt2(model.config)
    if problems:
        raise ConfigError(f"GPT-2's layout cannot hold {'; '.join(problems)}")


def _write_hugging_face_tokenizer(tokenizer, folder, block_size):
    tokenizer_config = {"model_max_length": block_size, "add_prefix_space": False}
    if isinstance(tokenizer, BPETokenizer):
        vocabulary, merges = vocabulary_and_merges(tokenizer)
        (folder / "vocab.json").write_text(json.dumps(vocabulary, ensure_ascii=False), encoding="utf-8")
        (folder / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n", encoding="utf-8")
        (folder / "tokenizer.json").write_text(bpe_tokenizer(vocabulary, merges).definition, encoding="utf-8")
        end = BPETokenizer.END_TOKEN
        tokenizer_config.update(tokenizer_class="GPT2Tokenizer", bos_token=end, eos_token=end, unk_token=end)
    else:
        (folder / "tokenizer.json").write_text(_char_definition(tokenizer), encoding="utf-8")
        tokenizer_config.update(tokenizer_class="PreTrainedTokenizerFast")
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2))


def _char_definition(tokenizer):
    """A `tokenizers` definition that encodes one id per character, as a CharTokenizer does."""
    from tokenizers import AddedToken, Tokenizer, decoders, models

    specials = [f"<{name}>" for name in tokenizer.special_tokens]
    vocabulary = {token: index for index, token in enumerate(specials + list(tokenizer.vocabulary))}
    # A BPE model without merges: every character is a token of its own, and the text is one
    # word (no pre-tokenizer), so nothing is split off or dropped; Fuse joins the pieces back.
    char_tokenizer = Tokenizer(models.BPE(vocabulary, []))
    char_tokenizer.decoder = decoders.Fuse()
    if specials:
        char_tokenizer.add_special_tokens([AddedToken(token, special=True) for token in specials])
    return char_tokenizer.to_str()


# --- KerasHub presets

def _read_kerashub(preset):
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
        reason = _first_line(error)
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
    tokenizer = bpe_tokenizer(hub_tokenizer.vocabulary, hub_tokenizer.merges)
    return shape, tokenizer, _kerashub_arrays(backbone)


def _first_line(error, limit=200):
    """An exception's message as one line, cut at a word if long."""
    lines = str(error).strip().splitlines() or [type(error).__name__]
    line = lines[0]
    return line if len(line) <= limit else line[:limit].rsplit(" ", 1)[0] + " ..."


def _kerashub_arrays(backbone):
    """A GPT2Backbone's weights under GPT-2's names."""
    return {name: np.concatenate([np.asarray(_value(part), np.float32).reshape(shape) for part in parts], axis=-1)
            for name, (parts, shape) in _kerashub_parts(backbone).items()}


def _kerashub_parts(backbone):
    """Where a GPT2Backbone keeps each of GPT-2's weights: name -> (variables, the shape each has in GPT-2).

    GPT-2's weight is the variables reshaped and joined along the last axis:
    its fused query/key/value kernel (C, 3C) and bias (3C,) are KerasHub's
    three (C, H, D) kernels and (H, D) biases; its attention output kernel
    (C, C) is KerasHub's (H, D, C); every other weight is one variable as it is.
    """
    width = backbone.hidden_dim

    def whole(variable):
        return [variable], tuple(variable.shape)

    parts = {"wte.weight": whole(backbone.token_embedding.embeddings),
             "wpe.weight": whole(backbone.position_embedding.position_embeddings),
             "ln_f.weight": whole(backbone.layer_norm.gamma), "ln_f.bias": whole(backbone.layer_norm.beta)}
    for index, layer in enumerate(backbone.transformer_layers):
        prefix = f"h.{index}."
        attention = layer._self_attention_layer
        query_key_value = (attention.query_dense, attention.key_dense, attention.value_dense)
        parts[prefix + "attn.c_attn.weight"] = [dense.kernel for dense in query_key_value], (width, width)
        parts[prefix + "attn.c_attn.bias"] = [dense.bias for dense in query_key_value], (width,)
        parts[prefix + "attn.c_proj.weight"] = [attention.output_dense.kernel], (width, width)
        parts[prefix + "attn.c_proj.bias"] = whole(attention.output_dense.bias)
        for name, norm in (("ln_1.", layer._self_attention_layer_norm), ("ln_2.", layer._feedforward_layer_norm)):
            parts[prefix + name + "weight"], parts[prefix + name + "bias"] = whole(norm.gamma), whole(norm.beta)
        for name, dense in (("mlp.c_fc.", layer._feedforward_intermediate_dense),
                            ("mlp.c_proj.", layer._feedforward_output_dense)):
            parts[prefix + name + "weight"], parts[prefix + name + "bias"] = whole(dense.kernel), whole(dense.bias)
    return parts


def export_kerashub(model, directory):
    """Write a GPT as a KerasHub GPT-2 preset folder, which `keras_hub.models.GPT2CausalLM.from_preset` loads.

    KerasHub's GPT-2 tokenizer is byte-level BPE: a model with a char
    tokenizer is refused. The folder appears whole or not at all.
    """
    import keras_hub

    _check_exportable(model)
    vocabulary, merges = vocabulary_and_merges(model.tokenizer)
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
