"""The residual stream read through the model's output: the logit lens (what each block's output would predict,
through the final norm and the head) and a logit's direct attribution (what each head, feed-forward and the
embedding wrote toward it). `Trace.logit_lens` and `Trace.attribution` call these.

Both hold for a model that normalises before each sublayer (pre-norm), whose residual stream is the sum of what
each part wrote; a post-norm model normalises that sum after every block, and a logit is then no sum of parts:
its attribution is refused, and its lens reads each block's output, normalised already, straight through the head.
"""

import dataclasses

import numpy as np
from keras import ops

from gptlite.errors import ConfigError, InputError
from gptlite.inside.edits import run, token_named
from gptlite.model.hooks import step_name
from gptlite.model.norms import frozen_norm


def logit_lens(trace):
    """The next-token probabilities (L + 1, T, V) of the residual stream before the first block and after each,
    through the final norm (each stream with its own statistics, as the model normalises its last) and the head."""
    model = _model_of(trace)
    streams = ops.convert_to_tensor(trace.residual_stream())  # (L + 1, T, C)
    normed = streams if model.final_norm is None else model.final_norm(streams)
    logits = ops.convert_to_numpy(model.embedding.logits(normed))
    return _softmax(np.asarray(logits, np.float64)).astype(np.float32)


@dataclasses.dataclass(frozen=True)
class Attribution:
    """`token`'s logit at `position` split into what each part wrote into the residual stream, through the final
    norm held at the run's scale: `embedding` (the token and position vectors), `heads` (L, H) (each head's share
    of its attention's output projection), `attention_bias` (L,) (each output projection's bias, where it has one),
    `feed_forward` (L,), and `final_shift` (the final norm's shift, where it has one); a Seq2Seq's
    `cross_heads` (L, H) and `cross_bias` (L,) too. `total()` is their sum, which is `logit`."""

    position: int
    token: int
    logit: float
    embedding: float
    heads: np.ndarray
    attention_bias: np.ndarray
    feed_forward: np.ndarray
    final_shift: float
    cross_heads: np.ndarray = None
    cross_bias: np.ndarray = None

    def total(self):
        parts = [self.embedding, self.heads.sum(), self.attention_bias.sum(), self.feed_forward.sum(),
                 self.final_shift]
        if self.cross_heads is not None:
            parts += [self.cross_heads.sum(), self.cross_bias.sum()]
        return float(sum(parts))

    def largest(self, count=5):
        """The `count` parts of largest size, as (name, value), largest first: "embedding", "layer 1 head 2",
        "layer 0 feed-forward", ..."""
        named = [("embedding", self.embedding), ("final norm's shift", self.final_shift)]
        for layer in range(len(self.feed_forward)):
            named += [(f"layer {layer} head {head}", value) for head, value in enumerate(self.heads[layer])]
            named += [(f"layer {layer} attention bias", self.attention_bias[layer]),
                      (f"layer {layer} feed-forward", self.feed_forward[layer])]
            if self.cross_heads is not None:
                named += [(f"layer {layer} cross head {head}", value)
                          for head, value in enumerate(self.cross_heads[layer])]
        return sorted(((name, float(value)) for name, value in named), key=lambda part: -abs(part[1]))[:count]


def attribution(trace, position, token):
    """`token`'s logit at `position` of `trace` as an `Attribution`."""
    model = _model_of(trace)
    if model.final_norm is None:
        raise ConfigError("a post-norm model normalises its residual stream after every block, so a logit is no sum "
                          "of what each part wrote: its attribution needs a pre-norm model")
    length, n_layer = len(trace.ids), model.config.n_layer
    if isinstance(position, bool) or not isinstance(position, (int, np.integer)) or not 0 <= position < length:
        raise InputError(f"there is no position {position!r}: this trace's are 0 to {length - 1}")
    token = token_named(model, token)
    cross = "cross_attention" in trace.layers[0]
    steps = ("head_outputs", "attention_output", "feed_forward_output", "output") + \
        (("cross_head_outputs", "cross_output") if cross else ())
    kept = run(model, trace.inputs, ["embedding"] + [step_name(step, layer) for layer in range(n_layer)
                                                     for step in steps], trace.edits)
    final = kept[step_name("output", n_layer - 1)][position]
    centred, scale, shift = frozen_norm(model.final_norm, final)

    def logit_of(vectors):  # vectors (..., C) through the frozen norm (no shift) and the head: each one's logit
        vectors = np.asarray(vectors, np.float64)
        if centred:
            vectors = vectors - vectors.mean(axis=-1, keepdims=True)
        normed = ops.convert_to_tensor((vectors * scale).astype(np.float32).reshape(-1, vectors.shape[-1]))
        logits = np.asarray(ops.convert_to_numpy(model.embedding.logits(normed)), np.float64)[:, token]
        return logits.reshape(vectors.shape[:-1])

    def part(step):
        return np.stack([kept[step_name(step, layer)][..., position, :] for layer in range(n_layer)])

    heads = part("head_outputs")  # (L, H, C)
    parts = dict(heads=logit_of(heads), attention_bias=logit_of(part("attention_output") - heads.sum(axis=1)),
                 feed_forward=logit_of(part("feed_forward_output")))
    if cross:
        cross_heads = part("cross_head_outputs")
        parts.update(cross_heads=logit_of(cross_heads), cross_bias=logit_of(part("cross_output")
                                                                            - cross_heads.sum(axis=1)))
    shift_logit = float(np.asarray(ops.convert_to_numpy(model.embedding.logits(
        ops.convert_to_tensor(shift.astype(np.float32)[None]))), np.float64)[0, token])
    return Attribution(int(position), token, float(trace.steps["logits"][position, token]),
                       float(logit_of(kept["embedding"][position])), final_shift=shift_logit, **parts)


def _model_of(trace):
    if trace.model is None:
        raise ConfigError("this trace holds no model (it came from JSON): trace the model again to read its stream")
    return trace.model


def _softmax(logits):
    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)
