"""GGUF: a GPT as one file that llama.cpp runs, and with it Ollama, LM Studio and the programs built on them.

Written with `gguf`, llama.cpp's own library for the format. llama.cpp knows
an architecture by name and lays its tensors out its own way:
- GPT-2's layout (learned or sinusoidal positions, LayerNorm, GELU) is its
  `gpt2`: query, key and value fused as gptlite fuses them, every bias
  present (zeros where the model has none), the position table (a
  sinusoidal one written as the fixed table it is) as `position_embd`;
- the Llama family (rotary positions, RMSNorm, SwiGLU) is `llama`, `qwen2`
  (biases on query, key and value) or `qwen3` (QK-norm), with query, key and
  value apart, by way of `llama.hugging_face_arrays`. llama.cpp's `llama`
  turns a head's adjacent dimensions (2i, 2i + 1) together where gptlite
  turns i with i + D/2, so its query and key rows are reordered to match;
  `qwen2` and `qwen3` turn as gptlite does.
Matrices are written (out, in), as llama.cpp reads them; gptlite keeps (in, out).

The tokenizer travels in the file, so that llama.cpp gives the same ids:
- a character vocabulary as llama.cpp's `rwkv` tokenizer, which takes the
  longest token matching the text's bytes: with one token per character,
  each character's own id. It has no beginning or end-of-text token, as a
  character model has none. A character the model never saw has no token:
  llama.cpp gives an invalid id (-1) for it, which llama.cpp then refuses;
- byte-level BPE (gptlite's own, GPT-2's, SmolLM2's, Qwen's) as `gpt2`, with
  its merges and the pre-tokenizer llama.cpp knows by name;
- SentencePiece-style BPE with byte fallback (Llama's, TinyLlama's) as `llama`.
A chat model's template goes in as `tokenizer.chat_template`, its turn
markers as control tokens, its end of turn as the end-of-text token, so
llama.cpp's chat completion stops where `gptlite chat` does.

    gptlite.export_gguf(model, "mine.gguf", outtype="q8_0")
"""

import json
import pathlib
import re

import numpy as np

from gptlite.errors import ConfigError, RunExistsError
from gptlite.files import atomic_path
from gptlite.model.config import MLP_KINDS
from gptlite.model.layers import weight_array
from gptlite.text.bpe import merges_of
from gptlite.weights import decoder_only, GGUF_OUTTYPES, gpt2, llama

# How the matrices are stored (`GGUF_OUTTYPES`); norms and biases stay f32 in each, as llama.cpp's own
# converter keeps them.
OUTTYPES = GGUF_OUTTYPES
DEFAULT_OUTTYPE = "f16"
# How Qwen2's tokenizer splits text before merging (its tokenizer.json's Split pattern): llama.cpp's "qwen2".
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"
               r"\s+(?!\S)|\s+")


@decoder_only("a GGUF file (llama.cpp runs it)")
def export_gguf(model, path, outtype=DEFAULT_OUTTYPE):
    """Write a GPT as one GGUF file at `path` that llama.cpp loads and runs; an existing `path` is refused.

    outtype: "f32", "f16" (the default, as llama.cpp's converter) or "q8_0".
    A model llama.cpp cannot run (a Seq2Seq, a setting with no counterpart
    there) is a ConfigError naming what is missing; LoRA adapters are merged
    into the weights written. The file appears whole or not at all.
    """
    import gguf

    if outtype not in OUTTYPES:
        raise ConfigError(f"outtype must be one of {', '.join(OUTTYPES)}, got {outtype!r}")
    architecture = architecture_of(model.config)
    tensors = _gpt2_tensors(model) if architecture == "gpt2" else _llama_tensors(model, architecture)
    tokenizer = _tokenizer_fields(model.tokenizer, model.config.vocab_size)
    path = pathlib.Path(path)
    if path.exists():
        raise RunExistsError(f"{path} already exists; choose another `path`")
    with atomic_path(path) as temporary:
        writer = gguf.GGUFWriter(str(temporary), architecture)
        writer.add_name(path.name.removesuffix(".gguf") or "gptlite")
        writer.add_file_type({"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
                              "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[outtype])
        _add_shape(writer, architecture, model)
        _add_tokenizer(writer, tokenizer)
        for name, array in tensors:
            data, kind = _encoded(gguf, array, outtype if not name.startswith("position_embd") else "f32")
            writer.add_tensor(name, data, raw_dtype=kind)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()


def architecture_of(config):
    """llama.cpp's architecture for a GPT's settings: "gpt2", "llama", "qwen2" or "qwen3"; a ConfigError naming
    what neither GPT-2's nor the Llama family's layout can hold."""
    if config.position != "rotary":
        missing = [reason for failed, reason in [
            (config.norm != "layer", "RMSNorm with table positions"),
            (config.mlp != "gelu", f"a {MLP_KINDS[config.mlp].name} feed-forward with table positions"),
            (config.qk_norm, "QK-norm with table positions"),
            (config.norm_position != "pre", "post-norm blocks (gpt2's normalise before each sublayer)"),
            (config.head_dim not in (None, config.n_embd // config.n_head),
             f"heads {config.head_dim} wide with table positions"),
        ] if failed]
        if missing:
            raise ConfigError(f"llama.cpp has no architecture for {'; '.join(missing)} (its gpt2 takes LayerNorm, "
                              f"GELU and heads of n_embd / n_head; rotary models go as llama, qwen2 or qwen3)")
        return "gpt2"
    try:
        return llama.family_of(config)
    except ConfigError as error:
        raise ConfigError(f"llama.cpp has no architecture for this model: {error}") from None


# GPT-2's names (gpt2.layout_arrays) -> llama.cpp's tensor kinds; GPT-2 keeps these four matrices (in, out).
_GPT2_PARTS = {"wte": "TOKEN_EMBD", "wpe": "POS_EMBD", "ln_f": "OUTPUT_NORM", "ln_1": "ATTN_NORM",
               "attn.c_attn": "ATTN_QKV", "attn.c_proj": "ATTN_OUT", "ln_2": "FFN_NORM", "mlp.c_fc": "FFN_UP",
               "mlp.c_proj": "FFN_DOWN"}
_GPT2_IN_OUT = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


def _gpt2_tensors(model):
    """(GGUF name, float32 array) for llama.cpp's gpt2: every bias present, matrices (out, in)."""
    import gguf

    tensors = []
    for name, array in gpt2.layout_arrays(model).items():
        stem, suffix = name.rsplit(".", 1)
        index, part = stem.split(".", 2)[1:] if stem.startswith("h.") else (None, stem)
        gguf_name = gguf.TENSOR_NAMES[gguf.MODEL_TENSOR[_GPT2_PARTS[part]]].format(bid=index)
        tensors.append((f"{gguf_name}.{suffix}", np.ascontiguousarray(array.T if name.endswith(_GPT2_IN_OUT)
                                                                      else array)))
    if not model.config.tie_weights:  # GPT-2 has no name for an output head of its own
        tensors.append((gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.OUTPUT] + ".weight",
                        weight_array(model.embedding.token_embedding, "reverse_embeddings").T))  # (V, C)
    return tensors


# A Llama-family folder's tensor names (llama.hugging_face_arrays) -> llama.cpp's tensor kinds.
_LLAMA_PARTS = {"self_attn.q_proj": "ATTN_Q", "self_attn.k_proj": "ATTN_K", "self_attn.v_proj": "ATTN_V",
                "self_attn.o_proj": "ATTN_OUT", "self_attn.q_norm": "ATTN_Q_NORM", "self_attn.k_norm": "ATTN_K_NORM",
                "mlp.gate_proj": "FFN_GATE", "mlp.up_proj": "FFN_UP", "mlp.down_proj": "FFN_DOWN",
                "input_layernorm": "ATTN_NORM", "post_attention_layernorm": "FFN_NORM"}
_LLAMA_WHOLE = {"model.embed_tokens": "TOKEN_EMBD", "model.norm": "OUTPUT_NORM", "lm_head": "OUTPUT"}


def _llama_tensors(model, architecture):
    """(GGUF name, float32 array) for llama.cpp's llama, qwen2 or qwen3."""
    import gguf

    config = model.config
    tensors = []
    for name, array in llama.hugging_face_arrays(model).items():
        stem, suffix = name.rsplit(".", 1)
        if stem in _LLAMA_WHOLE:
            gguf_name = gguf.TENSOR_NAMES[gguf.MODEL_TENSOR[_LLAMA_WHOLE[stem]]]
        else:
            _, _, index, part = stem.split(".", 3)  # model.layers.N.part
            gguf_name = gguf.TENSOR_NAMES[gguf.MODEL_TENSOR[_LLAMA_PARTS[part]]].format(bid=int(index))
            if architecture == "llama" and part in ("self_attn.q_proj", "self_attn.k_proj"):
                array = _pairs_adjacent(array, config.n_head if part == "self_attn.q_proj" else config.kv_heads)
        tensors.append((f"{gguf_name}.{suffix}", np.ascontiguousarray(array)))
    return tensors


def _pairs_adjacent(rows, heads):
    """Query or key rows (H D, ...) of heads that pair dimension i with i + D/2, reordered so that each pair is
    two adjacent rows (2i, 2i + 1), as llama.cpp's `llama` rotates them."""
    halves = rows.reshape(heads, 2, rows.shape[0] // heads // 2, *rows.shape[1:])  # (H, 2, D/2, ...)
    return halves.swapaxes(1, 2).reshape(rows.shape)


def _add_shape(writer, architecture, model):
    config = model.config
    writer.add_context_length(config.block_size)
    writer.add_embedding_length(config.n_embd)
    writer.add_block_count(config.n_layer)
    writer.add_feed_forward_length(model.blocks[0].feed_forward.contract.kernel.shape[0])  # as built
    writer.add_head_count(config.n_head)
    writer.add_head_count_kv(config.kv_heads)
    writer.add_vocab_size(config.vocab_size)
    if architecture == "gpt2":
        writer.add_layer_norm_eps(config.norm_epsilon)
        return
    writer.add_layer_norm_rms_eps(config.norm_epsilon)
    writer.add_rope_dimension_count(config.head_size)
    writer.add_rope_freq_base(config.rope_theta)
    writer.add_key_length(config.head_size)
    writer.add_value_length(config.head_size)


def _encoded(gguf, array, outtype):
    """An array as the file holds it, and its GGUF type: matrices in `outtype` (q8_0 only where rows are whole
    blocks of 32, else f16), vectors in f32. The position table stays f32 too: llama.cpp's converter keeps it
    so, and llama.cpp's gpt2 reads it only so (a q8_0 table crashes it)."""
    kinds = gguf.GGMLQuantizationType
    array = np.ascontiguousarray(array, dtype=np.float32)
    if array.ndim < 2 or outtype == "f32":
        return array, kinds.F32
    if outtype == "q8_0" and array.shape[-1] % gguf.GGML_QUANT_SIZES[kinds.Q8_0][0] == 0:
        return gguf.quants.quantize(array, kinds.Q8_0), kinds.Q8_0
    return array.astype(np.float16), kinds.F16


# --- the tokenizer

def _tokenizer_fields(tokenizer, vocabulary_size):
    """What the file says of the tokenizer: a dict of its model, pre-tokenizer, tokens, types, merges, special
    ids, whether a text starts with the beginning token (from the tokenizer's description of itself,
    `described_fields`), and the chat template."""
    from gguf import TokenType
    from gptlite.text import templates

    fields = described_fields(tokenizer.description())
    tokens, types = fields["tokens"], fields["types"]
    # Ids past the tokenizer's own (Qwen pads its embedding) get placeholder tokens that nothing encodes to.
    for index in range(len(tokens), vocabulary_size):
        tokens.append(f"[PAD{index}]")
        types.append(TokenType.UNUSED)
    fields["chat_template"] = templates.template_of(tokenizer)
    if fields["chat_template"] is not None:
        # The answer's end is the end of text for llama.cpp: its chat completion stops there.
        end_of_turn = templates.turn_end(tokenizer)
        fields["end"] = tokens.index(rwkv_escaped(end_of_turn) if fields["model"] == "rwkv" else end_of_turn)
    return fields


def _add_tokenizer(writer, fields):
    writer.add_tokenizer_model(fields["model"])
    if fields["pre"] is not None:
        writer.add_tokenizer_pre(fields["pre"])
    writer.add_token_list(fields["tokens"])
    writer.add_token_types([int(kind) for kind in fields["types"]])
    if fields.get("scores") is not None:
        writer.add_token_scores(fields["scores"])
    if fields.get("space_prefix") is not None:
        writer.add_add_space_prefix(fields["space_prefix"])
    if fields.get("unknown") is not None:
        writer.add_unk_token_id(fields["unknown"])
    if fields["merges"] is not None:
        writer.add_token_merges(fields["merges"])
    if fields["begin"] is not None:
        writer.add_bos_token_id(fields["begin"])
    if fields["end"] is not None:
        writer.add_eos_token_id(fields["end"])
    writer.add_add_bos_token(fields["add_begin"])
    writer.add_add_eos_token(False)
    if fields["chat_template"] is not None:
        writer.add_chat_template(fields["chat_template"])


def described_fields(described):
    """A tokenizer's description of itself (`Tokenizer.description`) as llama.cpp's GGUF fields: its tokenizer
    model, pre-tokenizer, tokens, their types, merges and special ids."""
    if described["kind"] == "characters":
        return character_fields(described)
    definition = json.loads(described["definition"])
    byte_fallback = definition.get("model", {}).get("byte_fallback")
    fields = (sentencepiece_fields if byte_fallback else byte_level_fields)(definition)
    fields.update(end=described["end_id"], begin=described["begin_id"], add_begin=described["adds_begin"])
    return fields


def character_fields(described):
    """A character vocabulary (its description) as llama.cpp's `rwkv` tokenizer: the special tokens' names, each
    character, then the added tokens (a chat model's turn markers), each at gptlite's id."""
    from gguf import TokenType

    specials, characters, added = described["specials"], described["characters"], described["added"]
    tokens = specials + [rwkv_escaped(character) for character in characters] + \
        [rwkv_escaped(token) for token in added]
    types = [TokenType.CONTROL] * len(specials) + [TokenType.NORMAL] * len(characters) + \
        [TokenType.CONTROL] * len(added)
    return dict(model="rwkv", pre=None, tokens=tokens, types=types, merges=None, begin=None,
                end=described["end_id"], add_begin=False)


def rwkv_escaped(text):
    # llama.cpp reads an rwkv token's text with backslash escapes (\n, \t, \xhh); text without backslashes is
    # taken as it is, so only the backslash itself needs escaping.
    return text.replace("\\", "\\\\")


def byte_level_fields(definition):
    """A byte-level BPE tokenizer.json as llama.cpp's `gpt2` tokenizer, with llama.cpp's name for its splitting."""
    from gguf import TokenType

    model = definition.get("model", {})
    if model.get("type") != "BPE" or '"ByteLevel"' not in json.dumps(definition.get("pre_tokenizer")):
        raise ConfigError("byte-level BPE (GPT-2's, SmolLM2's, Qwen's, gptlite's own), SentencePiece-style BPE with "
                          "byte fallback (Llama's) and character vocabularies have a GGUF form here; this model's "
                          f"tokenizer is a {model.get('type')} of another kind")
    tokens, types = _vocabulary(definition, TokenType)
    return dict(model="gpt2", pre=_pre_tokenizer_name(definition.get("pre_tokenizer")), tokens=tokens,
                types=types, merges=merges_of(model))


def sentencepiece_fields(definition):
    """A SentencePiece-style BPE tokenizer.json (Llama's, TinyLlama's: "▁" for spaces, <0xXX> tokens for the
    bytes of characters it lacks) as llama.cpp's `llama` tokenizer. llama.cpp merges the adjacent pair whose
    joined text is the token of highest score: a token's score is minus the rank of the merge that makes it,
    so it merges in the order of the tokenizer's merges."""
    from gguf import TokenType

    model = definition["model"]
    if model.get("type") != "BPE" or "Prepend" not in json.dumps(definition.get("normalizer")):
        raise ConfigError("this SentencePiece-style tokenizer puts \"▁\" before a text otherwise than llama.cpp's "
                          "llama tokenizer does (a normalizer that prepends it), so it has no GGUF form here")
    tokens, types = _vocabulary(definition, TokenType)
    unknown = model.get("unk_token")
    for index, token in enumerate(tokens):
        if re.fullmatch(r"<0x[0-9A-F]{2}>", token) and types[index] in (TokenType.NORMAL, TokenType.CONTROL):
            types[index] = TokenType.BYTE
        elif token == unknown:
            types[index] = TokenType.UNKNOWN
    ranks = {"".join(merge.split(" ", 1)): rank for rank, merge in enumerate(merges_of(model))}
    scores = [-float(ranks.get(token, len(ranks) + index)) for index, token in enumerate(tokens)]
    return dict(model="llama", pre=None, tokens=tokens, types=types, merges=None, scores=scores, space_prefix=True,
                unknown=tokens.index(unknown) if unknown in tokens else None)


def _vocabulary(definition, TokenType):
    """A tokenizer.json's tokens by id, and their kinds: added tokens are control tokens, or user-defined ones
    where not special; ids with no token are unused placeholders."""
    vocabulary = dict(definition["model"]["vocab"])
    special = {}
    for token in definition.get("added_tokens", []):
        vocabulary[token["content"]] = token["id"]
        special[token["id"]] = token.get("special", True)
    size = max(vocabulary.values()) + 1
    tokens = [f"[PAD{index}]" for index in range(size)]
    types = [TokenType.UNUSED] * size
    for token, index in vocabulary.items():
        tokens[index] = token
        types[index] = (TokenType.CONTROL if special[index] else TokenType.USER_DEFINED) if index in special \
            else TokenType.NORMAL
    return tokens, types


def _pre_tokenizer_name(pre_tokenizer):
    """llama.cpp's name for a byte-level tokenizer's splitting: GPT-2's, SmolLM2's (digits apart first) or
    Qwen2's; another is a ConfigError, since llama.cpp would split text otherwise than the model learned."""
    steps = pre_tokenizer.get("pretokenizers", [pre_tokenizer]) if pre_tokenizer else []
    kinds = [step.get("type") for step in steps]
    if kinds == ["ByteLevel"] and steps[0].get("use_regex", True):
        return "gpt-2"
    if kinds == ["Digits", "ByteLevel"] and steps[0].get("individual_digits"):
        return "smollm"
    if kinds == ["Split", "ByteLevel"] and steps[0].get("pattern", {}).get("Regex") == QWEN2_SPLIT:
        return "qwen2"
    raise ConfigError(f"llama.cpp knows no name for this tokenizer's splitting ({' then '.join(map(str, kinds))}); "
                      f"GPT-2's, SmolLM2's and Qwen2's are written")
