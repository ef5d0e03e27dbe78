"""Sampling text from a trained GPT with a key/value cache; decoding a
Seq2Seq's targets with the same sampler and beam search (`generate_target`,
see _TargetDecoder).

How a batch of prompts is decoded:
1. Prefill: the prompts, right-padded to `block_size`, run through the model
   once; every block's keys and values land in a fixed-size cache and the
   first new token is chosen from the logits at each prompt's last position.
2. Decode: each step feeds one token per row at that row's own position,
   writes its key and value into the cache, and chooses the next token.
3. Sliding: a step that finds a row's window full moves it `slide` tokens
   (1 by default) and recomputes the whole window, since every position has
   shifted. The model never sees more than `block_size` tokens; with
   `slide=1` exactly as full recomputation for every token would.

Which steps recompute follows from the prompt lengths alone, so the host
plans the calls ahead (`_plan_calls`): runs of cached steps go to one
compiled while-loop and runs of recomputing steps to another (a wider slide
adds a third: one recomputing step, then cached ones), each drawing up to
CHUNK_SIZE tokens per call and keeping its state on the device. On
TensorFlow the prefill is a plain graph, quick to build, so the first token
comes without waiting for a compiler; the loops compile with XLA on a
background thread meanwhile. On JAX every function is jitted (the loops on
that thread too); torch runs them eagerly. Everything is traced with the
sampling settings and the seed as tensor inputs, so prompt length,
temperature, top-k, top-p and seed never cause a recompile.

Randomness is explicit: a token's noise is drawn from (seed, its index), so
the same seed gives the same text with or without the cache, however calls
interleave, and sampling is the Gumbel-max trick on that noise. We use our
own sampler rather than KerasHub's: theirs fix k, p and temperature as
Python values (one trace per setting) and run the whole loop to the end in
one call, which cannot stream; their beam search steps all rows from one
shared position through a buffer as long as the whole output (one compile
per output length), where ours uses the per-row windows and compiled loops
that sampling does.
"""

import concurrent.futures
import functools
import weakref

import keras
import numpy as np
from keras import ops

from gptlite.errors import ConfigError, InputError
from gptlite.model import Seq2Seq

# One decoder (compiled functions) per model, made on first use.
_decoders = weakref.WeakKeyDictionary()

# Tokens drawn per compiled call at most: more amortise the call's overhead,
# fewer stream text sooner. The first call after prefill is short, so text
# starts flowing at once.
CHUNK_SIZE = 32
FIRST_CHUNK_SIZE = 8


def sample_next_token(logits, settings, noise):
    """Draw one token id per row from float logits (B, V), given uniform noise (B, V) in (0, 1).

    `settings` is a float tensor [temperature, top_k, top_p]: temperature 0
    takes the arg-max; otherwise logits are divided by the temperature, only
    the top_k likeliest tokens are kept, and of those only the smallest set
    whose probability reaches top_p (the nucleus). top_k >= V and top_p = 1
    keep every token. The draw is the arg-max of the kept logits plus Gumbel
    noise, which picks each token with its softmax probability.
    """
    temperature, top_k, top_p = settings[0], settings[1], settings[2]
    vocabulary_size = ops.shape(logits)[-1]
    scaled = logits / ops.maximum(temperature, 1e-6)  # (B, V)

    def filtered():
        descending = ops.flip(ops.sort(scaled, axis=-1), axis=-1)  # (B, V)
        k = ops.cast(ops.clip(top_k, 1, vocabulary_size), "int32")
        kth_largest = ops.take(descending, k - 1, axis=-1)  # (B,)
        probabilities = ops.softmax(descending, axis=-1)
        mass_ranked_above = ops.cumsum(probabilities, axis=-1) - probabilities  # (B, V)
        in_nucleus = ops.less(mass_ranked_above, top_p)  # the likeliest token always is
        nucleus_floor = ops.min(ops.where(in_nucleus, descending, float("inf")), axis=-1)  # (B,)
        floor = ops.maximum(kth_largest, nucleus_floor)[:, None]  # (B, 1)
        return ops.where(ops.greater_equal(scaled, floor), scaled, -1e9)

    # The sort is skipped when every token is kept.
    keeps_all = ops.logical_and(ops.greater_equal(top_k, vocabulary_size), ops.greater_equal(top_p, 1.0))
    kept = ops.cond(keeps_all, lambda: scaled, filtered)
    gumbel = -ops.log(-ops.log(noise))
    sampled = ops.argmax(kept + gumbel, axis=-1)
    greedy = ops.argmax(logits, axis=-1)  # (B,)
    return ops.cast(ops.where(ops.equal(temperature, 0), greedy, sampled), "int32")


class _Decoder:
    """The compiled prefill and decode loops of one model.

    Decoding state, kept on the device between calls:
        window (B, block_size)  each row's last tokens, left-aligned
        lengths (B,)            how many of them are real
        cache                   keys and values of window[:, :lengths]
        pending (B,)            the token chosen last, not yet in the window
    Beam search adds scores (rows, beams), the summed log-probability of each
    beam, and finished (B,), which beams have chosen the end token; its B
    counts every beam of every row.
    """

    def __init__(self, model):
        # Weakly, so that the model's entry in _decoders can go when the model does.
        self._model = weakref.ref(model)
        # Never advanced: its state is swapped for each call's seed (see _noise).
        self.seed_generator = keras.random.SeedGenerator(0)
        self.sample_prefill = _Compiled(self._sample_prefill, model, xla=False)
        self.beam_prefill = _Compiled(self._beam_prefill, model, xla=False)
        self._loops = {}
        self._warm_ups = {}

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

    def warm_up(self, function, *example_args):
        """Compile `function` for these argument shapes on a background thread; a future."""
        key = (function, np.shape(example_args[0]))
        if key not in self._warm_ups:
            self._warm_ups[key] = _in_background(function, *example_args)
        return self._warm_ups[key]

    def empty_state(self, batch_size):
        block_size = self.model.config.block_size
        return (np.zeros((batch_size, block_size), "int32"), np.zeros(batch_size, "int32"),
                self.model.empty_cache(batch_size), np.zeros(batch_size, "int32"))

    # --- sampling

    def _sample_prefill(self, window, lengths, settings, seed):
        """Run the windows through the model; draw each row's first new token (token 0)."""
        logits, cache = self._forward_window(window)
        noise = self._noise_block(seed, 0, ops.shape(window)[0])[0]  # (B, V)
        return sample_next_token(_logits_at(logits, lengths - 1), settings, noise), cache

    def _sample_chunk(self, window, lengths, cache, pending, settings, seed, first, steps, steps_kind, slide):
        """Draw tokens first .. first + steps - 1 (steps <= CHUNK_SIZE) -> (tokens (B, CHUNK_SIZE), state...)."""
        noise = self._noise(seed, first, ops.shape(window)[0])

        def body(step, window, lengths, cache, pending, drawn, recompute):
            logits, window, lengths, cache = self._advance(window, lengths, cache, pending, recompute, slide)
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

    def _beam_prefill(self, window, lengths, scores, finished, end_token):
        logits, cache = self._forward_window(window)
        return choose_beams(_logits_at(logits, lengths - 1), scores, finished, end_token,
                                  (window, lengths, cache))

    def _beam_chunk(self, window, lengths, cache, pending, scores, finished, end_token, steps, steps_kind, slide):
        """Extend every beam `steps` (<= CHUNK_SIZE) tokens -> (tokens, parents (B, CHUNK_SIZE), state...).

        Column t of `parents` says which beam each beam continued at step t;
        the caller follows them back to rebuild the sequences.
        """

        def body(step, window, lengths, cache, pending, scores, finished, drawn, parents, recompute):
            logits, window, lengths, cache = self._advance(window, lengths, cache, pending, recompute, slide)
            pending, chosen, scores, finished, (window, lengths, cache) = choose_beams(
                logits, scores, finished, end_token, (window, lengths, cache))
            return (step + 1, window, lengths, cache, pending, scores, finished,
                    _record(drawn, step, pending), _record(parents, step, chosen))

        empty = ops.zeros((ops.shape(window)[0], CHUNK_SIZE), "int32")
        _, *state = _loop(body, steps, (window, lengths, cache, pending, scores, finished, empty, empty), steps_kind)
        window, lengths, cache, pending, scores, finished, drawn, parents = state
        return drawn, parents, window, lengths, cache, pending, scores, finished

    # --- shared

    def _advance(self, window, lengths, cache, tokens, recompute, slide):
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
            logits, cache = self._forward_window(window)
            return _logits_at(logits, lengths - 1), window, lengths, cache
        logits, cache = self.model.call_with_cache(tokens[:, None], cache, positions)
        return logits[:, 0], window, lengths, cache

    def _forward_window(self, window):
        batch_size = ops.shape(window)[0]
        return self.model.call_with_cache(
            window, self.model.empty_cache(batch_size), ops.zeros((batch_size,), "int32")
        )


def uniform_noise(seed_generator, seed, block, shape):
    """Uniform noise in (0, 1) of `shape`, that depends on (seed, block) alone.

    `seed_generator`'s state is swapped for one made of (seed, block), so it
    is never advanced and needs no care between calls.
    """
    backend = keras.backend.backend()
    if backend == "jax":
        # The key itself: a scope for the seed generator would hide the one that maps the weights (_Compiled).
        key = ops.cast(ops.stack([seed, block]), "uint32")
        return keras.random.uniform(shape, minval=1e-20, maxval=1.0, seed=key)
    if backend == "torch":
        # Torch seeds from the sum of the state's two (int32) numbers: mix seed and block into one
        # so that neighbouring seeds do not share blocks' noise (an odd multiplier spreads them).
        mixed = (ops.cast(seed, "int64") * 2654435761 + ops.cast(block, "int64")) % 2**31
        state = ops.stack([mixed, ops.zeros_like(mixed)])
    else:
        state = ops.stack([ops.cast(seed, "int32"), ops.cast(block, "int32")])
    with keras.StatelessScope(state_mapping=[(seed_generator.state, state)]):
        return keras.random.uniform(shape, minval=1e-20, maxval=1.0, seed=seed_generator)


def choose_beams(logits, scores, finished, end_token, state):
    """Keep the `beams` likeliest one-token extensions of each row's beams.

    logits (B * beams, V); scores (B, beams). Returns the chosen tokens and
    their parent beams (B * beams,), the new scores and finished flags, and
    `state` (a structure of per-beam tensors) reordered to follow the parents.
    """
    rows, beams = ops.shape(scores)[0], ops.shape(scores)[1]
    vocabulary_size = ops.shape(logits)[-1]
    log_probabilities = ops.log_softmax(ops.cast(logits, "float32"), axis=-1)  # (B * beams, V)
    # A finished beam continues only with the end token, at no cost, so its score stays.
    is_end = ops.equal(ops.arange(vocabulary_size), end_token)[None, :]
    log_probabilities = ops.where(finished[:, None], ops.where(is_end, 0.0, float("-inf")), log_probabilities)
    extended = ops.reshape(scores, (-1, 1)) + log_probabilities  # (B * beams, V)
    scores, best = ops.top_k(ops.reshape(extended, (rows, beams * vocabulary_size)), beams)  # (B, beams)
    parents = ops.reshape(best // vocabulary_size + ops.arange(rows)[:, None] * beams, (-1,))
    tokens = ops.cast(ops.reshape(best % vocabulary_size, (-1,)), "int32")
    finished = ops.logical_or(ops.take(finished, parents, axis=0), ops.equal(tokens, end_token))
    state = keras.tree.map_structure(lambda tensor: ops.take(tensor, parents, axis=0), state)
    return tokens, ops.cast(parents, "int32"), scores, finished, state


# The kinds of steps one decode call runs (see _Decoder.loop).
CACHED, RECOMPUTE, RECOMPUTE_THEN_CACHED = "cached", "recompute", "recompute then cached"


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
    """logits (B, T, V), indices (B,) -> (B, V)."""
    return ops.take_along_axis(logits, ops.reshape(indices, (-1, 1, 1)), axis=1)[:, 0]


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


def _decoder_for(model):
    if not model.built:  # a new model, never called: generating from random weights is allowed
        model.build((None, model.config.block_size))
    if model not in _decoders:
        _decoders[model] = _Decoder(model)
    return _decoders[model]


def _windows(model, prompts_ids):
    """The prompts' last block_size tokens, left-aligned in (B, block_size), and their lengths."""
    block_size = model.config.block_size
    window = np.zeros((len(prompts_ids), block_size), dtype=np.int32)
    lengths = np.zeros(len(prompts_ids), dtype=np.int32)
    for index, ids in enumerate(prompts_ids):
        context = ids[-block_size:]
        window[index, : len(context)] = context
        lengths[index] = len(context)
    return window, lengths


def _plan_calls(lengths, block_size, max_new_tokens, use_cache, slide):
    """The decode calls after the prefill's token: a list of (first token index, steps, steps kind).

    Which steps find a full window, and so must recompute it, follows from
    the prompt lengths alone: a window grows by one token a step until it is
    full, then moves back by `slide`. A call holds steps of one kind (one
    recomputing step may lead cached ones), at most FIRST_CHUNK_SIZE in the
    first call and CHUNK_SIZE after.
    """
    lengths = np.asarray(lengths)
    calls = []
    for index in range(1, max_new_tokens):
        full = lengths >= block_size
        kind = RECOMPUTE if full.any() or not use_cache else CACHED
        lengths = np.where(full, block_size - slide + 1, lengths + 1)
        last = calls[-1] if calls else None
        if last is None or last[1] == (FIRST_CHUNK_SIZE if len(calls) == 1 else CHUNK_SIZE):
            calls.append([index, 1, kind])
        elif last[2] == kind or (last[2] == RECOMPUTE_THEN_CACHED and kind == CACHED):
            last[1] += 1
        elif last[2] == RECOMPUTE and last[1] == 1 and kind == CACHED:
            # One recomputation and the cached steps after it share a call.
            last[1], last[2] = 2, RECOMPUTE_THEN_CACHED
        else:
            calls.append([index, 1, kind])
    return [tuple(call) for call in calls]


def _warm_up_loops(decoder, kind, calls, slide, example_args):
    """Start compiling the loops that `calls` need, in the order needed; {steps kind: future}."""
    return {steps_kind: decoder.warm_up(decoder.loop(kind, steps_kind, slide), *example_args)
            for steps_kind in dict.fromkeys(call[2] for call in calls)}


def _decode(model, prompts_ids, max_new_tokens, settings, seed, use_cache=True, slide=1):
    """Yield, for each new position, an int array (B,) of the tokens sampled for every row."""
    if max_new_tokens == 0:
        return
    decoder = _decoder_for(model)
    seed = np.int32(int(np.random.default_rng().integers(2**31)) if seed is None else seed % 2**31)
    window, lengths = _windows(model, prompts_ids)
    calls = _plan_calls(lengths, model.config.block_size, max_new_tokens, use_cache, slide)

    pending, cache = decoder.sample_prefill(window, lengths, settings, seed)
    # Compiling starts once the prefill is traced, so that the two do not contend for the interpreter.
    example = (*decoder.empty_state(len(window)), settings, seed, np.int32(1), np.int32(0))
    ready = _warm_up_loops(decoder, "sample", calls, slide, example)
    yield keras.ops.convert_to_numpy(pending)
    for first, steps, steps_kind in calls:
        ready[steps_kind].result()
        drawn, window, lengths, cache, pending = decoder.loop("sample", steps_kind, slide)(
            window, lengths, cache, pending, settings, seed, np.int32(first), np.int32(steps)
        )
        yield from keras.ops.convert_to_numpy(drawn)[:, :steps].T


def _beam_search(model, prompts_ids, max_new_tokens, beams, end_token, use_cache=True, slide=1):
    """The likeliest continuation found by beam search: an int array (B, max_new_tokens)."""
    if max_new_tokens == 0:
        return np.zeros((len(prompts_ids), 0), "int32")
    decoder = _decoder_for(model)
    window, lengths = _windows(model, prompts_ids)
    window, lengths = np.repeat(window, beams, axis=0), np.repeat(lengths, beams)  # (B * beams, S)
    scores = np.full((len(prompts_ids), beams), -np.inf, dtype="float32")
    scores[:, 0] = 0  # the copies of a prompt are one beam until the first choice
    finished = np.zeros(len(window), dtype=bool)
    end_token = np.int32(-1 if end_token is None else end_token)
    calls = _plan_calls(lengths, model.config.block_size, max_new_tokens, use_cache, slide)

    pending, parents, scores, finished, (window, lengths, cache) = decoder.beam_prefill(
        window, lengths, scores, finished, end_token)
    example = (*decoder.empty_state(len(window)), scores, finished, end_token, np.int32(0))
    ready = _warm_up_loops(decoder, "beam", calls, slide, example)
    sequences = keras.ops.convert_to_numpy(pending)[:, None]  # (B * beams, produced)
    for _, steps, steps_kind in calls:
        ready[steps_kind].result()
        drawn, parents, window, lengths, cache, pending, scores, finished = decoder.loop("beam", steps_kind, slide)(
            window, lengths, cache, pending, scores, finished, end_token, np.int32(steps))
        drawn, parents = keras.ops.convert_to_numpy(drawn), keras.ops.convert_to_numpy(parents)
        for step in range(steps):
            sequences = np.concatenate([sequences[parents[:, step]], drawn[:, step, None]], axis=1)
        if keras.ops.convert_to_numpy(finished).all():
            break
    return sequences[::beams]  # beams come sorted by score: the first of each row is the best


def _checked_settings(model, max_new_tokens, temperature, top_k, top_p, slide):
    """Check the sampling and window settings; return the sampler's [temperature, top_k, top_p]."""
    check_sampling_settings(max_new_tokens, temperature, top_k, top_p)
    _check_slide(slide, model.config.block_size)
    top_k = model.tokenizer.vocabulary_size if top_k is None else top_k
    return np.array([temperature, top_k, top_p], dtype=np.float32)


class _TextBuilder:
    """One row's text, built token by token.

    A byte-level token may carry only part of a character's UTF-8 bytes;
    decoded alone it gives U+FFFD. So tokens wait, up to the four bytes one
    character can take, until together they decode to whole characters.
    """

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.text = ""
        self.waiting = []

    def add(self, token):
        """Add a token id; return the text it completes ("" while waiting)."""
        self.waiting.append(int(token))
        piece = self.tokenizer.decode(self.waiting)
        if piece.endswith("\ufffd") and len(self.waiting) < 4:
            return ""
        self.waiting = []
        self.text += piece
        return piece

    def finish(self):
        """The whole text, with any tokens still waiting decoded as they are."""
        if self.waiting:
            self.text += self.tokenizer.decode(self.waiting)
            self.waiting = []
        return self.text


def _text_pieces(tokenizer, tokens):
    """Text pieces for a stream of token ids, each made of whole characters."""
    builder = _TextBuilder(tokenizer)
    for token in tokens:
        piece = builder.add(token)
        if piece:
            yield piece
    before = len(builder.text)
    rest = builder.finish()[before:]
    if rest:
        yield rest


def _until_end(token_rows, end_token):
    """Pass on single-row token arrays up to, not including, the end token."""
    for tokens in token_rows:
        if end_token is not None and tokens[0] == end_token:
            return
        yield tokens


def stream(model, prompt="", max_new_tokens=200, temperature=1.0, top_k=None, top_p=1.0, seed=None,
           unknown="error", stop=(), use_cache=True, slide=1):
    """An iterator over the continuation of `prompt`, one decoded token at a time.

    `stop` is a string or a list of them: the text ends just before the first
    one that appears in the continuation. Text that might be the start of a
    stop string is held back until it is clear whether it is. The text also
    ends before the tokenizer's end token, where it has one.

    Settings and prompt are checked at once, before the first token. Prompt
    characters the vocabulary lacks raise an `InputError` naming them
    (`unknown="error"`), are left out (`"skip"`) or become spaces
    (`"replace"`). An empty prompt starts from a newline (or, without one in
    the vocabulary, from the first token); that start is not yielded.
    `use_cache` and `slide` are as for `generate`.
    """
    settings = _checked_settings(model, max_new_tokens, temperature, top_k, top_p, slide)
    prompt_ids = _prompt_ids(model.tokenizer, prompt, unknown)
    stops = _stop_strings(stop)
    tokens = _decode(model, [prompt_ids], max_new_tokens, settings, seed, use_cache, slide)
    pieces = _text_pieces(model.tokenizer, (row[0] for row in _until_end(tokens, model.tokenizer.end_token_id)))
    return _cut_at_stop(pieces, stops) if stops else pieces


def generate(model, prompt="", max_new_tokens=200, temperature=1.0, top_k=None, top_p=1.0, seed=None,
             unknown="error", stop=(), use_cache=True, slide=1, num_beams=None):
    """Return `prompt` followed by up to `max_new_tokens` new tokens, as text.

    `prompt` may be a list of prompts, of any lengths: they are decoded
    together in one batch and a list of texts comes back. With `stop`, each
    continuation ends before its first stop string, and decoding ends once
    every row has met one (or the end token, where the tokenizer has one).

    Past the context window: once prompt and new tokens fill `block_size`,
    the window moves `slide` tokens at a time and is recomputed. With the
    default `slide=1`, every token is drawn from exactly the last block_size
    tokens, as recomputing the whole context for each token would do; this
    costs a whole-window pass per token. A larger `slide` (up to block_size)
    pays that pass once per `slide` tokens and decodes from the cache in
    between, but the model then sees between block_size - slide + 1 and
    block_size tokens of context. `use_cache=False` recomputes the window for
    every token: the same text for the same seed, slower; it is there to
    check the cache against.

    `num_beams` searches for the likeliest continuation with that many
    beams instead of sampling (temperature, top_k, top_p and seed do not
    apply); one beam is greedy decoding.
    """
    prompts = [prompt] if isinstance(prompt, str) else list(prompt)
    if not prompts:
        raise ConfigError("give at least one prompt")
    settings = _checked_settings(model, max_new_tokens, temperature, top_k, top_p, slide)
    if num_beams is not None:
        _check_beams(num_beams, model.tokenizer.vocabulary_size)
    prompts_ids = [_prompt_ids(model.tokenizer, p, unknown) for p in prompts]
    stops = _stop_strings(stop)
    end_token = model.tokenizer.end_token_id
    if num_beams is not None:
        steps = _beam_search(model, prompts_ids, max_new_tokens, num_beams, end_token, use_cache, slide).T
    else:
        steps = _decode(model, prompts_ids, max_new_tokens, settings, seed, use_cache, slide)
    rows = [_TextBuilder(model.tokenizer) for _ in prompts]
    ended = np.zeros(len(prompts), dtype=bool)
    for tokens in steps:
        ended |= tokens == (-1 if end_token is None else end_token)
        for row, token, done in zip(rows, tokens, ended):
            if not done:
                row.add(token)
        if all(done or (stops and _first_stop(row.text, stops) is not None) for row, done in zip(rows, ended)):
            break
    texts = []
    for prompt_text, row in zip(prompts, rows):
        continuation = row.finish()
        end = _first_stop(continuation, stops) if stops else None
        texts.append(prompt_text + continuation[:end])
    return texts[0] if isinstance(prompt, str) else texts


# --- seq2seq


class _TargetDecoder:
    """The compiled decoding of one Seq2Seq model.

    A call decodes a batch of sources whole: the encoder runs once, each
    decoder block's cross-attention keys and values are computed once from
    its output, and then a compiled while-loop adds one target token a step,
    at the same position in every row, through the decoder's key/value
    cache, until every row has ended or `steps` are done. A target is at
    most block_size - 1 tokens, so no window ever slides.

    Decoding state: target (B, block_size), the start token and the tokens
    so far; cache; finished (B,), which rows have chosen the end token.
    """

    def __init__(self, model):
        self._model = weakref.ref(model)
        self.seed_generator = keras.random.SeedGenerator(0)  # never advanced, as in _Decoder
        self._functions = {}

    @property
    def model(self):
        return self._model()

    def function(self, kind, use_cache):
        """The compiled decoding of `kind`, "sample" or "beam"."""
        if (kind, use_cache) not in self._functions:
            decode = self._sample if kind == "sample" else self._beam_search
            self._functions[kind, use_cache] = _Compiled(functools.partial(decode, use_cache=use_cache), self.model)
        return self._functions[kind, use_cache]

    def _sample(self, source_ids, settings, seed, block, steps, use_cache):
        """Draw up to `steps` tokens for each source (B, S) -> (B, block_size - 1), padded after the end token."""
        model = self.model
        start = self._start(source_ids)
        batch_size, vocabulary_size = ops.shape(source_ids)[0], model.config.vocab_size
        noise = uniform_noise(self.seed_generator, seed, block, (model.config.block_size, batch_size, vocabulary_size))

        def body(step, target, cache, finished):
            logits, cache = self._next_logits(step, target, cache, start, use_cache)
            tokens = sample_next_token(logits, settings, ops.take(noise, step, axis=0))
            tokens = ops.where(finished, model.PAD_ID, tokens)
            finished = ops.logical_or(finished, ops.equal(tokens, model.tokenizer.end_token_id))
            return step + 1, _record(target, step + 1, tokens), cache, finished

        state = (start["target"], start["cache"], ops.zeros((batch_size,), "bool"))
        _, target, _, _ = self._loop(body, steps, state)
        return target[:, 1:]

    def _beam_search(self, source_ids, scores, end_token, steps, use_cache):
        """Beam search for sources repeated once per beam (B * beams, S) -> (B * beams, block_size - 1).

        The beams of each row come best first.
        """
        start = self._start(source_ids)

        def body(step, target, cache, scores, finished):
            logits, cache = self._next_logits(step, target, cache, start, use_cache)
            tokens, _, scores, finished, (target, cache) = choose_beams(
                logits, scores, finished, end_token, (target, cache))
            return step + 1, _record(target, step + 1, tokens), cache, scores, finished

        finished = ops.zeros((ops.shape(source_ids)[0],), "bool")
        _, target, _, _, _ = self._loop(body, steps, (start["target"], start["cache"], scores, finished))
        return target[:, 1:]

    def _start(self, source_ids):
        """What every step needs from the sources, and the first state."""
        model = self.model
        batch_size, block_size = ops.shape(source_ids)[0], model.config.block_size
        source_mask = model.source_mask(source_ids)
        encoded = model.encode(source_ids, source_mask)  # (B, S, C)
        start_tokens = ops.full((batch_size, 1), model.tokenizer.start_token_id, "int32")
        return dict(
            source_mask=source_mask, encoded=encoded, cross_key_values=model.cross_key_values(encoded),
            cache=model.empty_cache(batch_size),
            target=ops.concatenate([start_tokens, ops.zeros((batch_size, block_size - 1), "int32")], axis=1),
        )

    def _next_logits(self, step, target, cache, start, use_cache):
        """Logits (B, V) after the target's token at `step`; without the cache, from the whole target so far."""
        positions = ops.zeros((ops.shape(target)[0],), "int32") + step  # (B,)
        if not use_cache:
            logits = self.model.decode(target, start["encoded"], start["source_mask"])  # (B, S, V)
            return _logits_at(logits, positions), cache
        tokens = ops.take_along_axis(target, positions[:, None], axis=1)  # (B, 1)
        logits, cache = self.model.call_with_cache(tokens, cache, positions, start["cross_key_values"],
                                                   start["source_mask"])
        return logits[:, 0], cache

    def _loop(self, body, steps, state):
        """Run body(step, target, ..., finished) until `steps` are done or every row has finished."""
        return ops.while_loop(
            lambda step, *state: ops.logical_and(ops.less(step, steps), ops.logical_not(ops.all(state[-1]))),
            body,
            (ops.convert_to_tensor(0, "int32"), *state),
            maximum_iterations=self.model.config.block_size - 1,
        )


_target_decoders = weakref.WeakKeyDictionary()

# Sources decoded per compiled call at most; a longer list is split into
# calls of this many (the last padded), so that it compiles once.
TARGET_BATCH = 256


def generate_target(model, source, max_new_tokens=None, temperature=0.0, top_k=None, top_p=1.0, seed=None,
                    unknown="error", stop=(), use_cache=True, num_beams=None):
    """The target that a Seq2Seq model writes for `source`, as text.

    `source` may be a list of texts: they are decoded together in batches
    and a list of targets comes back. A target ends before the end token,
    after `max_new_tokens` tokens (default and most: block_size - 1), or
    before its first `stop` string. Unlike a GPT's `generate`, the default
    temperature is 0: the likeliest token at each step. Sampling settings,
    `seed`, `unknown` (for characters the vocabulary lacks), `use_cache` and
    `num_beams` are as for `generate`.
    """
    targets = iter_targets(model, [source] if isinstance(source, str) else source, max_new_tokens, temperature,
                           top_k, top_p, seed, unknown, stop, use_cache, num_beams)
    return next(targets) if isinstance(source, str) else list(targets)


def iter_targets(model, sources, max_new_tokens=None, temperature=0.0, top_k=None, top_p=1.0, seed=None,
                 unknown="error", stop=(), use_cache=True, num_beams=None):
    """As `generate_target` for a list of sources: an iterator that gives each
    target as soon as its batch is decoded. Everything is checked at once.
    """
    if not isinstance(model, Seq2Seq):
        raise ConfigError(f"generate_target needs a Seq2Seq model, not a {type(model).__name__}; "
                          f"a GPT continues a prompt with generate")
    sources = list(sources)
    if not sources:
        raise ConfigError("give at least one source")
    block_size = model.config.block_size
    if max_new_tokens is None:
        max_new_tokens = block_size - 1
    settings = _checked_settings(model, max_new_tokens, temperature, top_k, top_p, 1)
    if num_beams is not None:
        _check_beams(num_beams, model.tokenizer.vocabulary_size)
    stops = _stop_strings(stop)
    source_ids = np.zeros((len(sources), block_size), np.int32)
    for index, text in enumerate(sources):
        ids = model.tokenizer.encode(known_text(model.tokenizer, text, unknown, "source"))
        if len(ids) > block_size:
            raise InputError(f"the source {_shortened(text)!r} is {len(ids)} tokens long; "
                             f"this model reads sources of up to {block_size}")
        source_ids[index, :len(ids)] = ids
    steps = np.int32(min(max_new_tokens, block_size - 1))
    seed = np.int32(int(np.random.default_rng().integers(2**31)) if seed is None else seed % 2**31)
    return _decode_targets(model, source_ids, settings, seed, steps, stops, use_cache, num_beams)


def _decode_targets(model, source_ids, settings, seed, steps, stops, use_cache, num_beams):
    """Yield the target text of each row of source_ids (N, S), decoding TARGET_BATCH rows at a time."""
    if not model.built:
        model.build()
    if model not in _target_decoders:
        _target_decoders[model] = _TargetDecoder(model)
    decoder = _target_decoders[model]
    block_size = model.config.block_size
    batch_size = min(len(source_ids), TARGET_BATCH)
    for block, first in enumerate(range(0, len(source_ids), batch_size)):
        batch = np.zeros((batch_size, block_size), np.int32)
        rows = source_ids[first:first + batch_size]
        batch[:len(rows)] = rows
        if num_beams is None:
            # Each batch draws its noise from its own block, so batches of the same sources differ.
            tokens = decoder.function("sample", use_cache)(batch, settings, seed, np.int32(block), steps)
        else:
            scores = np.full((batch_size, num_beams), -np.inf, dtype="float32")
            scores[:, 0] = 0  # the copies of a source are one beam until the first choice
            end_token = np.int32(model.tokenizer.end_token_id)
            tokens = decoder.function("beam", use_cache)(np.repeat(batch, num_beams, axis=0), scores, end_token,
                                                         steps)[::num_beams]
        for row in keras.ops.convert_to_numpy(tokens)[:len(rows)]:
            yield _target_text(model.tokenizer, row, stops)


def _target_text(tokenizer, tokens, stops):
    """Target tokens, up to the end token, as text, cut before the first stop string."""
    ends = np.flatnonzero(tokens == tokenizer.end_token_id)
    text = tokenizer.decode(tokens[:ends[0]] if len(ends) else tokens)
    end = _first_stop(text, stops) if stops else None
    return text[:end]


def _shortened(text, length=40):
    return text if len(text) <= length else text[:length] + "..."


def _check_slide(slide, block_size):
    if isinstance(slide, bool) or not isinstance(slide, int) or not 1 <= slide <= block_size:
        raise ConfigError(f"slide must be a whole number from 1 to the block size, {block_size}; got {slide!r}")


def _check_beams(num_beams, vocabulary_size):
    if isinstance(num_beams, bool) or not isinstance(num_beams, int) or num_beams < 1:
        raise ConfigError(f"num_beams must be a whole number of at least 1, got {num_beams!r}")
    if num_beams > vocabulary_size:
        raise ConfigError(f"num_beams can be at most the vocabulary size, {vocabulary_size}; got {num_beams}")


def _stop_strings(stop):
    stops = [stop] if isinstance(stop, str) else list(stop or ())
    if any(not isinstance(s, str) or not s for s in stops):
        raise ConfigError(f"stop strings must be non-empty text, got {stop!r}")
    return stops


def _first_stop(text, stops):
    """Where the first stop string in `text` begins, or None."""
    found = [index for index in (text.find(s) for s in stops) if index >= 0]
    return min(found) if found else None


def _cut_at_stop(pieces, stops):
    """Pass text pieces through until a stop string appears; hold back what could begin one."""
    held = ""
    for piece in pieces:
        held += piece
        end = _first_stop(held, stops)
        if end is not None:
            if end:
                yield held[:end]
            return
        keep = max((k for s in stops for k in range(1, min(len(s), len(held) + 1)) if held.endswith(s[:k])),
                   default=0)
        if len(held) > keep:
            yield held[: len(held) - keep]
            held = held[len(held) - keep:]
    if held:
        yield held


def _prompt_ids(tokenizer, prompt, unknown="error"):
    prompt = known_text(tokenizer, prompt, unknown, "prompt")
    if not prompt:
        # Start from a new line, as a text does; lacking one, from the first token.
        return [int(tokenizer.encode("\n")[0])] if not tokenizer.unknown_characters("\n") else [0]
    return [int(i) for i in tokenizer.encode(prompt)]


def known_text(tokenizer, text, unknown, what):
    """`text` with the characters the tokenizer lacks refused ("error"), left out ("skip") or spaces ("replace")."""
    if unknown not in ("error", "skip", "replace"):
        raise ConfigError(f"unknown must be 'error', 'skip' or 'replace', got {unknown!r}")
    missing = tokenizer.unknown_characters(text)
    if missing and unknown == "error":
        raise InputError(
            f"the {what} has characters the model never saw in training: {''.join(missing)!r} "
            f"(--unknown skip or replace lets it run anyway)"
        )
    if missing:
        replacement = " " if unknown == "replace" and not tokenizer.unknown_characters(" ") else ""
        text = "".join(replacement if c in missing else c for c in text)
    return text


def check_sampling_settings(max_new_tokens, temperature, top_k=None, top_p=1.0):
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ConfigError(f"max_new_tokens must be zero or a positive whole number, got {max_new_tokens!r}")
    if temperature < 0:
        raise ConfigError(f"temperature must be 0 (greedy) or positive, got {temperature}")
    if top_k is not None and top_k < 1:
        raise ConfigError(f"top_k must be at least 1, got {top_k}")
    if not 0 < top_p <= 1:
        raise ConfigError(f"top_p must be in (0, 1], got {top_p}")
