"""Every step of a GPT's forward pass over a text, with its real numbers: `trace(model, text)`.

The trace is computed by the model's own layers, called one after another as the model calls them (its
embedding, each block's norms, projections, QK-norm and rotation, its feed-forward, the final norm and the
head), with the steps between them (the scores, the mask, the softmax, the weighted sum of the values) written
out in `keras.ops`, so that each can be kept. Its logits are the model's. The web page's Inside view shows a
trace, whether the page's own graph (`gptlite.web.inside_graph`) or this function computed it; in Jupyter a
`Trace` shows as that view (`gptlite.web.notebook`).

Shapes: T the text's tokens (its last block_size), C the width, H query heads, K key/value heads, D the head
size, F the feed-forward's width, V the vocabulary.
"""

import base64
import dataclasses
import math

import numpy as np
from keras import ops

from gptlite.decode import generation
from gptlite.decode.sampling import next_token_probabilities
from gptlite.decode.settings import SamplingConfig
from gptlite.errors import ConfigError, InputError
from gptlite.model.gpt import checked_model
from gptlite.model.positions import rotary_angles

# How many nearest tokens in the vocabulary a trace keeps for each token, by cosine and by dot product.
NEIGHBOURS = 10


@dataclasses.dataclass(frozen=True, eq=False)
class Trace:
    """A GPT's forward pass over `ids` (T,), step by step.

    `tokens`: each id's text; `window_start`: how many tokens of the text came before the window read (a text
    longer than the context is read as its last block_size tokens, as `attention_maps` reads it); `shape`: the
    model's settings the steps depend on (GPTConfig's fields, with kv_heads and head_size). `steps`: the
    steps before and after the blocks, by name (`STEPS`); `layers`: one dict a block, its steps by name
    (`LAYER_STEPS`). A step a model has not (QK-norm, a rotation, a position table) is absent.
    """

    ids: np.ndarray
    tokens: list
    window_start: int
    shape: dict
    steps: dict
    layers: list
    vocabulary: list

    def probabilities(self, position, sampling=None):
        """The next-token probabilities at `position` (V,), after `sampling`'s settings (a SamplingConfig, or a
        dict of its fields; None: temperature 1, nothing filtered): what the draw there picks from. Repetition
        penalty counts the tokens of the window up to `position`."""
        config = sampling if isinstance(sampling, SamplingConfig) else SamplingConfig(**(sampling or {}))
        seen = np.zeros(len(self.vocabulary), np.float32)
        np.add.at(seen, self.ids[:position + 1], 1)
        return next_token_probabilities(self.steps["logits"][position], config, seen)

    def neighbours(self, position, by="cosine"):
        """The tokens nearest to `position`'s token vector in the vocabulary, best first: [(id, value)], by
        "cosine" similarity or "dot" product."""
        if by not in ("cosine", "dot"):
            raise ConfigError(f"by must be 'cosine' or 'dot', got {by!r}")
        return list(zip(self.steps[f"neighbours_{by}_ids"][position].tolist(),
                        self.steps[f"neighbours_{by}"][position].tolist()))

    def to_json(self, packed=False):
        """The trace as the page's view reads it: plain JSON-ready data, each array as {"dims", "data"}; `packed`,
        each float array's data as {"dims", "float32"}, its little-endian bytes in base64 (a fifth of the JSON, the
        numbers as they are), which the view unpacks."""
        def array(values):
            values = np.asarray(values)
            if packed and values.dtype.kind == "f":
                return {"dims": list(values.shape),
                        "float32": base64.b64encode(values.astype("<f4").tobytes()).decode()}
            return {"dims": list(values.shape), "data": values.reshape(-1).tolist()}

        return {"ids": [int(i) for i in self.ids], "tokens": self.tokens, "window_start": self.window_start,
                "shape": self.shape, "steps": {name: array(value) for name, value in self.steps.items()},
                "layers": [{name: array(value) for name, value in layer.items()} for layer in self.layers],
                "vocabulary": self.vocabulary}

    def _repr_html_(self):
        from gptlite.web import notebook

        return notebook.html(self)


# The steps outside the blocks, and each block's, in the order they run (names the page's graph gives them too).
STEPS = ("token_embedding", "position_table", "position", "rotary_angles", "embedding", "final_normed", "logits",
         "neighbours_cosine", "neighbours_cosine_ids", "neighbours_dot", "neighbours_dot_ids")
LAYER_STEPS = ("input", "attention_normed", "query", "key", "value", "query_normed", "key_normed", "query_rotated",
               "key_rotated", "scores", "attention", "heads", "joined", "attention_output", "attention_residual",
               "feed_forward_normed", "expanded", "gate", "up", "hidden", "feed_forward_output", "output")


def trace(model, text, unknown="error"):
    """Every step of `model` (a GPT) reading `text`: a `Trace`.

    `text` is a prompt (read as `generate` reads one, the tokenizer's start of text first) or a list of token
    ids; a text longer than the context is read as its last block_size tokens. `unknown` treats characters
    the vocabulary lacks as `generate` does.
    """
    model = checked_model(model, ConfigError(f"expected a gptlite GPT, got {type(model).__name__}"))
    model.check_continues_text(f"a trace follows a GPT's forward pass over a text; a {type(model).__name__} "
                               f"writes targets from sources")
    config, tokenizer = model.config, model.tokenizer
    if isinstance(text, str):
        ids = generation.prompt_ids(tokenizer, text, unknown)
    else:
        ids = [int(i) for i in text]
        if not ids or min(ids) < 0 or max(ids) >= config.vocab_size:
            raise InputError(f"token ids must be 1 or more, each from 0 to {config.vocab_size - 1}")
    window = np.asarray(ids[-config.block_size:], np.int32)
    steps, layers = _forward(model, window)
    steps.update(_neighbours(model, steps["token_embedding"]))
    shape = {**dataclasses.asdict(config), "kv_heads": config.kv_heads, "head_size": config.head_size}
    return Trace(window, tokenizer.pieces(window), len(ids) - len(window), shape, steps, layers,
                 tokenizer.pieces(np.arange(config.vocab_size)))


def _forward(model, ids):
    """The model's forward pass over ids (T,), each step kept: (steps, one dict of steps a block)."""
    config, embedding = model.config, model.embedding
    length = len(ids)
    steps = {}
    tokens = embedding.token_embedding(ids[None])  # (1, T, C)
    steps["token_embedding"] = tokens
    x = tokens
    angles = None
    if embedding.position_embeddings is not None:  # a table, added
        table = embedding.position_embeddings.value  # (block_size, C)
        steps["position_table"] = table
        added = ops.cast(table[:length], tokens.dtype)[None]
        steps["position"] = added
        x = tokens + added
    if config.position == "rotary":
        angles = rotary_angles(ops.arange(length), config.head_size, config.rope_theta)  # (T, D/2)
        steps["rotary_angles"] = angles
    steps["embedding"] = x
    layers = []
    for block in model.blocks:
        kept = {}
        x = _block(block, x, angles, kept)
        layers.append(kept)
    x = x if model.final_norm is None else model.final_norm(x)
    steps["final_normed"] = x
    steps["logits"] = embedding.logits(x)  # (1, T, V)
    return _unbatched(steps), [_unbatched(layer) for layer in layers]


def _block(block, x, angles, kept):
    """One block over x (1, T, C), its steps put in `kept`: the block's output."""
    kept["input"] = x
    normed = block._input(x, block.attention_norm)
    if not block.post_norm:
        kept["attention_normed"] = normed
    attended = _attention(block.attention, normed, angles, kept)
    x = block._add(x, attended, block.attention_norm)
    kept["attention_residual"] = x
    normed = block._input(x, block.feed_forward_norm)
    if not block.post_norm:
        kept["feed_forward_normed"] = normed
    fed_forward = _feed_forward(block.feed_forward, normed, kept)
    x = block._add(x, fed_forward, block.feed_forward_norm)
    kept["output"] = x
    return x


def _attention(layer, x, angles, kept):
    """Causal self-attention over x (1, T, C), as `Attention` computes it, its steps in `kept` (heads first)."""
    heads, kv_heads, size = layer.n_head, layer.kv_heads, layer.head_size
    length = ops.shape(x)[1]
    qkv = ops.reshape(layer.qkv_projection(x), (1, length, heads + 2 * kv_heads, size))
    query, key, value = ops.split(qkv, [heads, heads + kv_heads], axis=2)  # (1, T, H|K, D)
    kept["query"], kept["key"], kept["value"] = (_heads_first(part) for part in (query, key, value))
    if layer.config.qk_norm:
        query, key = layer.query_norm(query), layer.key_norm(key)
        kept["query_normed"], kept["key_normed"] = _heads_first(query), _heads_first(key)
    if angles is not None:
        from gptlite.model.positions import rotate

        query, key = rotate(query, angles), rotate(key, angles)
        kept["query_rotated"], kept["key_rotated"] = _heads_first(query), _heads_first(key)
    query, key, value = (_heads_first(part)[0] for part in (query, key, value))  # (H|K, T, D)
    groups = heads // kv_heads
    key, value = ops.repeat(key, groups, axis=0), ops.repeat(value, groups, axis=0)  # head h reads h // G's
    scores = ops.matmul(query, ops.swapaxes(key, -1, -2)) / math.sqrt(size)  # (H, T, T)
    kept["scores"] = scores[None]
    visible = ops.greater_equal(ops.arange(length)[:, None], ops.arange(length)[None, :])  # (T, T)
    weights = ops.softmax(ops.where(visible, scores, float(np.finfo(np.float32).min)), axis=-1)
    kept["attention"] = weights[None]
    attended = ops.matmul(weights, value)  # (H, T, D)
    kept["heads"] = attended[None]
    joined = ops.reshape(ops.transpose(attended, (1, 0, 2)), (1, length, heads * size))
    kept["joined"] = joined
    output = layer.output_projection(joined)
    kept["attention_output"] = output
    return output


def _feed_forward(layer, x, kept):
    """The feed-forward over x (1, T, C), as `FeedForward` computes it, its steps in `kept`."""
    expanded = layer.expand(x)
    if layer.mlp == "swiglu":
        gate, up = ops.split(expanded, 2, axis=-1)
        kept["gate"], kept["up"] = gate, up
        hidden = ops.silu(gate) * up
    else:
        kept["expanded"] = expanded
        hidden = ops.square(ops.relu(expanded)) if layer.mlp == "relu2" else ops.gelu(expanded, approximate=True)
    kept["hidden"] = hidden
    output = layer.contract(hidden)
    kept["feed_forward_output"] = output
    return output


def _heads_first(part):
    """(1, T, H, D) -> (1, H, T, D)."""
    return ops.transpose(part, (0, 2, 1, 3))


def _unbatched(steps):
    """Each step as a float32 NumPy array, its batch of one left out."""
    arrays = {}
    for name, value in steps.items():
        array = np.asarray(ops.convert_to_numpy(ops.cast(value, "float32")))
        arrays[name] = array if name in ("position_table", "rotary_angles") else array[0]
    return arrays


def _neighbours(model, vectors):
    """The NEIGHBOURS tokens nearest each of vectors (T, C) in the token table, by cosine and by dot product."""
    table = np.asarray(ops.convert_to_numpy(ops.cast(model.embedding.token_embedding.embeddings, "float32")))
    count = min(NEIGHBOURS, len(table))
    found = {}
    for by, values in (("dot", vectors @ table.T),
                       ("cosine", (vectors / _norms(vectors)) @ (table / _norms(table)).T)):  # (T, V)
        best = np.argsort(-values, axis=-1, kind="stable")[:, :count]
        found[f"neighbours_{by}_ids"] = best.astype(np.int64)
        found[f"neighbours_{by}"] = np.take_along_axis(values, best, axis=-1).astype(np.float32)
    return found


def _norms(vectors):
    return np.maximum(np.linalg.norm(vectors, axis=-1, keepdims=True), 1e-12)
