"""Sampling text from a trained GPT with a key/value cache.

How a batch of prompts is decoded:
1. Prefill: the prompts, right-padded to `block_size`, run through the model
   once; every block's keys and values land in a fixed-size cache and the
   first new token is drawn from the logits at each prompt's last position.
2. Decode: each step feeds one token per row at that row's own position,
   writes its key and value into the cache, and draws the next token.
3. Sliding: once a row's window is full, each step shifts the window by one
   token and recomputes it whole (learned positions shift with it). The model
   never sees more than `block_size` tokens, exactly as full recomputation
   would.

Prefill and decode loop are compiled once per model and batch size (XLA on
TensorFlow) and traced with the sampling settings as tensor inputs, so
changing prompt length, temperature, top-k, top-p or seed never recompiles.
The decode loop is a compiled while-loop that draws up to CHUNK_SIZE tokens
per call, keeping the cache on the device between steps; streaming yields
each chunk's tokens as the call returns (the first token right after prefill).

The next token is drawn by `sample_next_token`, our own sampler rather than
KerasHub's: theirs fix k, p and temperature as Python values (one trace per
setting) and run the whole loop to the end in one call, which cannot stream.
"""

import weakref

import keras
import numpy as np
from keras import ops

from gptlite.errors import ConfigError, InputError

# One decoder (compiled functions and random state) per model, made on first use.
_decoders = weakref.WeakKeyDictionary()


def sample_next_token(logits, settings, seed_generator):
    """Draw one token id per row from float logits (B, V).

    `settings` is a float tensor [temperature, top_k, top_p]: temperature 0
    takes the arg-max; otherwise logits are divided by the temperature, only
    the top_k likeliest tokens are kept, and of those only the smallest set
    whose probability reaches top_p (the nucleus). top_k >= V and top_p = 1
    keep every token.
    """
    temperature, top_k, top_p = settings[0], settings[1], settings[2]
    vocabulary_size = ops.shape(logits)[-1]
    greedy = ops.argmax(logits, axis=-1)  # (B,)

    scaled = logits / ops.maximum(temperature, 1e-6)  # (B, V)
    descending = ops.flip(ops.sort(scaled, axis=-1), axis=-1)  # (B, V)
    k = ops.cast(ops.clip(top_k, 1, vocabulary_size), "int32")
    kth_largest = ops.take(descending, k - 1, axis=-1)  # (B,)
    probabilities = ops.softmax(descending, axis=-1)
    mass_ranked_above = ops.cumsum(probabilities, axis=-1) - probabilities  # (B, V)
    in_nucleus = ops.less(mass_ranked_above, top_p)  # the likeliest token always is
    nucleus_floor = ops.min(ops.where(in_nucleus, descending, float("inf")), axis=-1)  # (B,)
    floor = ops.maximum(kth_largest, nucleus_floor)[:, None]  # (B, 1)
    kept = ops.where(ops.greater_equal(scaled, floor), scaled, -1e9)

    sampled = keras.random.categorical(kept, 1, seed=seed_generator, dtype="int32")[:, 0]
    return ops.where(ops.equal(temperature, 0), ops.cast(greedy, "int32"), sampled)


# Tokens produced per compiled call: more amortises the call's overhead, fewer
# streams text sooner.
CHUNK_SIZE = 16


class _Decoder:
    """The compiled prefill and decode loop of one model, and its random state.

    Decoding state, kept on the device between calls:
        window (B, block_size)  each row's last tokens, left-aligned
        lengths (B,)            how many of them are real
        cache                   keys and values of window[:, :lengths]
        pending (B,)            the token drawn last, not yet in the window
    The random state is shared by the compiled functions; each stream keeps
    its own copy and puts it back before every call, so streams can interleave.
    """

    def __init__(self, model):
        self.model = model
        self.seed_generator = keras.random.SeedGenerator(0)
        self.prefill = _compile(self._prefill)
        self.decode_chunk = _compile(self._decode_chunk)

    def _prefill(self, window, lengths, settings):
        """Run the windows through the model; draw each row's first new token."""
        logits, cache = self._forward_window(window)
        last = _logits_at(logits, lengths - 1)  # (B, V)
        return sample_next_token(last, settings, self.seed_generator), cache

    def _decode_chunk(self, window, lengths, cache, pending, settings, steps):
        """Draw `steps` (<= CHUNK_SIZE) more tokens per row -> (tokens (B, CHUNK_SIZE), state...)."""
        block_size = self.model.config.block_size
        slots = ops.arange(block_size)[None, :]  # (1, S)
        batch_size = ops.shape(window)[0]

        def body(step, window, lengths, cache, pending, drawn):
            full = ops.greater_equal(lengths, block_size)  # (B,): no slot left; slide the window
            slid = ops.concatenate([window[:, 1:], pending[:, None]], axis=1)
            placed = ops.where(ops.equal(slots, lengths[:, None]), pending[:, None], window)
            window = ops.where(full[:, None], slid, placed)
            positions = lengths
            lengths = ops.minimum(lengths + 1, block_size)

            def with_cache():
                logits, new_cache = self.model.call_with_cache(pending[:, None], cache, positions)
                return logits[:, 0], new_cache

            def recomputed():
                # Sliding shifts every learned position: the whole window is recomputed.
                logits, new_cache = self._forward_window(window)
                return _logits_at(logits, lengths - 1), new_cache

            logits, cache = ops.cond(ops.any(full), recomputed, with_cache)
            pending = sample_next_token(logits, settings, self.seed_generator)
            drawn = ops.where(ops.equal(ops.arange(CHUNK_SIZE)[None, :], step), pending[:, None], drawn)
            return step + 1, window, lengths, cache, pending, drawn

        drawn = ops.zeros((batch_size, CHUNK_SIZE), "int32")
        _, window, lengths, cache, pending, drawn = ops.while_loop(
            lambda step, *_: ops.less(step, steps),
            body,
            (ops.convert_to_tensor(0, "int32"), window, lengths, cache, pending, drawn),
            maximum_iterations=CHUNK_SIZE,
        )
        return drawn, window, lengths, cache, pending

    def _forward_window(self, window):
        batch_size = ops.shape(window)[0]
        return self.model.call_with_cache(
            window, self.model.empty_cache(batch_size), ops.zeros((batch_size,), "int32")
        )


def _logits_at(logits, indices):
    """logits (B, T, V), indices (B,) -> (B, V)."""
    return ops.take_along_axis(logits, ops.reshape(indices, (-1, 1, 1)), axis=1)[:, 0]


def _compile(function):
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        return tf.function(function, jit_compile=True)
    return function


def _decoder_for(model):
    if model not in _decoders:
        _decoders[model] = _Decoder(model)
    return _decoders[model]


def _decode(model, prompts_ids, max_new_tokens, settings, seed):
    """Yield, for each new position, an int array (B,) of the tokens chosen for every row."""
    if max_new_tokens == 0:
        return
    decoder = _decoder_for(model)
    random_state = decoder.seed_generator.state
    if seed is None:
        seed = int(np.random.default_rng().integers(2**31))
    own_random_state = np.array([seed, 0], dtype=keras.backend.standardize_dtype(random_state.dtype))

    block_size = model.config.block_size
    window = np.zeros((len(prompts_ids), block_size), dtype=np.int32)
    lengths = np.zeros(len(prompts_ids), dtype=np.int32)
    for index, ids in enumerate(prompts_ids):
        context = ids[-block_size:]
        window[index, : len(context)] = context
        lengths[index] = len(context)

    random_state.assign(own_random_state)
    pending, cache = decoder.prefill(window, lengths, settings)
    own_random_state = keras.ops.convert_to_numpy(random_state)
    yield keras.ops.convert_to_numpy(pending)
    produced = 1
    while produced < max_new_tokens:
        steps = min(CHUNK_SIZE, max_new_tokens - produced)
        random_state.assign(own_random_state)
        drawn, window, lengths, cache, pending = decoder.decode_chunk(
            window, lengths, cache, pending, settings, np.int32(steps)
        )
        own_random_state = keras.ops.convert_to_numpy(random_state)
        yield from keras.ops.convert_to_numpy(drawn)[:, :steps].T
        produced += steps


def _checked_settings(model, max_new_tokens, temperature, top_k, top_p):
    """Check the sampling settings; return the sampler's [temperature, top_k, top_p]."""
    check_sampling_settings(max_new_tokens, temperature, top_k, top_p)
    top_k = model.tokenizer.vocabulary_size if top_k is None else top_k
    return np.array([temperature, top_k, top_p], dtype=np.float32)


def stream(model, prompt="", max_new_tokens=200, temperature=1.0, top_k=None, top_p=1.0, seed=None,
           unknown="error", stop=()):
    """An iterator over the continuation of `prompt`, one decoded token at a time.

    `stop` is a string or a list of them: the text ends just before the first
    one that appears in the continuation. Text that might be the start of a
    stop string is held back until it is clear whether it is.

    Settings and prompt are checked at once, before the first token. Prompt
    characters the vocabulary lacks raise an `InputError` naming them
    (`unknown="error"`), are left out (`"skip"`) or become spaces
    (`"replace"`). An empty prompt starts from a newline (or, without one in
    the vocabulary, from the first token); that start is not yielded.
    """
    settings = _checked_settings(model, max_new_tokens, temperature, top_k, top_p)
    prompt_ids = _prompt_ids(model.tokenizer, prompt, unknown)
    decode = model.tokenizer.decode
    pieces = (decode(tokens[:1]) for tokens in _decode(model, [prompt_ids], max_new_tokens, settings, seed))
    stops = _stop_strings(stop)
    return _cut_at_stop(pieces, stops) if stops else pieces


def generate(model, prompt="", max_new_tokens=200, temperature=1.0, top_k=None, top_p=1.0, seed=None,
             unknown="error", stop=()):
    """Return `prompt` followed by `max_new_tokens` sampled tokens, as text.

    `prompt` may be a list of prompts, of any lengths: they are decoded
    together in one batch and a list of texts comes back. With `stop`, each
    continuation ends before its first stop string, and decoding ends once
    every row has met one.
    """
    prompts = [prompt] if isinstance(prompt, str) else list(prompt)
    if not prompts:
        raise ConfigError("give at least one prompt")
    settings = _checked_settings(model, max_new_tokens, temperature, top_k, top_p)
    prompts_ids = [_prompt_ids(model.tokenizer, p, unknown) for p in prompts]
    stops = _stop_strings(stop)
    continuations = [""] * len(prompts)
    for tokens in _decode(model, prompts_ids, max_new_tokens, settings, seed):
        continuations = [text + model.tokenizer.decode([token]) for text, token in zip(continuations, tokens)]
        if stops and all(_first_stop(text, stops) is not None for text in continuations):
            break
    texts = []
    for prompt_text, continuation in zip(prompts, continuations):
        end = _first_stop(continuation, stops) if stops else None
        texts.append(prompt_text + continuation[:end])
    return texts[0] if isinstance(prompt, str) else texts


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
    if unknown not in ("error", "skip", "replace"):
        raise ConfigError(f"unknown must be 'error', 'skip' or 'replace', got {unknown!r}")
    missing = tokenizer.unknown_characters(prompt)
    if missing and unknown == "error":
        raise InputError(
            f"the prompt has characters the model never saw in training: {''.join(missing)!r} "
            f"(--unknown skip or replace lets it run anyway)"
        )
    if missing:
        replacement = " " if unknown == "replace" and not tokenizer.unknown_characters(" ") else ""
        prompt = "".join(replacement if c in missing else c for c in prompt)
    if not prompt:
        # Start from a new line, as a text does; lacking one, from the first token.
        return [int(tokenizer.encode("\n")[0])] if not tokenizer.unknown_characters("\n") else [0]
    return [int(i) for i in tokenizer.encode(prompt)]


def check_sampling_settings(max_new_tokens, temperature, top_k=None, top_p=1.0):
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ConfigError(f"max_new_tokens must be zero or a positive whole number, got {max_new_tokens!r}")
    if temperature < 0:
        raise ConfigError(f"temperature must be 0 (greedy) or positive, got {temperature}")
    if top_k is not None and top_k < 1:
        raise ConfigError(f"top_k must be at least 1, got {top_k}")
    if not 0 < top_p <= 1:
        raise ConfigError(f"top_p must be in (0, 1], got {top_p}")
