"""Seeing inside a trained model: its attention weights, its next-token
probabilities and its position encoding, as arrays and as pictures.

The attention weights are those the model's own attention layers compute
when asked for them (`return_attention_scores`): the code that trains and
generates, not a copy of it. Figures are drawn with matplotlib's object API
(no pyplot), so drawing one changes nothing in a notebook's plotting state.
"""

import dataclasses
import pathlib
import warnings

import numpy as np
from keras import ops

from gptlite.decode import generation
from gptlite.errors import ConfigError, InputError
from gptlite.files import atomic_path
from gptlite.model import positions
from gptlite.model.gpt import check_use

# "decoder": a GPT's blocks, or a Seq2Seq decoder's self-attention.
PART_TITLES = {"decoder": "causal self-attention", "encoder": "encoder self-attention",
               "cross": "cross-attention from the target to the source"}
# Figures show at most this many tokens on an axis (the last ones): more would be unreadable.
MAX_DRAWN_TOKENS = 64
FIGURE_FORMATS = (".png", ".svg", ".pdf")


@dataclasses.dataclass(frozen=True, eq=False)
class AttentionMaps:
    """Attention weights and the tokens they are over.

    weights (layers, heads, T, S): row t holds how query token t spreads its
    attention over the S attended tokens; each row sums to 1. `tokens` are
    the T query tokens and `key_tokens` the S attended ones, as text pieces
    (the same list, except for cross-attention). In "decoder" attention
    every query sees only itself and earlier tokens: the weights above the
    diagonal are zero.

    Unpacks as `weights, tokens = attention_maps(...)`.
    """

    weights: np.ndarray
    tokens: list
    key_tokens: list
    part: str

    @property
    def causal(self):
        return self.part == "decoder"

    @property
    def title(self):
        return PART_TITLES[self.part]

    def __iter__(self):
        return iter((self.weights, self.tokens))


def attention_maps(model, text, part=None, target=None, unknown="error"):
    """The attention weights of every layer and head of `model` reading `text`.

    For a GPT, `text` is a prompt; a prompt longer than the context window
    is read as its last block_size tokens. For a Seq2Seq, `text` is a source
    and `part` picks the attention: "encoder" (over the source), "decoder"
    (the target's causal self-attention) or "cross" (the default: from
    the target to the source). The target is `target`, or by default the
    one the model writes for the source, greedily. `unknown` treats
    characters the vocabulary lacks as `generate` does.

    Returns an `AttentionMaps`: weights (layers, heads, T, S) and tokens.
    """
    return _maps_and_inputs(model, text, part, target, unknown)[0]


def token_report(model, text, top=5, target=None, unknown="error"):
    """What the model predicts and attends to at each position of `text`, as plain data (JSON-ready).

    For each position: its token, the `top` likeliest next tokens with their
    probabilities, and for each layer the `top` tokens that layer attends
    to most, averaged over its heads. For a GPT, `text` is a prompt and
    the attended tokens are earlier ones. For a Seq2Seq, `text` is a source:
    the positions are the decoder's (its start token, then `target` or the
    greedy target) and the attended tokens are the source's, through
    cross-attention.
    """
    if isinstance(top, bool) or not isinstance(top, int) or top < 1:
        raise ConfigError(f"top must be a whole number of at least 1, got {top!r}")
    maps, inputs = _maps_and_inputs(model, text, None, target, unknown)
    logits = _quietly(model, inputs)
    probabilities = _numpy(ops.softmax(logits[0], axis=-1))  # (T, V)
    head_means = maps.weights.mean(axis=1)  # (L, T, S)
    tokenizer = model.tokenizer
    rows = []
    for position, token in enumerate(maps.tokens):
        likeliest = np.argsort(-probabilities[position], kind="stable")[:top]
        visible = position + 1 if maps.causal else len(maps.key_tokens)
        layers = []
        for layer_weights in head_means[:, position, :visible]:
            attended = np.argsort(-layer_weights, kind="stable")[:top]
            layers.append([{"position": int(s), "token": maps.key_tokens[s], "weight": float(layer_weights[s])}
                           for s in attended])
        rows.append({
            "position": position,
            "token": token,
            "next": [{"token": piece, "probability": float(probabilities[position, i])}
                     for i, piece in zip(likeliest, tokenizer.pieces(likeliest))],
            "attention": layers,
        })
    return {"part": maps.part, "tokens": maps.tokens, "attended_tokens": maps.key_tokens, "positions": rows}


def position_encoding(model):
    """The model's position encoding: for learned or sinusoidal positions the table added to the
    embeddings, (block_size, n_embd); for rotary positions what they do to each head's queries and keys,
    the cosines then the sines of each pair's angle at each position, (block_size, head size)."""
    config = model.config
    if config.position == "rotary":
        return positions.rotary_table(config.block_size, config.head_size, config.rope_theta)
    if not model.built:
        model.build()
    return _numpy(model.embedding.position_embeddings.value)


# --- figures -------------------------------------------------------------------


def plot_attention(maps, path=None, layer=None, head=None, max_tokens=MAX_DRAWN_TOKENS):
    """Draw `maps` as a heatmap per layer (rows) and head (columns); return
    the matplotlib Figure, and write it to `path` (.png, .svg or .pdf) if given.

    `layer` and `head` (from 0) draw only that layer's or head's maps; both
    together draw one map, large. Queries are rows and attended tokens
    columns, both labelled; masked cells (above the diagonal of causal
    attention) are left empty. Longer texts show their last `max_tokens`.
    """
    from matplotlib import colors
    from matplotlib.figure import Figure

    num_layers, num_heads, length, key_length = maps.weights.shape
    layers = _chosen("layer", layer, num_layers)
    heads = _chosen("head", head, num_heads)
    rows, columns = slice(max(0, length - max_tokens), None), slice(max(0, key_length - max_tokens), None)
    tokens = [_label(t) for t in maps.tokens[rows]]
    key_tokens = [_label(t) for t in maps.key_tokens[columns]]
    masked = np.zeros((length, key_length), bool)
    if maps.causal:
        masked = np.triu(np.ones((length, key_length), bool), k=1)
    masked = masked[rows, columns]

    single = len(layers) == 1 and len(heads) == 1
    span = max(len(tokens), len(key_tokens))
    side = min(max(0.16 * span + 1.0, 5.0 if single else 2.2), 11.0 if single else 7.0)  # inches per map
    # A figure of many layers and heads stays under about 30 inches a side; one head drawn alone is for reading.
    side = min(side, max(30.0 / max(len(layers), len(heads)), 2.2))
    font_size = min(max(0.7 * side * 72 / span, 4.0), 10.0)  # points: about 70% of a label's share of the axis
    figure = Figure(figsize=(side * len(heads) + 1.2, side * len(layers) + 0.8), dpi=100, layout="constrained")
    grid = figure.subplots(len(layers), len(heads), squeeze=False)
    color_map = _viridis_with_empty_cells()
    # A square root scale: weights of a few percent, common over long texts, stay visible.
    scale = colors.PowerNorm(gamma=0.5, vmin=0.0, vmax=1.0)
    for row_axes, layer_index in zip(grid, layers):
        for axes, head_index in zip(row_axes, heads):
            weights = maps.weights[layer_index, head_index][rows, columns]
            image = axes.imshow(np.ma.masked_array(weights, masked), cmap=color_map, norm=scale,
                                interpolation="nearest", aspect="auto")
            axes.set_title(f"layer {layer_index}, head {head_index}", fontsize=8 if not single else 10)
            axes.set_xticks(range(len(key_tokens)), key_tokens, fontsize=font_size, rotation=90)
            axes.set_yticks(range(len(tokens)), tokens, fontsize=font_size)
            axes.tick_params(length=0)
    shown = f", the last {max_tokens} of {max(length, key_length)} tokens" if max(length, key_length) > max_tokens \
        else ""
    figure.suptitle(f"{maps.title}\nrow: a query token; column: a token it attends to{shown}", fontsize=10)
    figure.colorbar(image, ax=grid, shrink=0.6 if len(layers) > 1 else 0.9, label="attention weight")
    if path is not None:
        _save(figure, path)
    return figure


def plot_positions(model, path=None):
    """Draw the position encoding (`position_encoding`): the (position, dimension) table as a
    heatmap, and how similar (cosine) each position's vector is to every
    other's. Rotary positions' similarity depends on the distance alone: equal
    along each diagonal. Returns the Figure, and writes it to `path` if given."""
    from matplotlib.figure import Figure

    table = position_encoding(model)  # (block_size, C)
    unit = table / np.maximum(np.linalg.norm(table, axis=1, keepdims=True), 1e-12)
    similarity = unit @ unit.T  # (block_size, block_size)
    figure = Figure(figsize=(12, 5), dpi=100, layout="constrained")
    encoding_axes, similarity_axes = figure.subplots(1, 2)
    limit = float(np.abs(table).max()) or 1.0
    image = encoding_axes.imshow(table.T, cmap="RdBu_r", vmin=-limit, vmax=limit, aspect="auto",
                                 interpolation="nearest")
    encoding_axes.set_xlabel("position")
    rotary = model.config.position == "rotary"
    encoding_axes.set_ylabel("pair: cos of each angle, then sin" if rotary else "dimension")
    encoding_axes.set_title("rotary positions: the angle each pair of a head turns by" if rotary
                            else f"{model.config.position} position encoding")
    figure.colorbar(image, ax=encoding_axes)
    image = similarity_axes.imshow(similarity, cmap="RdBu_r", vmin=-1, vmax=1, interpolation="nearest")
    similarity_axes.set_xlabel("position")
    similarity_axes.set_ylabel("position")
    similarity_axes.set_title("cosine similarity between positions")
    figure.colorbar(image, ax=similarity_axes)
    if path is not None:
        _save(figure, path)
    return figure


# --- helpers -------------------------------------------------------------------


def _maps_and_inputs(model, text, part, target, unknown):
    """The `part` maps of the model reading `text` (a GPT's prompt; a Seq2Seq's source and `target`, its
    cross-attention by default, its greedy target by default), and the model inputs they came from."""
    check_use(model, "draw its attention")
    inputs, part, weights, query_ids, key_ids = _quietly(
        model.attention_reading, text, part, target, unknown, generation.generate_target)
    tokenizer = model.tokenizer
    maps = AttentionMaps(_numpy(weights)[:, 0], tokenizer.pieces(query_ids), tokenizer.pieces(key_ids), part)
    return maps, inputs


def _quietly(function, *args):
    """`function(*args)` without Keras's warning about a softmax over one
    key: attention from a text's first token rightly has one."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "You are using a softmax over axis -1", UserWarning)
        return function(*args)


def _numpy(tensor):
    return ops.convert_to_numpy(ops.cast(tensor, "float32"))


def _chosen(what, index, count):
    if index is None:
        return list(range(count))
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < count:
        raise ConfigError(f"{what} must be from 0 to {count - 1} for this model, got {index!r}")
    return [index]


def _label(piece):
    """A token as an axis label: whitespace made visible."""
    return piece.replace(" ", "\u2423").replace("\n", "\u21b5").replace("\t", "\u21e5") or "\u2205"


def _viridis_with_empty_cells():
    from matplotlib import colormaps

    return colormaps["viridis"].with_extremes(bad="white")  # masked cells


def _save(figure, path):
    path = pathlib.Path(path)
    if path.suffix.lower() not in FIGURE_FORMATS:
        raise InputError(f"{path}: a figure file must end in {', '.join(FIGURE_FORMATS)}")
    if not path.parent.is_dir():
        raise InputError(f"cannot write {path}: the folder {path.parent} does not exist")
    try:
        with atomic_path(path) as temporary:
            figure.savefig(temporary, format=path.suffix.lower()[1:])
    except OSError as error:
        raise InputError(f"cannot write {path}: {error.strerror}") from None
