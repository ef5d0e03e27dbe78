"""Llama-family Hugging Face folders in and out: `LlamaForCausalLM` (SmolLM2, TinyLlama),
`Qwen2ForCausalLM` (Qwen2.5) and `Qwen3ForCausalLM` become a gptlite `GPT`, and such a GPT is written back
as one.

All are gptlite's GPT with rotary positions, RMSNorm, a SwiGLU feed-forward
and grouped-query attention; Qwen2 adds biases to the query, key and value
projections, Qwen3 QK-norm. Hugging Face keeps query, key and value apart, and gate and up
apart, each as a (out, in) matrix; gptlite fuses each group into one
projection with (in, out) kernels. `_places` is the one table of where each
tensor of the folder lives in the GPT, which import and export both read.
Both lay a head's rotary pairs out the same way (dimension i with i + D/2),
so the weights need no permuting.
"""

import json

import numpy as np

from gptlite.errors import ConfigError, InputError, MissingFileError
from gptlite.files import atomic_directory, read_json
from gptlite.model.config import GPTConfig, MLP_KINDS
from gptlite.model.layers import weight_array
from gptlite.text.bpe import PretrainedTokenizer

# model_type -> the class name transformers gives it.
ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}
# Tensors of some folders that are not weights: rotary frequencies that a model recomputes.
_NOT_WEIGHTS = ("rotary_emb.inv_freq",)
_SAFETENSORS_TYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "BF16": "bfloat16"}


def settings_from_config(config, folder):
    """gptlite's shape settings for a Llama, Qwen2 or Qwen3 config.json (a dict), or an `InputError` naming
    each part of it that gptlite's GPT cannot express."""
    model_type = config["model_type"]
    missing = [key for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                               "vocab_size") if key not in config]
    if missing:
        raise InputError(f"{folder}/config.json lacks {', '.join(missing)}")
    width, heads = config["hidden_size"], config["num_attention_heads"]
    rope = config.get("rope_parameters") or {}  # transformers 5 keeps rope_theta here
    scaling = config.get("rope_scaling") or {}
    scaling_type = scaling.get("rope_type", scaling.get("type")) or rope.get("rope_type", "default")
    attention_bias, mlp_bias = config.get("attention_bias", False), config.get("mlp_bias", False)
    unsupported = [
        (config.get("hidden_act", "silu") != "silu", f"the activation {config.get('hidden_act')!r} (SwiGLU uses silu)"),
        (scaling_type != "default", f"rope scaling of type {scaling_type!r}"),
        (bool(config.get("use_sliding_window")) or
         any(kind != "full_attention" for kind in config.get("layer_types") or ()), "sliding-window attention"),
        (any(key in config for key in ("num_experts", "num_local_experts")), "a mixture of experts"),
        (model_type == "llama" and attention_bias != mlp_bias,
         "biases in attention but not in the feed-forward, or the other way round"),
        (model_type == "qwen3" and attention_bias, "biases in attention but not in the feed-forward"),
    ]
    reasons = [reason for failed, reason in unsupported if failed]
    if reasons:
        raise InputError(f"{folder}: gptlite's GPT cannot express {'; '.join(reasons)}")
    qwen = model_type == "qwen2"
    settings = dict(
        n_layer=config["num_hidden_layers"], n_head=heads, n_embd=width,
        n_kv_head=config.get("num_key_value_heads") or heads,
        block_size=config.get("max_position_embeddings", 32768 if qwen else 2048),
        position="rotary", rope_theta=float(config.get("rope_theta", rope.get("rope_theta", GPTConfig.rope_theta))),
        norm="rms", norm_epsilon=float(config.get("rms_norm_eps", 1e-6)), mlp="swiglu",
        mlp_hidden_size=config["intermediate_size"], tie_weights=bool(config.get("tie_word_embeddings", False)),
        bias=model_type == "llama" and bool(attention_bias), qkv_bias=True if qwen else None,
        qk_norm=model_type == "qwen3", dropout=0.0,
        # Set only where the heads are not hidden_size / num_attention_heads wide (as in Qwen3's releases).
        head_dim=None if config.get("head_dim") in (None, width // heads) else config["head_dim"],
    )
    try:  # what the settings themselves forbid (an odd head size, heads that do not share evenly), named here
        GPTConfig(vocab_size=config["vocab_size"], **settings)
    except ConfigError as error:
        raise InputError(f"{folder}/config.json: {error}") from None
    return settings


def family_of(config):
    """The folder kind a GPT's settings (`GPTConfig`) can be written as: "llama", "qwen2" or "qwen3";
    a `ConfigError` naming what none can hold."""
    reasons = [reason for failed, reason in [
        (config.position != "rotary", f"{config.position} positions (they use rotary ones)"),
        (config.norm != "rms", "LayerNorm (they use RMSNorm)"),
        (config.norm_position != "pre", "post-norm blocks (they normalise before each sublayer)"),
        (config.mlp != "swiglu", f"a {MLP_KINDS[config.mlp].name} feed-forward (they use SwiGLU)"),
        (config.qk_norm and (config.bias or config.qkv_bias), "QK-norm with biases"),
        (config.bias and config.qkv_bias is False, "biases everywhere but on the query, key and value projections"),
    ] if failed]
    if reasons:
        raise ConfigError(f"a Llama, Qwen2 or Qwen3 folder cannot hold {'; '.join(reasons)}")
    # Qwen2's biases are on the query, key and value projections only; Llama's are everywhere or nowhere;
    # Qwen3 has QK-norm and no biases.
    if config.qk_norm:
        return "qwen3"
    return "qwen2" if config.qkv_bias and not config.bias else "llama"


def _places(model):
    """Where each tensor of a Llama, Qwen2 or Qwen3 folder lives in a GPT: name -> (layer, attribute, columns,
    transposed): the tensor is `getattr(layer, attribute)[..., columns]`, transposed where Hugging Face keeps
    (out, in) matrices. Layers without biases have no bias names."""
    config = model.config
    queries, keys = config.n_head * config.head_size, config.kv_heads * config.head_size
    token_embedding = model.embedding.token_embedding
    places = {"model.embed_tokens.weight": (token_embedding, "embeddings", None, False),
              "model.norm.weight": (model.final_norm, "gamma", None, False)}
    if not config.tie_weights:
        places["lm_head.weight"] = (token_embedding, "reverse_embeddings", None, True)
    for index, block in enumerate(model.blocks):
        attention, feed_forward = block.attention, block.feed_forward
        hidden = feed_forward.contract.kernel.shape[0]
        parts = {
            "self_attn.q_proj": (attention.qkv_projection, slice(0, queries)),
            "self_attn.k_proj": (attention.qkv_projection, slice(queries, queries + keys)),
            "self_attn.v_proj": (attention.qkv_projection, slice(queries + keys, queries + 2 * keys)),
            "self_attn.o_proj": (attention.output_projection, None),
            "mlp.gate_proj": (feed_forward.expand, slice(0, hidden)),
            "mlp.up_proj": (feed_forward.expand, slice(hidden, 2 * hidden)),
            "mlp.down_proj": (feed_forward.contract, None),
        }
        prefix = f"model.layers.{index}."
        for name, (layer, columns) in parts.items():
            places[f"{prefix}{name}.weight"] = (layer, "kernel", columns, True)
            if layer.bias is not None:
                places[f"{prefix}{name}.bias"] = (layer, "bias", columns, False)
        if attention.config.qk_norm:
            places[f"{prefix}self_attn.q_norm.weight"] = (attention.query_norm, "gamma", None, False)
            places[f"{prefix}self_attn.k_norm.weight"] = (attention.key_norm, "gamma", None, False)
        places[f"{prefix}input_layernorm.weight"] = (block.attention_norm, "gamma", None, False)
        places[f"{prefix}post_attention_layernorm.weight"] = (block.feed_forward_norm, "gamma", None, False)
    return places


def hugging_face_arrays(model):
    """A GPT's weights under a Llama, Qwen2 or Qwen3 folder's names, as float32 numpy arrays."""
    arrays = {}
    for name, (layer, attribute, columns, transposed) in _places(model).items():
        value = weight_array(layer, attribute)
        value = value if columns is None else value[..., columns]
        arrays[name] = np.ascontiguousarray(value.T if transposed else value)
    return arrays


def load_hugging_face_arrays(model, arrays):
    """Set a built GPT's weights from a Llama, Qwen2 or Qwen3 folder's tensors (as `hugging_face_arrays` gives).

    A missing, extra or misshapen tensor is an `InputError` naming it.
    """
    arrays = {name: value for name, value in arrays.items() if not name.endswith(_NOT_WEIGHTS)}
    places = _places(model)
    if model.config.tie_weights:
        arrays.pop("lm_head.weight", None)  # some folders keep the tied head a second time
    missing = sorted(set(places) - set(arrays))
    if missing:
        raise InputError(f"the weights lack {', '.join(missing[:3])}{' and more' if len(missing) > 3 else ''}")
    extra = sorted(set(arrays) - set(places))
    if extra:
        raise InputError(f"the weights hold {', '.join(extra[:3])}, which this model has no place for")
    assembled = {}  # (layer, attribute) -> the whole array
    for name, (layer, attribute, columns, transposed) in places.items():
        weight = getattr(layer, attribute)
        whole = assembled.setdefault((id(layer), attribute), (weight, np.zeros(weight.shape, np.float32)))[1]
        value = np.asarray(arrays[name], np.float32)
        value = value.T if transposed else value
        target = whole if columns is None else whole[..., columns]
        if value.shape != target.shape:
            shape = target.T.shape if transposed else target.shape
            raise InputError(f"{name} has shape {tuple(np.shape(arrays[name]))}; the model needs {tuple(shape)}")
        target[...] = value
    for weight, value in assembled.values():
        weight.assign(value.astype(weight.dtype))


# --- reading a folder

def read_folder(folder, config):
    """(shape settings, tokenizer, arrays) of a Llama, Qwen2 or Qwen3 Hugging Face folder whose config.json is
    `config`."""
    shape = settings_from_config(config, folder)
    tokenizer = read_tokenizer(folder, config["vocab_size"], config)
    return shape, tokenizer, read_safetensors_folder(folder)


def read_tokenizer(folder, vocabulary_size, config=None):
    """The `PretrainedTokenizer` of a folder's tokenizer.json, with the beginning and end tokens and the chat
    template that tokenizer_config.json (or chat_template.jinja) names."""
    path = folder / "tokenizer.json"
    if not path.is_file():
        raise MissingFileError(f"{folder} has no tokenizer.json")
    try:
        definition = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise InputError(f"{path} is not UTF-8 text") from None
    tokenizer_config = {}
    if (folder / "tokenizer_config.json").is_file():
        tokenizer_config = read_json(folder / "tokenizer_config.json")
    template = tokenizer_config.get("chat_template")
    if (folder / "chat_template.jinja").is_file():
        template = (folder / "chat_template.jinja").read_text(encoding="utf-8")
    if isinstance(template, list):  # several named templates: the default one
        template = next((item.get("template") for item in template if item.get("name") == "default"), None)
    tokens = {}
    for role in ("bos", "eos"):
        token = tokenizer_config.get(f"{role}_token")
        tokens[role] = token.get("content") if isinstance(token, dict) else token
    try:
        from tokenizers import Tokenizer

        library = Tokenizer.from_str(definition)
    except Exception as error:  # the library raises its own error for a definition it cannot read
        raise InputError(f"{path} cannot be read as a tokenizer: {str(error).splitlines()[0]}") from None
    for role in ("bos", "eos"):  # config.json's ids, where tokenizer_config.json names no token
        token_id = (config or {}).get(f"{role}_token_id")
        if tokens[role] is None and isinstance(token_id, int):
            tokens[role] = library.id_to_token(token_id)
    return PretrainedTokenizer(definition, vocabulary_size, begin_token=tokens["bos"], end_token=tokens["eos"],
                               chat_template=template)


def read_safetensors_folder(folder):
    """Every tensor of a folder's model.safetensors, or of the shards its model.safetensors.index.json names."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        weight_map = read_json(index).get("weight_map")
        if not isinstance(weight_map, dict):
            raise InputError(f"{index} has no weight_map")
        arrays = {}
        for shard in sorted(set(weight_map.values())):
            if not (folder / shard).is_file():
                raise MissingFileError(f"{folder} lacks {shard}, a part of its weights that {index.name} names")
            arrays.update(read_safetensors(folder / shard))
        return arrays
    if (folder / "model.safetensors").is_file():
        return read_safetensors(folder / "model.safetensors")
    raise MissingFileError(f"{folder} has no weights: model.safetensors, or model.safetensors.index.json with "
                           f"its shards")


def read_safetensors(path):
    """A .safetensors file's tensors as float32 numpy arrays, bfloat16 and float16 ones included, without torch.

    The format is an 8-byte little-endian header length, a JSON header naming each
    tensor's dtype, shape and byte range, and the bytes.
    """
    import ml_dtypes

    try:
        with open(path, "rb") as file:
            header_length = int.from_bytes(file.read(8), "little")
            if not 2 <= header_length <= 100_000_000:
                raise ValueError("no safetensors header")
            header = json.loads(file.read(header_length))
            data = np.fromfile(file, dtype=np.uint8)
        arrays = {}
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            kind = _SAFETENSORS_TYPES.get(entry["dtype"])
            if kind is None:
                raise InputError(f"{path}: {name} holds {entry['dtype']} numbers; gptlite reads F32, F16 and BF16")
            begin, end = entry["data_offsets"]
            if end > len(data):
                raise ValueError(f"{name} runs past the end of the file")
            dtype = ml_dtypes.bfloat16 if kind == "bfloat16" else kind
            arrays[name] = data[begin:end].view(dtype).reshape(entry["shape"]).astype(np.float32)
        return arrays
    except (ValueError, KeyError, TypeError) as error:
        raise InputError(f"{path} cannot be read ({error}): is it damaged or cut short?") from None


# --- writing a folder

def export_folder(model, directory, write_tokenizer):
    """Write a GPT with a Llama-family layout as a Hugging Face Llama, Qwen2 or Qwen3 folder; `write_tokenizer(folder)`
    writes the tokenizer's files. The folder appears whole or not at all."""
    from safetensors.numpy import save_file

    config = model.config
    family = family_of(config)
    tokenizer = model.tokenizer
    begin, end = getattr(tokenizer, "begin_token_id", None), tokenizer.end_token_id
    hf_config = {
        "architectures": [ARCHITECTURES[family]], "model_type": family, "vocab_size": config.vocab_size,
        "hidden_size": config.n_embd, "intermediate_size": model.blocks[0].feed_forward.contract.kernel.shape[0],
        "num_hidden_layers": config.n_layer, "num_attention_heads": config.n_head,
        "num_key_value_heads": config.kv_heads, "head_dim": config.head_size, "hidden_act": "silu",
        "max_position_embeddings": config.block_size, "rms_norm_eps": config.norm_epsilon,
        "rope_theta": config.rope_theta, "rope_scaling": None, "tie_word_embeddings": config.tie_weights,
        "attention_dropout": config.attention_dropout, "initializer_range": 0.02, "use_cache": True,
        "bos_token_id": begin if begin is not None else end, "eos_token_id": end, "torch_dtype": "float32",
    }
    if family == "llama":
        hf_config.update(attention_bias=config.bias, mlp_bias=config.bias, pretraining_tp=1)
    elif family == "qwen3":
        hf_config.update(attention_bias=False, use_sliding_window=False, sliding_window=None,
                         max_window_layers=config.n_layer)
    else:
        hf_config.update(use_sliding_window=False, sliding_window=None, max_window_layers=config.n_layer)
    arrays = hugging_face_arrays(model)
    with atomic_directory(directory) as folder:
        (folder / "config.json").write_text(json.dumps(hf_config, indent=2))
        (folder / "generation_config.json").write_text(json.dumps(
            {"bos_token_id": hf_config["bos_token_id"], "eos_token_id": end}, indent=2))
        save_file(arrays, str(folder / "model.safetensors"), metadata={"format": "pt"})
        write_tokenizer(folder)
