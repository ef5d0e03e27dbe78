"""A model's compiled decoding programs: the prefill, which runs prompts through the model and draws each
row's first token, and the decode loops, which draw up to CHUNK_SIZE tokens of every row in one call (or
extend beams). `gptlite.decode.engine.Engine` plans the calls and keeps the state between them.

Each program is a TensorFlow graph (with XLA where it pays), a jitted JAX
function, or on torch the function itself, run eagerly; each is traced once
per batch size and cache span: prompt lengths, sampling settings, seeds and
step counts are tensor inputs.
"""

import functools
import weakref

import keras
from keras import ops

from gptlite.backend import compile_cache
from gptlite.decode.compiled import Compiled
from gptlite.decode.sampling import (TOP_LOGPROBS, choose_beams, sample_next_token, token_counts,
                                     token_log_probabilities, uniform_noise)

# Tokens drawn per compiled call at most: more amortise the call's overhead, fewer stream text (and
# admit waiting rows) sooner. A call's step count is a tensor input: any count up to this compiles once.
CHUNK_SIZE = 32
# The kinds of steps one call runs (see gptlite.decode.engine.plan_steps).
CACHED, RECOMPUTE, RECOMPUTE_THEN_CACHED = "cached", "recompute", "recompute then cached"


class Programs:
    """The compiled prefill and decode loops of one model, each made on first use and kept.

    Each is traced once per batch size and cache span: prompt lengths,
    sampling settings, seeds and step counts are tensor inputs.
    """

    def __init__(self, model):
        # Weakly, so that the model's entry in _programs can go when the model does.
        self._model = weakref.ref(model)
        self.variables = model.variables  # the weights its programs read, in order
        compile_cache.tidy()
        self._compiled = {}
        self._prepared = set()

    @property
    def model(self):
        return self._model()

    @property
    def traces(self):
        """How often its programs' Python functions have run to be compiled, in all (on torch, which compiles
        nothing, how often they ran): what a warm-up is meant to leave nothing for."""
        return sum(program.traces for program in self._compiled.values())

    @property
    def built(self):
        """How many programs it holds: traced here, loaded from the compile cache's folder, or shared with another
        model of the same architecture in this process."""
        return sum(program.built for program in self._compiled.values())

    @property
    def loads(self):
        """How many of its programs came from the compile cache's folder rather than being traced."""
        return sum(program.loads for program in self._compiled.values())

    def first_preparation(self, program, batch_size, span):
        """Whether `program` (a Compiled of these) is to be prepared for this batch size and cache span for the
        first time: once it has, it is ready, and preparing it again would only make its inputs to find that."""
        key = (program.name, batch_size, span)
        first = key not in self._prepared
        self._prepared.add(key)
        return first

    def _get(self, key, function, xla=True):
        # setdefault: two threads asking at once (a server's warm-up) get one Compiled
        return self._compiled.get(key) or self._compiled.setdefault(key, Compiled(key, function, self.model, xla=xla))

    def prefill(self, logprobs=False, filtering=True, penalised=False, sampling=True, compiled_prefill=False,
                span=None):
        """The prefill program; `compiled_prefill`: with XLA even where the model's prefill is a plain graph (see
        `Engine`); `span`: the cache it gives has that many slots (None: as many as its columns)."""
        needs = dict(logprobs=logprobs, filtering=filtering, penalised=penalised, sampling=sampling)
        xla = compiled_prefill or self.model.compiled_prefill
        return self._get(("prefill", *needs.values(), *(["xla"] if xla else []), *([span] if span else [])),
                         functools.partial(self._sample_prefill, **needs, span=span), xla=xla)

    @property
    def beam_prefill(self):
        return self._get("beam prefill", self._beam_prefill, xla=self.model.compiled_prefill)

    def loop(self, kind, steps_kind, slide, logprobs=False, filtering=True, penalised=False, sampling=True):
        """The compiled decode loop of `kind` ("sample" or "beam") for one kind of steps.

        RECOMPUTE: every step runs the whole window through the model (a full
        window first moves `slide` tokens). CACHED: every step attends over
        the cache, and no window may be full. RECOMPUTE_THEN_CACHED: the first
        step recomputes, the others use the cache. `logprobs`: the steps also
        give log-probabilities; `filtering`: some row keeps fewer than all
        tokens; `penalised`: some row has a repetition penalty; `sampling`:
        some row samples (without it, no noise is drawn).
        """
        needs = dict(logprobs=logprobs, filtering=filtering, penalised=penalised, sampling=sampling)
        chunk = functools.partial(self._sample_chunk, **needs) if kind == "sample" else self._beam_chunk
        return self._get((kind, steps_kind, slide, *needs.values()),
                         functools.partial(chunk, steps_kind=steps_kind, slide=slide))

    @property
    def placed(self):
        """The program that places a prefill's rows into a running batch's free slots on a GPU (see `Engine.admit`;
        a CPU's are placed with NumPy): one call, rather than a few eager operations for each part of the state."""
        return self._get("placed rows", _placed_rows, xla=False)

    # --- the model's step

    def _forward(self, tokens, cache, positions, context, logits_at=None):
        return self.model.call_with_cache(tokens, cache, positions, *context, logits_at=logits_at)

    def _forward_window(self, window, lengths, context):
        """The logits (B, V) after each row's `lengths` tokens of the window, and a cache of as many slots as the
        window has columns."""
        batch_size, width = ops.shape(window)
        logits, cache = self._forward(window, self.model.empty_cache(batch_size, width),
                                      ops.zeros((batch_size,), "int32"), context, logits_at=lengths - 1)
        return logits[:, 0], cache

    def _advance(self, window, lengths, cache, tokens, context, recompute, slide, active=None):
        """Append tokens (B,) to the active rows' windows; return the logits after them (B, V) and the new state.

        A full window first moves `slide` tokens: the new token joins its last
        block_size - slide tokens, left-aligned. Moving shifts every token's
        position, so then the window must be recomputed (`recompute`). An
        inactive row (a free slot, or a row that has drawn its tokens of the
        call) keeps its window and length; a cached step writes its cache at
        the slot after its window (the last, for a full window), which it does
        not read: it overwrites that slot when it goes on (a full window, by
        recomputing).
        """
        block_size = self.model.config.block_size
        batch_size = ops.shape(window)[0]
        slots = ops.arange(block_size)[None, :]  # (1, S)
        full = ops.greater_equal(lengths, block_size)  # (B,)
        slid = ops.concatenate(
            [window[:, slide:], tokens[:, None], ops.zeros((batch_size, slide - 1), "int32")], axis=1
        )
        placed = ops.where(ops.equal(slots, lengths[:, None]), tokens[:, None], window)
        moved = ops.where(full[:, None], slid, placed)
        grown = ops.where(full, block_size - slide + 1, lengths + 1)
        if active is None:
            window, positions, lengths = moved, lengths, grown
        else:
            window = ops.where(active[:, None], moved, window)
            positions = ops.where(active, lengths, ops.minimum(lengths, ops.shape(cache[0])[3] - 1))
            lengths = ops.where(active, grown, lengths)

        if recompute:
            logits, cache = self._forward_window(window, lengths, context)
            return logits, window, lengths, cache
        logits, cache = self._forward(tokens[:, None], cache, positions, context)
        return logits[:, 0], window, lengths, cache

    # --- sampling

    def _sample_prefill(self, prompt, lengths, sources, settings, seeds, produced, logprobs, filtering, penalised,
                        sampling, span):
        """Run the windows' first columns, `prompt` (see `prompt_columns`), through the model;
        draw each row's next token, its token number `produced` (B,): 0 for a new row's first. The cache is
        widened to `span` slots, if given."""
        context = self.model.decoding_context(sources)
        logits, cache = self._forward_window(prompt, lengths, context)
        if span is not None and ops.shape(cache[0])[3] < span:
            cache = fit_cache(cache, span)
        vocabulary_size = self.model.config.vocab_size
        noise = uniform_noise(seeds, produced, vocabulary_size) if sampling else None  # (B, V)
        seen = token_counts(prompt, lengths, self.model.config.vocab_size) if penalised else None
        token = sample_next_token(logits, settings, noise, seen, filtering)
        scores = token_log_probabilities(logits, token) if logprobs else ()
        return token, cache, context, *scores

    def _sample_chunk(self, state, limits, steps, steps_kind, slide, logprobs, filtering, penalised, sampling):
        """Draw `steps` (<= CHUNK_SIZE) tokens of each row, the first min(steps, limits) of them for row b (its
        tokens produced ..; limits (B,): 0 for a free slot) -> (tokens (B, CHUNK_SIZE), the DecodeState after
        them, log-probabilities or ()). A row past its limit waits, its state kept, while the others go on."""
        noise = self._noise(state.seeds, state.produced) if sampling else None  # (CHUNK_SIZE, B, V)
        batch_size = ops.shape(state.window)[0]

        def body(step, window, lengths, cache, pending, drawn, chosen, top_ids, top_values, recompute):
            active = ops.less(step, limits)  # (B,)
            logits, window, lengths, cache = self._advance(window, lengths, cache, pending, state.context, recompute,
                                                           slide, active)
            seen = token_counts(window, lengths, self.model.config.vocab_size) if penalised else None
            step_noise = None if noise is None else ops.take(noise, step, axis=0)
            # A waiting row keeps the token it chose last, which its window has not taken yet.
            pending = ops.where(active, sample_next_token(logits, state.settings, step_noise, seen, filtering),
                                pending)
            drawn = _record(drawn, step, pending)
            if logprobs:
                scores = token_log_probabilities(logits, pending)
                chosen, top_ids, top_values = (_record(record, step, value) for record, value in
                                               zip((chosen, top_ids, top_values), scores))
            return step + 1, window, lengths, cache, pending, drawn, chosen, top_ids, top_values

        drawn = ops.zeros((batch_size, CHUNK_SIZE), "int32")
        top = min(TOP_LOGPROBS, self.model.config.vocab_size)
        records = ((ops.zeros((batch_size, CHUNK_SIZE)), ops.zeros((batch_size, CHUNK_SIZE, top), "int32"),
                    ops.zeros((batch_size, CHUNK_SIZE, top))) if logprobs else ((), (), ()))
        _, window, lengths, cache, pending, drawn, *scores = _loop(
            body, steps, (state.window, state.lengths, state.cache, state.pending, drawn, *records), steps_kind)
        produced = ops.add(state.produced, ops.minimum(steps, limits))
        state = state._replace(window=window, lengths=lengths, cache=cache, pending=pending, produced=produced)
        return drawn, state, tuple(scores) if logprobs else ()

    def _noise(self, seeds, produced):
        """Each row's uniform noise in (0, 1) for its tokens produced .. produced + CHUNK_SIZE - 1: (CHUNK_SIZE, B, V).
        A token's noise depends on its row's seed and its index alone."""
        produced, seeds = (ops.expand_dims(ops.convert_to_tensor(values, "int32"), 0) for values in (produced, seeds))
        indices = produced + ops.expand_dims(ops.arange(CHUNK_SIZE, dtype="int32"), 1)  # (CHUNK_SIZE, B)
        return uniform_noise(seeds, indices, self.model.config.vocab_size)

    # --- beam search

    def _beam_prefill(self, window, prompt, lengths, sources, scores, finished, end_token):
        context = self.model.decoding_context(sources)
        logits, cache = self._forward_window(prompt, lengths, context)
        pending, _, scores, finished, (window, lengths, cache) = choose_beams(
            logits, scores, finished, end_token, (window, lengths, cache))
        # The context needs no reordering: a row's beams share their source.
        return pending, scores, finished, window, lengths, cache, context

    def _beam_chunk(self, window, lengths, cache, pending, context, scores, finished, end_token, steps, steps_kind,
                    slide):
        """Extend every beam `steps` (<= CHUNK_SIZE) tokens -> (tokens, parents (B, CHUNK_SIZE), state...).

        Column t of `parents` says which beam each beam continued at step t;
        the caller follows them back to rebuild the sequences.
        """

        def body(step, window, lengths, cache, pending, scores, finished, drawn, parents, recompute):
            logits, window, lengths, cache = self._advance(window, lengths, cache, pending, context, recompute, slide)
            pending, chosen, scores, finished, (window, lengths, cache) = choose_beams(
                logits, scores, finished, end_token, (window, lengths, cache))
            return (step + 1, window, lengths, cache, pending, scores, finished,
                    _record(drawn, step, pending), _record(parents, step, chosen))

        empty = ops.zeros((ops.shape(window)[0], CHUNK_SIZE), "int32")
        _, *state = _loop(body, steps, (window, lengths, cache, pending, scores, finished, empty, empty), steps_kind)
        window, lengths, cache, pending, scores, finished, drawn, parents = state
        return drawn, parents, window, lengths, cache, pending, scores, finished


def fit_cache(cache, span):
    """The cache with `span` slots: cut, or padded with zeros.

    Cutting drops only slots past every active row's length, which no step
    reads before writing them.
    """
    slots = ops.shape(cache[0])[3]
    if slots > span:
        return tuple(layer[:, :, :, :span] for layer in cache)
    if slots < span:
        return tuple(ops.pad(layer, [(0, 0), (0, 0), (0, 0), (0, span - slots), (0, 0)]) for layer in cache)
    return cache


def _placed_rows(state, new, taken, placed):
    """`state` with its row s replaced by row taken[s] of `new` where placed[s] (both DecodeStates, their
    caches of one span; taken and placed (S,))."""

    def place(kept, value):
        mask = ops.reshape(placed, (-1,) + (1,) * (len(ops.shape(kept)) - 1))
        return ops.where(mask, ops.take(value, taken, axis=0), kept)

    return keras.tree.map_structure(place, state, new)


def _loop(body, steps, state, steps_kind):
    """Run body(step, *state, recompute) -> (step + 1, *state) `steps` times (1 to CHUNK_SIZE)."""
    step = ops.convert_to_tensor(0, "int32")
    if steps_kind == RECOMPUTE_THEN_CACHED:
        step, *state = body(step, *state, recompute=True)
    return ops.while_loop(
        lambda step, *_: ops.less(step, steps),
        functools.partial(body, recompute=steps_kind == RECOMPUTE),
        (step, *state),
        maximum_iterations=CHUNK_SIZE,
    )


def _record(drawn, step, values):
    """Write values (B, ...) into column `step` of drawn (B, N, ...); a step past the last column writes nothing."""
    column = ops.equal(ops.arange(ops.shape(drawn)[1]), step)
    column = ops.reshape(column, (1, -1) + (1,) * (len(ops.shape(drawn)) - 2))
    return ops.where(column, ops.expand_dims(ops.cast(values, drawn.dtype), 1), drawn)


# One Programs (compiled functions) per model, made on first use; they hold no decoding state.
_programs = weakref.WeakKeyDictionary()


def programs_for(model):
    """The model's Programs; a new model, never called, is built first (decoding random weights is allowed).
    A model that has gained variables since (LoRA's adapters) gets new ones: its programs read them all."""
    if not model.built:
        model.build()
    if model not in _programs or len(_programs[model].variables) != len(model.variables):
        _programs[model] = Programs(model)
    return _programs[model]
