"""The page's forms of the tokenizers: what page/gptlite.js reads to split, encode and decode text as gptlite does,
translated from a tokenizer's own description of itself (`Tokenizer.description`), and the browser's dialect of
regular expressions that translation needs.
"""

import json
import re

from gptlite.errors import ConfigError
from gptlite.text.bpe import merges_of

# Unicode's White_Space characters: what `\s` matches in the `tokenizers` library's patterns. A browser's `\s`
# differs (it takes U+FEFF and leaves U+0085), so the page's patterns name them.
WHITESPACE = "\\t\\n\\x0b\\x0c\\r \\x85\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000"
# GPT-2's splitting, which a ByteLevel pre-tokenizer applies where it `use_regex`.
GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"


WEB_KINDS = ("the web page reads byte-level BPE (gptlite's own, GPT-2's, SmolLM2's, Qwen's), SentencePiece-style "
              "BPE that puts \"▁\" before a text and for each space (Llama's, TinyLlama's) and character "
              "vocabularies; this model's tokenizer is of another kind")


def web_form(tokenizer):
    """What the page's tokenizer (page/gptlite.js) reads of `tokenizer`, from its one description of itself
    (`Tokenizer.description`): a character vocabulary as it is; a `tokenizers` library definition as byte-level or
    SentencePiece-style BPE, whichever it is. Any other is a ConfigError that says what the page reads."""
    described = tokenizer.description()
    if described["kind"] == "characters":
        return {name: described[name] for name in ("kind", "specials", "characters", "added")}
    definition = json.loads(described["definition"])
    if (definition.get("model") or {}).get("byte_fallback"):
        return sentencepiece_web_form(definition)
    return byte_level_web_form(definition)


def byte_level_web_form(definition):
    """A byte-level BPE tokenizer.json as the page reads it: its splitting as browser patterns (each isolates its
    matches from the text between them, in turn), its vocabulary, merges and added tokens. A tokenizer whose
    splitting or model the page does not follow is a ConfigError."""
    model = definition.get("model") or {}
    if model.get("type") != "BPE" or '"ByteLevel"' not in json.dumps(definition.get("pre_tokenizer")) \
            or definition.get("normalizer") is not None or model.get("continuing_subword_prefix") \
            or model.get("end_of_word_suffix") or model.get("dropout"):
        raise ConfigError(WEB_KINDS)
    pre_tokenizer = definition["pre_tokenizer"]
    splits = []
    for step in pre_tokenizer.get("pretokenizers", [pre_tokenizer]):
        kind = step.get("type")
        if kind == "ByteLevel":
            if step.get("add_prefix_space"):
                raise ConfigError("the web page's tokenizer puts no space before a text; this one's does")
            if step.get("use_regex", True):
                splits.append(browser_pattern(GPT2_SPLIT))
        elif kind == "Digits":
            splits.append(r"\p{N}" if step.get("individual_digits") else r"\p{N}+")
        elif kind == "Split" and "Regex" in step.get("pattern", {}) and step.get("behavior") == "Isolated" \
                and not step.get("invert"):
            splits.append(browser_pattern(step["pattern"]["Regex"]))
        else:
            raise ConfigError(f"the web page's tokenizer cannot split text as this one does ({kind})")
    return {"kind": "byte_level_bpe", "splits": splits, "vocabulary": model["vocab"], "merges": merges_of(model),
            "ignore_merges": bool(model.get("ignore_merges")),
            "added": {token["content"]: token["id"] for token in definition.get("added_tokens", [])}}


def sentencepiece_web_form(definition):
    """A SentencePiece-style BPE tokenizer.json (Llama's, TinyLlama's) as the page reads it: its vocabulary,
    merges, added tokens and unknown token. The page follows the normalizer these files have ("▁" before each
    text, "▁" for each space), BPE over the whole text, and bytes as <0xXX> tokens for characters the vocabulary
    lacks; a tokenizer.json otherwise made is a ConfigError."""
    model = definition.get("model") or {}
    normalizers = (definition.get("normalizer") or {}).get("normalizers", [])
    follows = [step.get("type") for step in normalizers] == ["Prepend", "Replace"] and \
        normalizers[0].get("prepend") == "▁" and normalizers[1].get("pattern", {}).get("String") == " " and \
        normalizers[1].get("content") == "▁"
    if model.get("type") != "BPE" or not model.get("byte_fallback") or not follows \
            or definition.get("pre_tokenizer") is not None or model.get("dropout"):
        raise ConfigError(WEB_KINDS)
    added = {token["content"]: token["id"] for token in definition.get("added_tokens", [])}
    return {"kind": "sentencepiece_bpe", "vocabulary": model["vocab"], "merges": merges_of(model), "added": added,
            "unknown": model["vocab"].get(model.get("unk_token"), added.get(model.get("unk_token")))}


def browser_pattern(pattern):
    """A `tokenizers` (Oniguruma) splitting pattern as a browser's regular expression (flags "gu"): `\\s` as
    Unicode's White_Space, and case-blind groups `(?i:...)` of plain letters spelled out."""
    def case_blind(match):
        return "(?:" + re.sub(r"[A-Za-z]", lambda letter: f"[{letter[0].lower()}{letter[0].upper()}]",
                              match[1]) + ")"

    pattern = re.sub(r"\(\?i:([A-Za-z'|]*)\)", case_blind, pattern)
    if "(?i" in pattern:
        raise ConfigError("the web page's tokenizer cannot follow this tokenizer's case-blind splitting")
    out, in_class = [], False
    index = 0
    while index < len(pattern):
        character = pattern[index]
        if character == "\\" and index + 1 < len(pattern):
            escaped = pattern[index + 1]
            if escaped == "s":
                out.append(WHITESPACE if in_class else f"[{WHITESPACE}]")
            elif escaped == "S":
                if in_class:
                    raise ConfigError("the web page's tokenizer cannot follow \\S within a class")
                out.append(f"[^{WHITESPACE}]")
            else:
                out.append(pattern[index:index + 2])
            index += 2
            continue
        if character == "[" and not in_class:
            in_class = True
        elif character == "]" and in_class:
            in_class = False
        out.append(character)
        index += 1
    return "".join(out)
