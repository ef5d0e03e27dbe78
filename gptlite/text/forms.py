"""Tokenizers as other programs hold them: the fields a GGUF file says of one (llama.cpp's tokenizer models) and
the files of its Hugging Face form. Each tokenizer asks here for its own (`Tokenizer.gguf_fields`,
`Tokenizer.hugging_face_files`); the exports ask the tokenizer.
"""

import json
import re

from gptlite.errors import ConfigError

# How Qwen2's tokenizer splits text before merging (its tokenizer.json's Split pattern): llama.cpp's "qwen2".
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"
               r"\s+(?!\S)|\s+")


# --- llama.cpp's GGUF fields: tokens, their types, merges; the exporter adds the special ids and template

def character_fields(tokenizer):
    """A character vocabulary as llama.cpp's `rwkv` tokenizer: the special tokens' names, each character, then the
    added tokens (a chat model's turn markers), each at gptlite's id."""
    from gguf import TokenType

    specials = [f"<{name}>" for name in tokenizer.special_tokens]
    tokens = specials + [rwkv_escaped(character) for character in tokenizer.vocabulary] + \
        [rwkv_escaped(token) for token in tokenizer.added_tokens]
    types = [TokenType.CONTROL] * len(specials) + [TokenType.NORMAL] * len(tokenizer.vocabulary) + \
        [TokenType.CONTROL] * len(tokenizer.added_tokens)
    return dict(model="rwkv", pre=None, tokens=tokens, types=types, merges=None, begin=None,
                end=tokenizer.end_token_id, add_begin=False)


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


def merges_of(model):
    """A tokenizer.json model's merges as GPT-2's merges.txt writes them ("a b"), whichever form it holds them in."""
    return [" ".join(merge) if isinstance(merge, list) else merge for merge in model.get("merges", [])]


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




# --- Hugging Face's tokenizer files, by name

def character_files(tokenizer, block_size):
    """A character vocabulary as a tokenizer.json with one token per character, and its tokenizer_config.json."""
    config = {"model_max_length": block_size, "add_prefix_space": False, "tokenizer_class": "PreTrainedTokenizerFast"}
    return {"tokenizer.json": _character_definition(tokenizer), "tokenizer_config.json": json.dumps(config, indent=2)}


def _character_definition(tokenizer):
    """A `tokenizers` definition that encodes one id per character, as a CharTokenizer does."""
    from tokenizers import AddedToken, decoders, models, Tokenizer

    specials = [f"<{name}>" for name in tokenizer.special_tokens]
    vocabulary = {token: index for index, token in enumerate(specials + list(tokenizer.vocabulary))}
    # A BPE model without merges: every character is a token of its own, and the text is one
    # word (no pre-tokenizer), so nothing is split off or dropped; Fuse joins the pieces back.
    char_tokenizer = Tokenizer(models.BPE(vocabulary, []))
    char_tokenizer.decoder = decoders.Fuse()
    if specials:
        char_tokenizer.add_special_tokens([AddedToken(token, special=True) for token in specials])
    return char_tokenizer.to_str()


def gpt2_files(tokenizer, block_size):
    """A byte-level BPE tokenizer as GPT-2's vocab.json and merges.txt, with a tokenizer.json of the same and its
    tokenizer_config.json."""
    vocabulary, merges = tokenizer.byte_level_bpe()
    end = tokenizer.END_TOKEN
    config = {"model_max_length": block_size, "add_prefix_space": False, "tokenizer_class": "GPT2Tokenizer",
              "bos_token": end, "eos_token": end, "unk_token": end}
    return {"vocab.json": json.dumps(vocabulary, ensure_ascii=False),
            "merges.txt": "#version: 0.2\n" + "\n".join(merges) + "\n",
            "tokenizer.json": type(tokenizer).from_vocabulary_and_merges(vocabulary, merges).definition,
            "tokenizer_config.json": json.dumps(config, indent=2)}


def pretrained_files(tokenizer, block_size):
    """A pretrained model's tokenizer as its own tokenizer.json, and a tokenizer_config.json with its special tokens
    and chat template."""
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": block_size,
              "bos_token": tokenizer.begin_token, "eos_token": tokenizer.end_token,
              "add_bos_token": bool(tokenizer.text_start_ids)}
    if tokenizer.chat_template is not None:
        config["chat_template"] = tokenizer.chat_template
    return {"tokenizer.json": tokenizer.definition,
            "tokenizer_config.json": json.dumps(config, indent=2, ensure_ascii=False)}
