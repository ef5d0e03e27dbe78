"""Every step of a model's forward pass over a text, with its real numbers: `trace(model, text)` for a GPT,
`trace_target(model, source, target)` for a Seq2Seq; with `ablate`, those of the model with some heads knocked
out. A trace then reads the residual stream through the final norm and the head (`Trace.logit_lens`) and splits a
logit into what each part wrote (`Trace.attribution`).

A trace is the model's own forward pass run with hooks (`gptlite.model.hooks`) that keep each step: the layers
compute every number it holds, and its logits are the model's. The web page's Inside view shows a trace, whether
the page's own graph (`gptlite.web.onnx_graph.inside_graph`) or this module computed it; in Jupyter a `Trace`
shows as that view (`gptlite.inside.notebook`).

Shapes: T the text's tokens (its last block_size), C the width, H query heads, K key/value heads, D the head
size, F the feed-forward's width, V the vocabulary, L the layers.
"""

import base64
import dataclasses

import numpy as np
from keras import ops

from gptlite.decode import generation
from gptlite.decode.sampling import next_token_probabilities
from gptlite.decode.settings import SamplingConfig
from gptlite.errors import ConfigError, InputError, TooLargeError
from gptlite.inside import edits as editing, lens
from gptlite.model.attention import BLOCK_HEAD_WEIGHTS
from gptlite.model.gpt import check_use
from gptlite.model.hooks import BLOCK_PREFIXES, BLOCK_STEPS, MODEL_STEPS
from gptlite.model.positions import rotary_angles

# How many nearest tokens in the vocabulary a trace keeps for each token, by cosine and by dot product.
NEIGHBOURS = 10
# The steps a trace holds beside the forward pass's own: the position table and the rotary angles of the text's
# positions (what the model adds or turns by), and each token's nearest tokens in the vocabulary.
TABLE_STEPS = ("position_table", "rotary_angles")
NEIGHBOUR_STEPS = ("neighbours_cosine", "neighbours_cosine_ids", "neighbours_dot", "neighbours_dot_ids")
# The steps outside the blocks and each block's, as a trace names them (the page's graph names them so too).
STEPS = (*MODEL_STEPS[:4], *TABLE_STEPS, *MODEL_STEPS[4:], *NEIGHBOUR_STEPS)
# A block's steps, and its attention's weights by head (`BLOCK_HEAD_WEIGHTS`): what the Inside view shows its
# queries, keys and values made with.
LAYER_STEPS = (*BLOCK_STEPS, *BLOCK_HEAD_WEIGHTS)
# Steps computed only where asked for, not kept in a trace: each head's share of the output projection, which
# `Trace.attribution` reads by running the pass again.
_ASKED_ONLY = ("head_outputs", "cross_head_outputs")
# The most numbers a trace keeps (float32: 4 bytes each), a gigabyte: its attention steps alone hold 3 x L x H x
# T^2 of them, over 1.7 GB for GPT-2 small at 1,024 tokens. A larger trace is refused, naming `layers`, which
# keeps fewer.
MOST_TRACE_NUMBERS = 2**28


@dataclasses.dataclass(frozen=True, eq=False)
class Trace:
    """A GPT's forward pass over `ids` (T,), step by step.

    `tokens`: each id's text; `window_start`: how many tokens of the text came before the window read (a text
    longer than the context is read as its last block_size tokens, as `attention_maps` reads it); `shape`: the
    model's settings the steps depend on (GPTConfig's fields, with kv_heads and head_size). `steps`: the
    steps before and after the blocks, by name (`STEPS`); `layers`: one dict a block, its steps by name
    (`LAYER_STEPS`: its steps, and its attention's weights by head, `BLOCK_HEAD_WEIGHTS`); a block a trace was not asked
    to keep (`layers`) is an empty dict. A step a model has not (QK-norm, a rotation, a position table, biases) is
    absent. `ablated`: the heads knocked out, as (layer, head, part)
    with `ablation` "zero" or "mean" (see `gptlite.inside.edits`); every step is the edited model's. A Seq2Seq's
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
    ablated: tuple = ()
    ablation: str = "zero"
    # What ran: the model and its inputs, and the edits, for what a trace computes again (attribution).
    model: object = dataclasses.field(default=None, repr=False)
    inputs: object = dataclasses.field(default=None, repr=False)
    edits: dict = dataclasses.field(default=None, repr=False)

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

    def residual_stream(self):
        """The residual stream before the first block and after each, (L + 1, T, C): what the logit lens reads."""
        if any(not layer for layer in self.layers):
            raise ConfigError("the residual stream needs every block of the trace; trace every layer (layers=None)")
        return np.stack([self.steps["embedding"], *(layer["output"] for layer in self.layers)])

    def logit_lens(self):
        """The next-token probabilities (L + 1, T, V) that the residual stream gives at every position before the
        first block and after each, read as the model reads its last: through the final norm (each stream
        normalised with its own statistics) and the output layer. The last is the model's own."""
        return lens.logit_lens(self)

    def attribution(self, position, token):
        """`token`'s logit at `position` (an id, or a text of one token) split into what each part of the model
        wrote into the residual stream, the final norm's scale held at this run's (as TransformerLens holds it):
        an `Attribution` whose parts sum to the logit."""
        return lens.attribution(self, position, token)

    def to_json(self, packed=False, weights=True):
        """The trace as the page's view reads it: plain JSON-ready data, each array as {"dims", "data"}; `packed`,
        each float array's data as {"dims", "float32"}, its little-endian bytes in base64 (a fifth of the JSON, the
        numbers as they are), which the view unpacks. Without `weights`, the blocks' attention weights
        (`BLOCK_HEAD_WEIGHTS`, the same for every text) are left out."""
        left_out = set() if weights else set(BLOCK_HEAD_WEIGHTS)
        def array(values):
            values = np.asarray(values)
            if packed and values.dtype.kind == "f":
                return {"dims": list(values.shape),
                        "float32": base64.b64encode(values.astype("<f4").tobytes()).decode()}
            return {"dims": list(values.shape), "data": values.reshape(-1).tolist()}

        def layers(found):
            return [{name: array(value) for name, value in layer.items() if name not in left_out} for layer in found]

        made = {"ids": [int(i) for i in self.ids], "tokens": self.tokens, "window_start": self.window_start,
                "shape": self.shape, "steps": {name: array(value) for name, value in self.steps.items()},
                "layers": layers(self.layers), "vocabulary": self.vocabulary,
                "ablated": [list(head) for head in self.ablated], "ablation": self.ablation}
        if self.source_ids is not None:
            made.update(source_ids=[int(i) for i in self.source_ids], source_tokens=self.source_tokens,
                        encoder_layers=layers(self.encoder_layers))
        return made

    def _repr_html_(self):
        from gptlite.inside import notebook

        return notebook.html(self)


def trace(model, text, unknown="error", ablate=(), ablation="zero", layers=None, position=None):
    """Every step of `model` (a GPT) reading `text`: a `Trace`.

    `text` is a prompt (read as `generate` reads one, the tokenizer's start of text first) or a list of token
    ids; a text longer than the context is read as its last block_size tokens. `unknown` treats characters
    the vocabulary lacks as `generate` does. `ablate`: heads to knock out, each (layer, head): its output is
    zeroed, or with `ablation="mean"` replaced by its mean over the text's positions; every step is then the
    edited model's (`gptlite.inside.edits`). `layers`: the blocks whose steps to keep (all by default); a trace
    past MOST_TRACE_NUMBERS is refused, naming it. `position`: a position of the text (0 to its length - 1) to be
    read as the writer read it when it wrote the token after it: the window `writer_window` gives (a text longer
    than the context is otherwise read as its last block_size tokens).
    """
    check_use(model, "trace a text")
    ids = text_ids(model, text, unknown)
    if position is not None:
        if not isinstance(position, (int, np.integer)) or not 0 <= position < len(ids):
            raise InputError(f"position must be a whole number from 0 to {len(ids) - 1}, the text's tokens")
        ids = ids[:writer_window(int(position), len(ids), model.config.block_size)[1]]
    window = np.asarray(ids[-model.config.block_size:], np.int32)
    return _traced(model, window[None], window, len(ids) - len(window), ablate, ablation, layers)


def writer_window(position, count, block_size):
    """The window (start, end) of a text of `count` tokens in which a writer of context `block_size` read
    `position` when it wrote the token after it (as `generate` slides its window one token at a time): the text's
    first block_size tokens while it fits or the position is among them, else the block_size tokens up to the
    position (each earlier position there then sees fewer tokens than the writer did)."""
    if count <= block_size or position < block_size:
        return 0, min(count, block_size)
    return position + 1 - block_size, position + 1


def trace_target(model, source, target=None, unknown="error", ablate=(), ablation="zero", layers=None):
    """Every step of `model` (a Seq2Seq) writing `target` for `source`: a `Trace` of its decoder over the start
    token and the target, each block's cross-attention over the source, and the encoder's blocks over the source.
    The target is by default the one the model writes, greedily (as `attention_maps` reads one). `ablate`,
    `ablation` and `layers` as `trace`'s; a head is (layer, head, part), part "decoder" (self-attention, the
    default), "cross" or "encoder"."""
    check_use(model, "trace a target")
    inputs, _, _, target_ids, source_ids = model.attention_reading(source, "cross", target, unknown,
                                                                    generation.generate_target)
    return _traced(model, inputs, np.asarray(target_ids), 0, ablate, ablation, layers, np.asarray(source_ids))


def text_ids(model, text, unknown="error"):
    """A text's ids as `trace` reads it: a prompt's, or token ids given, checked."""
    if isinstance(text, str):
        return generation.prompt_ids(model.tokenizer, text, unknown)
    ids = [int(i) for i in text]
    if not ids or min(ids) < 0 or max(ids) >= model.config.vocab_size:
        raise InputError(f"token ids must be 1 or more, each from 0 to {model.config.vocab_size - 1}")
    return ids


def _traced(model, inputs, ids, window_start, ablate, ablation, layers, source_ids=None):
    config, tokenizer = model.config, model.tokenizer
    heads = editing.heads_named(model, ablate)
    edits = editing.ablations(model, heads, ablation)
    kept_layers = editing.layers_named(model, layers)
    _check_size(config, len(ids), 0 if source_ids is None else len(source_ids), kept_layers)
    kept = editing.run(model, inputs, _keeping(kept_layers), edits)
    steps, found = _by_block(kept, config.n_layer)
    _add_weights(model, found, kept_layers)
    steps.update(_tables(model, len(ids)))
    steps.update(_neighbours(model, steps["token_embedding"]))
    source = {} if source_ids is None else dict(source_ids=source_ids, source_tokens=tokenizer.pieces(source_ids),
                                                encoder_layers=found["encoder_layer"])
    return Trace(ids, tokenizer.pieces(ids), window_start, _shape(config), steps, found["layer"],
                 tokenizer.pieces(np.arange(config.vocab_size)), ablated=heads, ablation=ablation, model=model,
                 inputs=inputs, edits=edits, **source)


def _keeping(layers):
    """Which steps a trace keeps: every step outside the blocks, and the steps of the blocks of `layers` (a set of
    (stack, index)), but those computed only where asked."""
    def keep(name):
        block, _, step = name.rpartition(".")
        if step in _ASKED_ONLY:
            return False
        if not block:
            return True
        stack, _, index = block.rpartition("_")
        return (stack, int(index)) in layers
    return keep


def _by_block(kept, n_layer):
    """Kept steps by full name -> (the steps outside the blocks, {stack: a dict of steps a block})."""
    steps, found = {}, {stack: [{} for _ in range(n_layer)] for stack in BLOCK_PREFIXES}
    for name, value in kept.items():
        block, _, step = name.rpartition(".")
        if block:
            stack, _, index = block.rpartition("_")
            found[stack][int(index)][step] = value
        else:
            steps[name] = value
    return steps, found


def _add_weights(model, found, layers):
    """Put each kept block's attention weights by head (`BLOCK_HEAD_WEIGHTS`) among its steps."""
    stacks = {"layer": model.blocks, "encoder_layer": getattr(model, "encoder_blocks", [])}
    for stack, index in layers:
        block = stacks[stack][index]
        found[stack][index].update(block.attention.head_weights())
        if getattr(block, "has_cross_attention", False):
            found[stack][index].update({f"cross_{name}": value
                                        for name, value in block.cross_attention.head_weights().items()})


def _check_size(config, length, source_length, layers):
    """Refuse a trace that would keep more than MOST_TRACE_NUMBERS numbers (a rough count, from the shape)."""
    heads, width = config.n_head, config.n_embd
    hidden = 3 * width * 4  # the feed-forward's steps, at their widest
    per_token = 10 * width + hidden + 6 * heads * config.head_size
    numbers = 0
    for stack, _ in layers:
        keys = source_length if stack == "encoder_layer" else length
        queries = keys
        numbers += queries * (per_token + 3 * heads * keys) + 3 * width * heads * config.head_size  # and weights
        if stack == "layer" and source_length:  # cross-attention
            numbers += length * (4 * width + 3 * heads * source_length)
    numbers += length * (config.vocab_size + 6 * width)
    if numbers > MOST_TRACE_NUMBERS:
        raise TooLargeError(f"a trace of {length} tokens over {len(layers)} blocks would keep about {numbers:,} "
                         f"numbers, past the {MOST_TRACE_NUMBERS:,} a trace holds; keep fewer blocks (`layers`) or "
                         f"trace a shorter text")


def _shape(config):
    return {**dataclasses.asdict(config), "kv_heads": config.kv_heads, "head_size": config.head_size}


def _tables(model, length):
    """The position table a model adds from (block_size, C), or the rotary angles of positions 0..T-1 (T, D/2)."""
    config, embedding = model.config, model.embedding
    if embedding.position_embeddings is not None:
        return {"position_table": np.asarray(ops.convert_to_numpy(ops.cast(embedding.position_embeddings.value,
                                                                            "float32")))}
    if config.position == "rotary":
        angles = rotary_angles(ops.arange(length), config.head_size, config.rope_theta)
        return {"rotary_angles": np.asarray(ops.convert_to_numpy(angles), np.float32)}
    return {}


def _neighbours(model, vectors):
    """The NEIGHBOURS tokens nearest each of vectors (T, C) in the token table, by cosine and by dot product."""
    table = np.asarray(ops.convert_to_numpy(ops.cast(model.embedding.token_embedding.embeddings, "float32")))
    count = min(NEIGHBOURS, len(table))
    found = {}
    for by, values in (("dot", vectors @ table.T),
                       ("cosine", (vectors / _norms(vectors)) @ (table / _norms(table)).T)):  # (T, V)
        # The `count` largest of each row, then those in order: not a sort of the whole vocabulary a row.
        best = np.argpartition(-values, count - 1, axis=-1)[:, :count]
        best = np.take_along_axis(best, np.argsort(-np.take_along_axis(values, best, axis=-1), axis=-1,
                                                   kind="stable"), axis=-1)
        found[f"neighbours_{by}_ids"] = best.astype(np.int64)
        found[f"neighbours_{by}"] = np.take_along_axis(values, best, axis=-1).astype(np.float32)
    return found


def _norms(vectors):
    return np.maximum(np.linalg.norm(vectors, axis=-1, keepdims=True), 1e-12)
