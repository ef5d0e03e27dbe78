"""Every step of a model's forward pass over a text, with its real numbers: `trace(model, text)` for a GPT,
`trace_target(model, source, target)` for a Seq2Seq.

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
from gptlite.model.gpt import check_use
from gptlite.model.positions import rotary_angles, rotate

# How many nearest tokens in the vocabulary a trace keeps for each token, by cosine and by dot product.
NEIGHBOURS = 10


@dataclasses.dataclass(frozen=True, eq=False)
class Trace:
    """A GPT's forward pass over `ids` (T,), step by step.

    `tokens`: each id's text; `window_start`: how many tokens of the text came before the window read (a text
    longer than the context is read as its last block_size tokens, as `attention_maps` reads it); `shape`: the
    model's settings the steps depend on (GPTConfig's fields, with kv_heads and head_size). `steps`: the
    steps before and after the blocks, by name (`STEPS`); `layers`: one dict a block, its steps by name
    (`LAYER_STEPS`). A step a model has not (QK-norm, a rotation, a position table) is absent. A Seq2Seq's
    (`trace_target`) reads a source too: `source_ids`, `source_tokens`, the encoder's blocks in `encoder_layers`
    (their attention sees the whole source), the source's vectors in steps `source_embedding` and `encoded`; the
    decoder's blocks add cross-attention over the source, as steps named `cross_...`.
    """

    ids: np.ndarray
    tokens: list
    window_start: int
    shape: dict
    steps: dict
    layers: list
    vocabulary: list
    source_ids: np.ndarray = None
    source_tokens: list = None
    encoder_layers: list = None

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

        def layers(found):
            return [{name: array(value) for name, value in layer.items()} for layer in found]

        made = {"ids": [int(i) for i in self.ids], "tokens": self.tokens, "window_start": self.window_start,
                "shape": self.shape, "steps": {name: array(value) for name, value in self.steps.items()},
                "layers": layers(self.layers), "vocabulary": self.vocabulary}
        if self.source_ids is not None:
            made.update(source_ids=[int(i) for i in self.source_ids], source_tokens=self.source_tokens,
                        encoder_layers=layers(self.encoder_layers))
        return made

    def _repr_html_(self):
        from gptlite.web import notebook

        return notebook.html(self)


# The steps outside the blocks, and each block's, in the order they run (names the page's graph gives them too).
STEPS = ("source_embedding", "encoded", "token_embedding", "position_table", "position", "rotary_angles",
         "embedding", "final_normed", "logits", "neighbours_cosine", "neighbours_cosine_ids", "neighbours_dot",
         "neighbours_dot_ids")
# Attention's steps, which cross-attention has too, as cross_<step>.
ATTENTION_STEPS = ("query", "key", "value", "query_normed", "key_normed", "query_rotated", "key_rotated", "products",
                   "scores", "attention", "heads", "joined")
LAYER_STEPS = ("input", "attention_normed", *ATTENTION_STEPS, "attention_output", "attention_residual",
               "cross_normed", *(f"cross_{step}" for step in ATTENTION_STEPS), "cross_output", "cross_residual",
               "feed_forward_normed", "expanded", "gate", "up", "hidden", "feed_forward_output", "output")


def trace(model, text, unknown="error"):
    """Every step of `model` (a GPT) reading `text`: a `Trace`.

    `text` is a prompt (read as `generate` reads one, the tokenizer's start of text first) or a list of token
    ids; a text longer than the context is read as its last block_size tokens. `unknown` treats characters
    the vocabulary lacks as `generate` does.
    """
    check_use(model, "trace a text")
    config, tokenizer = model.config, model.tokenizer
    if isinstance(text, str):
        ids = generation.prompt_ids(tokenizer, text, unknown)
    else:
        ids = [int(i) for i in text]
        if not ids or min(ids) < 0 or max(ids) >= config.vocab_size:
            raise InputError(f"token ids must be 1 or more, each from 0 to {config.vocab_size - 1}")
    window = np.asarray(ids[-config.block_size:], np.int32)
    steps, layers = _forward(model, window, model.blocks, model.final_norm)
    steps.update(_neighbours(model, steps["token_embedding"]))
    return Trace(window, tokenizer.pieces(window), len(ids) - len(window), _shape(config), steps, layers,
                 tokenizer.pieces(np.arange(config.vocab_size)))


def trace_target(model, source, target=None, unknown="error"):
    """Every step of `model` (a Seq2Seq) writing `target` for `source`: a `Trace` of its decoder over the start
    token and the target, each block's cross-attention over the source, and the encoder's blocks over the source.
    The target is by default the one the model writes, greedily (as `attention_maps` reads one)."""
    check_use(model, "trace a target")
    inputs, _, _, target_ids, source_ids = model.attention_reading(source, "cross", target, unknown,
                                                                    generation.generate_target)
    config, tokenizer = model.config, model.tokenizer
    encoder_steps, encoder_layers = _forward(model, source_ids, model.encoder_blocks, model.encoder_norm, head=False)
    encoded = ops.convert_to_tensor(encoder_steps["final_normed"][None])
    steps, layers = _forward(model, target_ids, model.blocks, model.final_norm, encoded)
    steps.update(_neighbours(model, steps["token_embedding"]), source_embedding=encoder_steps["embedding"],
                 encoded=encoder_steps["final_normed"])
    return Trace(np.asarray(target_ids), tokenizer.pieces(target_ids), 0, _shape(config), steps, layers,
                 tokenizer.pieces(np.arange(config.vocab_size)), np.asarray(source_ids), tokenizer.pieces(source_ids),
                 encoder_layers)


def _shape(config):
    return {**dataclasses.asdict(config), "kv_heads": config.kv_heads, "head_size": config.head_size}


def _forward(model, ids, blocks, final_norm, context=None, head=True):
    """A stack's forward pass over ids (T,) (a GPT's blocks, a Seq2Seq's encoder's or its decoder's over the
    encoded `context`; `head`: on to the logits), each step kept: (steps, one dict of steps a block)."""
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
    for block in blocks:
        kept = {}
        x = _block(block, x, angles, kept, context)
        layers.append(kept)
    x = x if final_norm is None else final_norm(x)
    steps["final_normed"] = x
    if head:
        steps["logits"] = embedding.logits(x)  # (1, T, V)
    return _unbatched(steps), [_unbatched(layer) for layer in layers]


def _block(block, x, angles, kept, context=None):
    """One block over x (1, T, C), its steps put in `kept`: the block's output. A decoder's block with
    cross-attention attends over `context` (1, S, C) too."""
    kept["input"] = x
    normed = block._input(x, block.attention_norm)
    if not block.post_norm:
        kept["attention_normed"] = normed
    attended = _attention(block.attention, normed, angles, kept)
    x = block._add(x, attended, block.attention_norm)
    kept["attention_residual"] = x
    if block.has_cross_attention:
        normed = block._input(x, block.cross_attention_norm)
        if not block.post_norm:
            kept["cross_normed"] = normed
        attended = _attention(block.cross_attention, normed, None, kept, context, "cross_")
        x = block._add(x, attended, block.cross_attention_norm)
        kept["cross_residual"] = x
    normed = block._input(x, block.feed_forward_norm)
    if not block.post_norm:
        kept["feed_forward_normed"] = normed
    fed_forward = _feed_forward(block.feed_forward, normed, kept)
    x = block._add(x, fed_forward, block.feed_forward_norm)
    kept["output"] = x
    return x


def _attention(layer, x, angles, kept, context=None, named=""):
    """Attention over x (1, T, C), as `Attention` computes it, its steps in `kept` (heads first, named with
    `named` before them): causal self-attention, an encoder's over the whole of x, or cross-attention over
    `context` (1, S, C)."""
    heads, kv_heads, size = layer.n_head, layer.kv_heads, layer.head_size
    length = ops.shape(x)[1]
    if layer.causal:
        qkv = ops.reshape(layer.qkv_projection(x), (1, length, heads + 2 * kv_heads, size))
        query, key, value = ops.split(qkv, [heads, heads + kv_heads], axis=2)  # (1, T, H|K, D)
    else:
        context = x if context is None else context
        query = ops.reshape(layer.query_projection(x), (1, length, heads, size))
        key_value = ops.reshape(layer.key_value_projection(context), (1, ops.shape(context)[1], 2 * kv_heads, size))
        key, value = ops.split(key_value, 2, axis=2)  # (1, S, K, D) each
    kept[named + "query"], kept[named + "key"], kept[named + "value"] = (_heads_first(part)
                                                                       for part in (query, key, value))
    if layer.config.qk_norm:
        query, key = layer.query_norm(query), layer.key_norm(key)
        kept[named + "query_normed"], kept[named + "key_normed"] = _heads_first(query), _heads_first(key)
    if angles is not None and layer.rotary:
        query, key = rotate(query, angles), rotate(key, angles)
        kept[named + "query_rotated"], kept[named + "key_rotated"] = _heads_first(query), _heads_first(key)
    query, key, value = (_heads_first(part)[0] for part in (query, key, value))  # (H|K, T|S, D)
    groups = heads // kv_heads
    key, value = ops.repeat(key, groups, axis=0), ops.repeat(value, groups, axis=0)  # head h reads h // G's
    products = ops.matmul(query, ops.swapaxes(key, -1, -2))  # (H, T, S): q.k
    kept[named + "products"] = products[None]
    scores = products / math.sqrt(size)
    kept[named + "scores"] = scores[None]
    if layer.causal:
        visible = ops.greater_equal(ops.arange(length)[:, None], ops.arange(length)[None, :])  # (T, T)
        scores = ops.where(visible, scores, float(np.finfo(np.float32).min))
    weights = ops.softmax(scores, axis=-1)
    kept[named + "attention"] = weights[None]
    attended = ops.matmul(weights, value)  # (H, T, D)
    kept[named + "heads"] = attended[None]
    joined = ops.reshape(ops.transpose(attended, (1, 0, 2)), (1, length, heads * size))
    kept[named + "joined"] = joined
    output = layer.output_projection(joined)
    kept[named + ("output" if named else "attention_output")] = output
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
