"""Pretrained weights in and out: a Hugging Face GPT-2, Llama, Qwen2 or Qwen3
folder, a KerasHub GPT-2 preset or a saved gptlite model becomes a gptlite `GPT`,
and a gptlite GPT is written back as a Hugging Face folder. This module
chooses and reads what the families share (a Hugging Face folder's weights
and tokenizer); each family's layout is its own module's: `gptlite.weights.gpt2`
(and KerasHub's GPT-2 presets) and `gptlite.weights.llama`.
"""

import dataclasses
import json
import os
import pathlib

import numpy as np

from gptlite.errors import ConfigError, first_line, InputError, MissingFileError
from gptlite.files import atomic_directory, read_json
from gptlite.model.gpt import check_use, GPT
from gptlite.text import templates
from gptlite.text.bpe import BPETokenizer
from gptlite.text.tokenizers import CharTokenizer
from gptlite.weights import decoder_only, gpt2, llama, saving

def from_pretrained(name_or_path, block_size=None, dropout=None, dtype=None):
    """A gptlite `GPT` from pretrained weights, with its tokenizer.

    name_or_path: a gptlite `GPT` or `.keras` file; a Hugging Face GPT-2 folder
        (config.json, model.safetensors or pytorch_model.bin, and vocab.json
        with merges.txt or a tokenizer.json); a Hugging Face Llama, Qwen2 or Qwen3
        folder (config.json, model.safetensors or its shards, tokenizer.json;
        see `gptlite.weights.llama`); a KerasHub GPT-2 preset folder; or a KerasHub
        preset name such as "gpt2_base_en" (downloaded by keras-hub where a
        network is reachable).
    block_size: a shorter context than the model's: the position table, if any, is cut.
    dropout: the dropout to train with (default: a gptlite model's own, 0 for GPT-2).
    dtype: the Keras dtype policy to build it with (default: Keras's, float32).
    """
    named = isinstance(name_or_path, (str, os.PathLike))  # else a model
    path = pathlib.Path(name_or_path) if named else None
    source = None if named else name_or_path
    if path is not None and (path.is_file() or path.suffix == ".keras"):
        source = saving.load(path)
    if source is not None:
        check_use(source, "be fine-tuned", source=path or "the model")
    if source is not None:
        settings = {name: value for name, value in dataclasses.asdict(source.config).items() if name != "vocab_size"}
        tokenizer = source.tokenizer
    elif path.is_dir() and _is_hugging_face_folder(path):
        settings, tokenizer, arrays, load_arrays = _read_hugging_face(path)
    else:
        settings, tokenizer, arrays = gpt2.read_kerashub(name_or_path)
        load_arrays = gpt2.load_gpt2_arrays
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
    return (*_read_gpt2_folder(folder, config), gpt2.load_gpt2_arrays)


def _read_gpt2_folder(folder, config):
    """(shape settings, tokenizer, GPT-2's arrays) of a Hugging Face GPT-2 folder whose config.json is `config`."""
    shape = gpt2.shape_of(config, folder)
    return shape, _read_hugging_face_tokenizer(folder, config["vocab_size"]), _read_hugging_face_weights(folder)


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
    return _checked_size(BPETokenizer.from_vocabulary_and_merges(vocabulary, merges), vocabulary_size, folder)


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
            raise InputError(f"{folder / 'model.safetensors'} cannot be read ({first_line(error)}): is it "
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


@decoder_only("a Hugging Face folder of gptlite's (GPT-2, Llama, Qwen2 or Qwen3)")
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

    config = model.config

    def write_tokenizer(folder):
        for name, text in tokenizer_files(model.tokenizer.description(), config.block_size).items():
            (folder / name).write_text(text, encoding="utf-8")

    gpt2_problems = gpt2.not_gpt2(config)
    if gpt2_problems:
        try:
            llama.family_of(config)
        except ConfigError as error:
            raise ConfigError(f"neither GPT-2 nor a Llama-family folder can hold this model: GPT-2 cannot hold "
                              f"{'; '.join(gpt2_problems)}, and {error}") from None
        llama.export_folder(model, directory, write_tokenizer)
        return
    arrays, hf_config = gpt2.gpt2_arrays(model), gpt2.hugging_face_config(model)
    with atomic_directory(directory) as folder:
        (folder / "config.json").write_text(json.dumps(hf_config, indent=2))
        save_file({name: np.ascontiguousarray(array) for name, array in arrays.items()},
                  str(folder / "model.safetensors"), metadata={"format": "pt"})
        write_tokenizer(folder)


def chat_ready(model, seed=0):
    """The GPT `model` if its tokenizer has a chat template; else a copy with the default template, its turn
    markers added to the tokenizer as tokens of their own and the embedding grown by their rows."""
    tokenizer = model.tokenizer
    if tokenizer is None:
        raise ConfigError("the model has no tokenizer, so it cannot read conversations")
    if templates.template_of(tokenizer) is not None:
        return model
    return with_tokenizer(model, tokenizer.with_chat_tokens(templates.TURN_MARKERS, templates.DEFAULT_TEMPLATE),
                          seed)


# --- a tokenizer as Hugging Face holds it: its files, by name, made from its description of itself

def tokenizer_files(described, block_size):
    """A tokenizer's description of itself (`Tokenizer.description`) as the files of its Hugging Face form, by
    name: what `AutoTokenizer.from_pretrained` loads."""
    if described["kind"] == "characters":
        return character_files(described, block_size)
    return (gpt2_files if described["learned"] else pretrained_files)(described, block_size)


def character_files(described, block_size):
    """A character vocabulary as a tokenizer.json with one token per character, and its tokenizer_config.json."""
    config = {"model_max_length": block_size, "add_prefix_space": False, "tokenizer_class": "PreTrainedTokenizerFast"}
    return {"tokenizer.json": _character_definition(described),
            "tokenizer_config.json": json.dumps(config, indent=2)}


def _character_definition(described):
    """A `tokenizers` definition that encodes one id per character, as a CharTokenizer does."""
    from tokenizers import AddedToken, decoders, models, Tokenizer

    specials = described["specials"]
    vocabulary = {token: index for index, token in enumerate(specials + described["characters"])}
    # A BPE model without merges: every character is a token of its own, and the text is one
    # word (no pre-tokenizer), so nothing is split off or dropped; Fuse joins the pieces back.
    char_tokenizer = Tokenizer(models.BPE(vocabulary, []))
    char_tokenizer.decoder = decoders.Fuse()
    if specials:
        char_tokenizer.add_special_tokens([AddedToken(token, special=True) for token in specials])
    return char_tokenizer.to_str()


def gpt2_files(described, block_size):
    """A byte-level BPE tokenizer learned here as GPT-2's vocab.json and merges.txt, with a tokenizer.json of the
    same and its tokenizer_config.json."""
    vocabulary, merges = gpt2.vocabulary_and_merges(described)
    end = described["end_token"]
    config = {"model_max_length": block_size, "add_prefix_space": False, "tokenizer_class": "GPT2Tokenizer",
              "bos_token": end, "eos_token": end, "unk_token": end}
    return {"vocab.json": json.dumps(vocabulary, ensure_ascii=False),
            "merges.txt": "#version: 0.2\n" + "\n".join(merges) + "\n",
            "tokenizer.json": BPETokenizer.from_vocabulary_and_merges(vocabulary, merges).definition,
            "tokenizer_config.json": json.dumps(config, indent=2)}


def pretrained_files(described, block_size):
    """A pretrained model's tokenizer as its own tokenizer.json, and a tokenizer_config.json with its special tokens
    and chat template."""
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": block_size,
              "bos_token": described["begin_token"], "eos_token": described["end_token"],
              "add_bos_token": described["adds_begin"]}
    if described["chat_template"] is not None:
        config["chat_template"] = described["chat_template"]
    return {"tokenizer.json": described["definition"],
            "tokenizer_config.json": json.dumps(config, indent=2, ensure_ascii=False)}
