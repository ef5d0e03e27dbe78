"""Edits of a forward pass, as `gptlite.model.hooks.Hooks` makes them: heads knocked out (ablated) and activations
copied from another run (patched), each a function of one step's value, for every row of a batch at once.

A head is named (layer, head, part): a block's index, a query head's index (grouped-query attention ablates the
query head; its key/value head still serves the others), and which attention: "decoder" (a GPT's, or a Seq2Seq
decoder's self-attention), "cross" (a Seq2Seq's cross-attention) or "encoder" (a Seq2Seq encoder's). What a head
writes is its weighted sum of the values (step `heads`, (B, H, T, D), TransformerLens's `hook_z`): ablating it
zeroes that ("zero"), or replaces it by its mean over the text's positions ("mean"), before the output projection.
"""

import numpy as np
from keras import ops

from gptlite.errors import ConfigError, InputError
from gptlite.inside import ABLATIONS
from gptlite.model.hooks import Hooks, step_name

# Where each part's heads write, as (its blocks' prefix, the step of their weighted values).
_PART_STEPS = {"decoder": ("layer", "heads"), "cross": ("layer", "cross_heads"), "encoder": ("encoder_layer", "heads")}


def heads_named(model, heads):
    """`heads`, each (layer, head) or (layer, head, part), checked against the model: a tuple of (layer, head,
    part), part "decoder" where none is named. A head the model lacks is an InputError naming the valid range."""
    config, parts = model.config, model.attention_parts
    named = []
    for head in heads or ():
        try:
            layer, index, *part = head
            part = part[0] if part else "decoder"
            if len(head) > 3 or not all(isinstance(i, (int, np.integer)) and not isinstance(i, bool)
                                        for i in (layer, index)):
                raise ValueError
        except (TypeError, ValueError):
            raise InputError(f"name a head as (layer, head), whole numbers; got {head!r}") from None
        if part not in parts:
            raise InputError(f"this model's attention is {', '.join(parts)}; there is no {part!r} head")
        if not 0 <= layer < config.n_layer:
            raise InputError(f"there is no layer {layer}: this model's layers are 0 to {config.n_layer - 1}")
        if not 0 <= index < config.n_head:
            raise InputError(f"there is no head {index}: this model's heads are 0 to {config.n_head - 1}")
        named.append((int(layer), int(index), part))
    return tuple(dict.fromkeys(named))


def layers_named(model, layers):
    """The blocks a trace keeps, as a set of (stack, index): every one for None, else those of `layers` (indices,
    in each stack a model has), checked."""
    n_layer, stacks = model.config.n_layer, model.block_stacks
    if layers is None:
        return {(stack, index) for stack in stacks for index in range(n_layer)}
    chosen = list(layers) if isinstance(layers, (list, tuple, set, range)) else [layers]
    for layer in chosen:
        if isinstance(layer, bool) or not isinstance(layer, (int, np.integer)) or not 0 <= layer < n_layer:
            raise InputError(f"there is no layer {layer!r}: this model's layers are 0 to {n_layer - 1}")
    if not chosen:
        raise InputError(f"name at least one layer to keep, from 0 to {n_layer - 1}")
    return {(stack, int(index)) for stack in stacks for index in chosen}


def check_ablation(ablation):
    if ablation not in ABLATIONS:
        raise ConfigError(f"ablation must be one of {', '.join(ABLATIONS)}, got {ablation!r}")


def ablations(model, heads, ablation="zero"):
    """The edits that knock out `heads` (from `heads_named`) in every row: {full step name: function}."""
    check_ablation(ablation)
    by_step = {}
    for layer, head, part in heads:
        stack, step = _PART_STEPS[part]
        by_step.setdefault(step_name(step, layer, stack), []).append(head)
    n_head = model.config.n_head
    return {name: _ablating(_head_mask(n_head, chosen)[None], ablation) for name, chosen in by_step.items()}


def ablations_by_row(model, rows, ablation="zero"):
    """The edits that knock out, in row r of a batch, the heads `rows[r]` (each a collection of (layer, head, part);
    empty: none): {full step name: function}."""
    check_ablation(ablation)
    n_head, masks = model.config.n_head, {}
    for row, heads in enumerate(rows):
        for layer, head, part in heads:
            stack, step = _PART_STEPS[part]
            name = step_name(step, layer, stack)
            masks.setdefault(name, np.zeros((len(rows), n_head), np.float32))[row, head] = 1
    return {name: _ablating(mask, ablation) for name, mask in masks.items()}


def _head_mask(n_head, heads):
    mask = np.zeros(n_head, np.float32)
    mask[list(heads)] = 1
    return mask


def _ablating(mask, ablation):
    """The edit of a step of weighted values (B, H, T, D) that replaces the heads `mask` (B or 1, H) marks with
    1."""
    def edit(values):
        chosen = ops.cast(ops.convert_to_tensor(mask[:, :, None, None]), values.dtype)
        replacement = 0 if ablation == "zero" else ops.mean(values, axis=2, keepdims=True)
        return values * (1 - chosen) + replacement * chosen
    return edit


def patches(rows, clean):
    """The edits that copy into row r of a batch what `clean` (by full step name, as `trace.run` keeps it, its batch
    of one left out) holds of `rows[r]`: a (full step name, index) pair, or None for no copy. The index is on the
    step's first axis: a position of a residual (T, C), a head of weighted values (H, T, D). {full step name:
    function}."""
    masks = {}
    for row, patch in enumerate(rows):
        if patch is not None:
            name, index = patch
            masks.setdefault(name, np.zeros((len(rows), clean[name].shape[0]), np.float32))[row, index] = 1
    return {name: _copying(mask.reshape(mask.shape + (1,) * (clean[name].ndim - 1)), clean[name][None])
            for name, mask in masks.items()}


def _copying(mask, source):
    """The edit that takes, where `mask` is 1, `source`'s values (a batch of one) instead of the step's own."""
    def edit(values):
        chosen = ops.cast(ops.convert_to_tensor(mask), values.dtype)
        return values * (1 - chosen) + ops.cast(ops.convert_to_tensor(source), values.dtype) * chosen
    return edit


def run(model, inputs, keep, edits=None):
    """`model` called on `inputs` (a batch of one) with hooks that keep `keep` (see `Hooks`) and make `edits`:
    each kept step as a float32 NumPy array, its batch left out, by full name."""
    hooks = Hooks(keep=keep, edits=edits)
    model(inputs, hooks=hooks)
    return {name: np.asarray(ops.convert_to_numpy(ops.cast(value, "float32")))[0] for name, value in hooks.kept.items()}


def token_named(model, token):
    """A token given as an id or as a text of one token, checked: its id."""
    vocabulary = model.config.vocab_size
    if isinstance(token, str):
        tokenizer = model.tokenizer
        ids = [] if tokenizer.unknown_characters(token) else [int(i) for i in tokenizer.encode(token)]
        if len(ids) != 1:
            said = "has characters the vocabulary lacks" if tokenizer.unknown_characters(token) else \
                f"is {len(ids)} tokens"
            raise InputError(f"{token!r} {said}; give one token of this model's vocabulary, as its text or its id "
                             f"(0 to {vocabulary - 1})")
        return ids[0]
    if isinstance(token, bool) or not isinstance(token, (int, np.integer)) or not 0 <= token < vocabulary:
        raise InputError(f"there is no token {token!r}: this model's ids are 0 to {vocabulary - 1}")
    return int(token)
