"""The decode loop: token ids in, new token ids out, through a key/value cache.

One `Decoder` serves a GPT and a Seq2Seq alike. Each row of a batch has a
window of up to block_size tokens: a GPT's is the prompt's end, a Seq2Seq's
the start token and the target so far, read with a `context` that the
decoder computes once per source (each decoder block's cross-attention keys
and values, and the source's padding mask; a GPT's context is empty). Then:

1. Prefill: the windows, right-padded to the width their longest needs
   (`prompt_columns`), run through the model once; every block's keys and
   values land in a cache of that many slots, and the first new token is
   chosen from the logits at each row's last position.
2. Decode: each step feeds one token per row at that row's own position,
   writes its key and value into the cache, and chooses the next token.
   Attention reads every slot of the cache. A process that decodes many
   times (a server) can `keep_caches_short`: each call's cache then has only
   the slots its steps reach (`cache_span`: a power of two from
   PREFILL_WIDTH up to block_size), grown between calls, so that a batch of
   many rows, whose steps are bound by reading the cache, costs what its
   text's length needs, for one compile of each loop per span.
3. Sliding: a step that finds a row's window full moves it `slide` tokens
   and recomputes the whole window, since every position has shifted. (A
   Seq2Seq's target is at most block_size - 1 tokens: it never slides.)

Which steps recompute follows from the window lengths alone, so the host
plans the calls ahead (`plan_calls`), and their cache spans: runs of cached
steps go to one compiled while-loop and runs of recomputing steps to
another (a wider slide adds a third: one recomputing step, then cached
ones), each drawing up to CHUNK_SIZE tokens per call and keeping its state
on the device. On TensorFlow the prefill is a plain graph, quick to build,
so the first token comes without waiting for a compiler while the loops
compile with XLA on a background thread. On JAX every function is jitted
(the loops on that thread too); torch runs them eagerly. Sampling settings
and the seed are tensor inputs, so prompt length, temperature, top-k, top-p
and seed never cause a recompile.

Randomness is explicit: a token's noise is drawn from (seed, its index), so
the same seed gives the same text with or without the cache, however calls
interleave; sampling is the Gumbel-max trick on that noise.
"""

import concurrent.futures
import functools
import weakref

import keras
import numpy as np
from keras import ops

from gptlite.model import Seq2Seq
from gptlite.sampling import choose_beams, sample_next_token, uniform_noise

# Tokens drawn per compiled call at most: more amortise the call's overhead,
# fewer stream text sooner. The first call after prefill is short, so text
# starts flowing at once.
CHUNK_SIZE = 32
FIRST_CHUNK_SIZE = 8
# The narrowest prefill of a GPT's windows (see prompt_columns), and the shortest cache a call reads.
PREFILL_WIDTH = 64
# The kinds of steps one decode call runs (see Decoder.loop).
CACHED, RECOMPUTE, RECOMPUTE_THEN_CACHED = "cached", "recompute", "recompute then cached"


class Decoder:
    """The compiled prefill and decode loops of one model.

    Decoding state, kept on the device between calls:
        window (B, block_size)  each row's last tokens, left-aligned
        lengths (B,)            how many of them are real
        cache                   keys and values of window[:, :lengths]
        pending (B,)            the token chosen last, not yet in the window
        context                 what every step reads besides: () for a GPT
    Beam search adds scores (rows, beams), the summed log-probability of each
    beam, and finished (B,), which beams have chosen the end token; its B
    counts every beam of every row.
    """

    def __init__(self, model):
        # Weakly, so that the model's entry in _decoders can go when the model does.
        self._model = weakref.ref(model)
        # Never advanced: its state is swapped for each call's seed (see _noise).
        self.seed_generator = keras.random.SeedGenerator(0)
        # A GPT's prefill is a plain graph on TensorFlow, quick to build, so that the first token comes
        # without waiting for a compiler; a Seq2Seq's targets come whole, so its prefill compiles too.
        xla = isinstance(model, Seq2Seq)
        self.prefill = {"sample": _Compiled(self._sample_prefill, model, xla=xla),
                        "beam": _Compiled(self._beam_prefill, model, xla=xla)}
        self._loops = {}
        self._warm_ups = {}
        self.short_caches = False  # see keep_caches_short

    @property
    def model(self):
        return self._model()

    def loop(self, kind, steps_kind, slide):
        """The compiled decode loop of `kind` ("sample" or "beam") for one kind of steps.

        RECOMPUTE: every step runs the whole window through the model (a full
        window first moves `slide` tokens). CACHED: every step attends over
        the cache, and no window may be full. RECOMPUTE_THEN_CACHED: the first
        step recomputes, the others use the cache.
        """
        key = (kind, steps_kind, slide)
        if key not in self._loops:
            chunk = self._sample_chunk if kind == "sample" else self._beam_chunk
            self._loops[key] = _Compiled(functools.partial(chunk, steps_kind=steps_kind, slide=slide), self.model)
        return self._loops[key]

    def warm_up(self, kind, calls, slide, batch_size, example_args):
        """Start compiling the loops that `calls` need, in the order needed; {(steps kind, span): future}.

        example_args(span): arguments of the loops' shapes, with a cache of `span` slots.
        """
        futures = {}
        for steps_kind, span in dict.fromkeys(call[2:] for call in calls):
            function = self.loop(kind, steps_kind, slide)
            key = (function, batch_size, span)
            if key not in self._warm_ups:
                self._warm_ups[key] = _in_background(function, *example_args(span))
            futures[steps_kind, span] = self._warm_ups[key]
        return futures

    def example_state(self, batch_size, context, span):
        """Zero state of the loops' shapes, with a cache of `span` slots, to compile them with."""
        block_size = self.model.config.block_size
        return (np.zeros((batch_size, block_size), "int32"), np.zeros(batch_size, "int32"),
                self.model.empty_cache(batch_size, span), np.zeros(batch_size, "int32"), context)

    # --- the model's step

    def _context(self, sources):
        """What every step of a Seq2Seq reads from its sources (B, S); () for a GPT (sources None)."""
        if sources is None:
            return ()
        source_mask = self.model.source_mask(sources)
        encoded = self.model.encode(sources, source_mask)  # (B, S, C)
        return self.model.cross_key_values(encoded), source_mask

    def _forward(self, tokens, cache, positions, context):
        return self.model.call_with_cache(tokens, cache, positions, *context)

    def _forward_window(self, window, context):
        """The window's logits, and a cache of as many slots as the window has columns."""
        batch_size, width = ops.shape(window)
        return self._forward(window, self.model.empty_cache(batch_size, width), ops.zeros((batch_size,), "int32"),
                             context)

    def _advance(self, window, lengths, cache, tokens, context, recompute, slide):
        """Append tokens (B,) to the windows; return the logits after them (B, V) and the new state.

        A full window first moves `slide` tokens: the new token joins its last
        block_size - slide tokens, left-aligned. Moving shifts every token's
        position, so then the window must be recomputed (`recompute`).
        """
        block_size = self.model.config.block_size
        batch_size = ops.shape(window)[0]
        slots = ops.arange(block_size)[None, :]  # (1, S)
        full = ops.greater_equal(lengths, block_size)  # (B,)
        slid = ops.concatenate(
            [window[:, slide:], tokens[:, None], ops.zeros((batch_size, slide - 1), "int32")], axis=1
        )
        placed = ops.where(ops.equal(slots, lengths[:, None]), tokens[:, None], window)
        window = ops.where(full[:, None], slid, placed)
        positions = lengths
        lengths = ops.where(full, block_size - slide + 1, lengths + 1)

        if recompute:
            logits, cache = self._forward_window(window, context)
            return _logits_at(logits, lengths - 1), window, lengths, cache
        logits, cache = self._forward(tokens[:, None], cache, positions, context)
        return logits[:, 0], window, lengths, cache

    # --- sampling

    def _sample_prefill(self, prompt, lengths, sources, settings, seed):
        """Run the windows' first columns, `prompt` (see `prompt_columns`), through the model;
        draw each row's first new token (token 0)."""
        context = self._context(sources)
        logits, cache = self._forward_window(prompt, context)
        noise = self._noise_block(seed, 0, ops.shape(prompt)[0])[0]  # (B, V)
        return sample_next_token(_logits_at(logits, lengths - 1), settings, noise), cache, context

    def _sample_chunk(self, window, lengths, cache, pending, context, settings, seed, first, steps, steps_kind,
                      slide):
        """Draw tokens first .. first + steps - 1 (steps <= CHUNK_SIZE) -> (tokens (B, CHUNK_SIZE), state...)."""
        noise = self._noise(seed, first, ops.shape(window)[0])

        def body(step, window, lengths, cache, pending, drawn, recompute):
            logits, window, lengths, cache = self._advance(window, lengths, cache, pending, context, recompute, slide)
            pending = sample_next_token(logits, settings, ops.take(noise, step, axis=0))
            return step + 1, window, lengths, cache, pending, _record(drawn, step, pending)

        drawn = ops.zeros((ops.shape(window)[0], CHUNK_SIZE), "int32")
        _, window, lengths, cache, pending, drawn = _loop(
            body, steps, (window, lengths, cache, pending, drawn), steps_kind)
        return drawn, window, lengths, cache, pending

    def _noise(self, seed, first, batch_size):
        """Uniform noise in (0, 1) for tokens first .. first + CHUNK_SIZE - 1: (CHUNK_SIZE, B, V).

        Noise comes in blocks of CHUNK_SIZE token indices, each drawn from
        (seed, block number), so a token's noise depends on its index alone,
        not on how the tokens were split between calls.
        """
        block = first // CHUNK_SIZE
        both = ops.concatenate([self._noise_block(seed, block, batch_size),
                                self._noise_block(seed, block + 1, batch_size)], axis=0)
        # A gather, not a slice: XLA would compile a slice anew for every start.
        return ops.take(both, first - block * CHUNK_SIZE + ops.arange(CHUNK_SIZE), axis=0)

    def _noise_block(self, seed, block, batch_size):
        """The noise of tokens block * CHUNK_SIZE onwards: (CHUNK_SIZE, B, V)."""
        shape = (CHUNK_SIZE, batch_size, self.model.config.vocab_size)
        return uniform_noise(self.seed_generator, seed, block, shape)

    # --- beam search

    def _beam_prefill(self, window, prompt, lengths, sources, scores, finished, end_token):
        context = self._context(sources)
        logits, cache = self._forward_window(prompt, context)
        pending, _, scores, finished, (window, lengths, cache) = choose_beams(
            _logits_at(logits, lengths - 1), scores, finished, end_token, (window, lengths, cache))
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


def _record(drawn, step, tokens):
    """Write tokens (B,) into column `step` of drawn (B, N); a step past the last column writes nothing."""
    return ops.where(ops.equal(ops.arange(ops.shape(drawn)[1])[None, :], step), tokens[:, None], drawn)


def _logits_at(logits, indices):
    """logits (B, T, V), indices (B,) -> (B, V): row b's logits at position indices[b]."""
    # Rows of the flattened logits rather than ops.take_along_axis, which on TensorFlow
    # transposes int64 indices, and TensorFlow logs an error for that outside XLA.
    rows, length = ops.shape(logits)[0], ops.shape(logits)[1]
    flat = ops.reshape(logits, (-1, ops.shape(logits)[2]))  # (B*T, V)
    return ops.take(flat, ops.arange(rows) * length + ops.cast(indices, "int32"), axis=0)


class _Compiled:
    """A decode function compiled for the backend: a TensorFlow graph (with XLA
    if `xla`), a jitted JAX function taking the model's weights as arguments,
    or, on torch, the function itself, run eagerly. `traces` counts how often
    the Python function ran to be compiled (on torch: how often it ran).
    """

    def __init__(self, function, model, xla=True):
        self.traces = 0
        self.compiled = keras.backend.backend() in ("tensorflow", "jax")

        def traced(*args):
            self.traces += 1
            return function(*args)

        backend = keras.backend.backend()
        if backend == "tensorflow":
            import tensorflow as tf

            # The loops are written with ops.while_loop and ops.cond, so autograph
            # has nothing to convert; leaving it off makes tracing quicker.
            self._call = tf.function(traced, jit_compile=xla, autograph=False)
            tf.get_logger().addFilter(_without_retracing_warnings)
        elif backend == "jax":
            import jax

            # Weights as arguments, not constants baked into the program: the
            # program stays small and sees the weights as they are at each call.
            variables = model.variables

            def stateless(values, *args):
                with keras.StatelessScope(state_mapping=list(zip(variables, values))):
                    return traced(*args)

            jitted = jax.jit(stateless)
            self._call = lambda *args: jitted([variable.value for variable in variables], *args)
        else:
            import torch

            def without_gradients(*args):
                # Eager torch would otherwise record every step for a backward pass that never comes.
                with torch.no_grad():
                    return traced(*args)

            self._call = without_gradients

    def __call__(self, *args):
        return self._call(*args)


def _without_retracing_warnings(record):
    """Drop TensorFlow's warning that functions are traced often: these are traced once per batch size and
    cache span, as planned, and TensorFlow counts every _Compiled function as one (they share `traced`'s code)."""
    return "triggered tf.function retracing" not in record.getMessage()


_compiler = None


def _in_background(function, *args):
    """Call a _Compiled function(*args) on the one compile thread; a future of its result."""
    global _compiler
    if not function.compiled:
        done = concurrent.futures.Future()
        done.set_result(None)  # nothing to compile ahead
        return done
    if _compiler is None:
        _compiler = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="gptlite-compile")
    return _compiler.submit(function, *args)


# One decoder (compiled functions) per model, made on first use.
_decoders = weakref.WeakKeyDictionary()


def decoder_for(model):
    """The model's Decoder; a new model, never called, is built first (decoding random weights is allowed)."""
    if not model.built and isinstance(model, Seq2Seq):
        model.build()
    elif not model.built:
        model.build((None, model.config.block_size))
    if model not in _decoders:
        _decoders[model] = Decoder(model)
    return _decoders[model]


def keep_caches_short(model, short=True):
    """Have every later decode of `model` read a cache only as long as its text needs (see `plan_calls`).

    Each loop then compiles once for each cache span it meets (64, 128, ...
    up to block_size slots): seconds more, once per process, for steps that
    no longer read the empty rest of the cache. That pays in a process that
    decodes many times, most of all in batches of many rows (a server: 1.5x
    the tokens per second for 16 rows of a 6-layer, 384-wide model at
    context 256, BENCHMARKS.md); a single generation would spend more
    compiling than it saves, so by default every call reads the whole cache.
    """
    decoder_for(model).short_caches = short


def windows(block_size, rows_ids):
    """Each row's last block_size token ids, left-aligned in (B, block_size), and their lengths (B,)."""
    window = np.zeros((len(rows_ids), block_size), dtype=np.int32)
    lengths = np.zeros(len(rows_ids), dtype=np.int32)
    for index, ids in enumerate(rows_ids):
        context = ids[-block_size:]
        window[index, : len(context)] = context
        lengths[index] = len(context)
    return window, lengths


def cache_span(slots, block_size):
    """The cache length that holds `slots` positions: a power of two, at least PREFILL_WIDTH, at most block_size.

    Powers of two, so that texts of every length compile each loop a few
    times at most (once per span).
    """
    return min(block_size, max(PREFILL_WIDTH, 1 << (max(1, slots) - 1).bit_length()))


def prompt_columns(window, lengths, sources):
    """The columns of the windows that the prefill reads: enough for the longest.

    A GPT's: `cache_span` of the longest, so that a short prompt in a long
    context runs through the model at its length rather than the whole
    window's. A Seq2Seq's windows are short, most often its start token
    alone: exactly the longest.
    """
    longest = max(1, int(np.max(lengths)))
    if sources is not None:
        return window[:, :longest]
    return window[:, :cache_span(longest, window.shape[1])]


def fit_cache(cache, span):
    """The cache with `span` slots: cut, or padded with zeros.

    Cutting drops only slots past every row's length, which no step reads
    before writing them.
    """
    slots = ops.shape(cache[0])[3]
    if slots > span:
        return tuple(layer[:, :, :, :span] for layer in cache)
    if slots < span:
        return tuple(ops.pad(layer, [(0, 0), (0, 0), (0, 0), (0, span - slots), (0, 0)]) for layer in cache)
    return cache


def plan_calls(lengths, block_size, max_new_tokens, use_cache, slide, first_chunk=FIRST_CHUNK_SIZE,
               short_caches=False):
    """The decode calls after the prefill's token: a list of (first token index, steps, steps kind, cache span).

    Which steps find a full window, and so must recompute it, follows from
    the window lengths alone: a window grows by one token a step until it is
    full, then moves back by `slide`. A call holds steps of one kind (one
    recomputing step may lead cached ones), at most `first_chunk` in the
    first call and CHUNK_SIZE after. Every call's cache has block_size
    slots, unless `short_caches`: a cached step writes at the longest
    window's length, so a call of cached steps then has a cache of its last
    step's length + 1 slots (`cache_span` of it); a recomputing one, block_size.
    """
    lengths = np.asarray(lengths)
    calls = []
    for index in range(1, max_new_tokens):
        full = lengths >= block_size
        kind = RECOMPUTE if full.any() or not use_cache else CACHED
        slots = block_size if kind == RECOMPUTE else int(lengths.max()) + 1
        lengths = np.where(full, block_size - slide + 1, lengths + 1)
        last = calls[-1] if calls else None
        if last is None or last[1] == (first_chunk if len(calls) == 1 else CHUNK_SIZE):
            calls.append([index, 1, kind, slots])
        elif last[2] == kind or (last[2] == RECOMPUTE_THEN_CACHED and kind == CACHED):
            last[1], last[3] = last[1] + 1, max(last[3], slots)
        elif last[2] == RECOMPUTE and last[1] == 1 and kind == CACHED:
            # One recomputation and the cached steps after it share a call (and its whole cache).
            last[1], last[2] = 2, RECOMPUTE_THEN_CACHED
        else:
            calls.append([index, 1, kind, slots])
    return [(first, steps, kind, cache_span(slots, block_size) if short_caches else block_size)
            for first, steps, kind, slots in calls]


def sample(model, window, lengths, sources, max_new_tokens, settings, seed, use_cache=True, slide=1):
    """Yield, for each new position, an int array (B,) of the tokens sampled for every row.

    window, lengths: as from `windows`; sources: a Seq2Seq's source ids (B, S), or None for a GPT.
    """
    if max_new_tokens == 0:
        return
    decoder = decoder_for(model)
    # A short first call streams a GPT's text at once; a Seq2Seq's targets come whole, in as few calls as can be.
    first_chunk = FIRST_CHUNK_SIZE if sources is None else CHUNK_SIZE
    calls = plan_calls(lengths, model.config.block_size, max_new_tokens, use_cache, slide, first_chunk,
                       decoder.short_caches)
    pending, cache, context = decoder.prefill["sample"](prompt_columns(window, lengths, sources), lengths, sources,
                                                        settings, seed)
    # Compiling starts once the prefill is traced, so that the two do not contend for the interpreter.
    ready = decoder.warm_up("sample", calls, slide, len(window), lambda span: (
        *decoder.example_state(len(window), context, span), settings, seed, np.int32(1), np.int32(0)))
    yield keras.ops.convert_to_numpy(pending)
    for first, steps, steps_kind, span in calls:
        ready[steps_kind, span].result()
        cache = fit_cache(cache, span)
        drawn, window, lengths, cache, pending = decoder.loop("sample", steps_kind, slide)(
            window, lengths, cache, pending, context, settings, seed, np.int32(first), np.int32(steps))
        yield from keras.ops.convert_to_numpy(drawn)[:, :steps].T


def beam_search(model, window, lengths, sources, max_new_tokens, beams, end_token, use_cache=True, slide=1):
    """The likeliest continuation of each row found by beam search: an int array (B, up to max_new_tokens).

    Decoding ends early once every beam has chosen `end_token` (None: never).
    """
    if max_new_tokens == 0:
        return np.zeros((len(window), 0), "int32")
    decoder = decoder_for(model)
    rows = len(window)
    window, lengths = np.repeat(window, beams, axis=0), np.repeat(lengths, beams)  # (B * beams, S)
    if sources is not None:
        sources = np.repeat(sources, beams, axis=0)
    scores = np.full((rows, beams), -np.inf, dtype="float32")
    scores[:, 0] = 0  # the copies of a row are one beam until the first choice
    finished = np.zeros(len(window), dtype=bool)
    end_token = np.int32(-1 if end_token is None else end_token)
    calls = plan_calls(lengths, model.config.block_size, max_new_tokens, use_cache, slide, CHUNK_SIZE,
                       decoder.short_caches)

    pending, scores, finished, window, lengths, cache, context = decoder.prefill["beam"](
        window, prompt_columns(window, lengths, sources), lengths, sources, scores, finished, end_token)
    ready = decoder.warm_up("beam", calls, slide, len(window), lambda span: (
        *decoder.example_state(len(window), context, span), scores, finished, end_token, np.int32(0)))
    sequences = keras.ops.convert_to_numpy(pending)[:, None]  # (B * beams, produced)
    for _, steps, steps_kind, span in calls:
        if keras.ops.convert_to_numpy(finished).all():
            break
        ready[steps_kind, span].result()
        cache = fit_cache(cache, span)
        drawn, parents, window, lengths, cache, pending, scores, finished = decoder.loop("beam", steps_kind, slide)(
            window, lengths, cache, pending, context, scores, finished, end_token, np.int32(steps))
        drawn, parents = keras.ops.convert_to_numpy(drawn), keras.ops.convert_to_numpy(parents)
        for step in range(steps):
            sequences = np.concatenate([sequences[parents[:, step]], drawn[:, step, None]], axis=1)
    return sequences[::beams]  # beams come sorted by score: the first of each row is the best
