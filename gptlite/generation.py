"""Sampling text from a trained GPT with a key/value cache.

How a batch of prompts is decoded:
1. Prefill: the prompts, right-padded to `block_size`, run through the model
   once; every block's keys and values land in a fixed-size cache and the
   first new token is drawn from the logits at each prompt's last position.
2. Decode: each step feeds one token per row at that row's own position,
   writes its key and value into the cache, and draws the next token.
3. Sliding: when a row's context would pass `block_size`, the batch is
   prefilled again from the last `block_size` tokens of each row, and each
   further token is then computed that way. The model never sees more than
   `block_size` tokens, exactly as full recomputation would.

Prefill and decode step are compiled once per model and batch size (XLA on
TensorFlow) and traced with the sampling settings as tensor inputs, so
changing prompt length, temperature, top-k, top-p or seed never recompiles.
Streaming comes from the host loop around the compiled step.

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


class _Decoder:
    """The compiled prefill and decode step of one model, and its random state."""

    def __init__(self, model):
        self.model = model
        self.seed_generator = keras.random.SeedGenerator(0)
        self.prefill = _compile(self._prefill)
        self.step = _compile(self._step)

    def _prefill(self, token_ids, lengths, settings):
        """token_ids (B, block_size) right-padded, lengths (B,) -> next tokens (B,), cache."""
        batch_size = ops.shape(token_ids)[0]
        logits, cache = self.model.call_with_cache(
            token_ids, self.model.empty_cache(batch_size), ops.zeros((batch_size,), "int32")
        )  # (B, T, V)
        last = ops.take_along_axis(logits, ops.reshape(lengths - 1, (-1, 1, 1)), axis=1)[:, 0]  # (B, V)
        return sample_next_token(last, settings, self.seed_generator), cache

    def _step(self, tokens, cache, positions, settings):
        """tokens (B,) placed at positions (B,) -> the tokens after them (B,), cache."""
        logits, cache = self.model.call_with_cache(tokens[:, None], cache, positions)  # (B, 1, V)
        return sample_next_token(logits[:, 0], settings, self.seed_generator), cache


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
    decoder = _decoder_for(model)
    state = decoder.seed_generator.state
    if seed is None:
        seed = int(np.random.default_rng().integers(2**31))
    state.assign(np.array([seed, 0], dtype=keras.backend.standardize_dtype(state.dtype)))
    block_size = model.config.block_size
    rows = [list(ids) for ids in prompts_ids]

    def prefill():
        tokens = np.zeros((len(rows), block_size), dtype=np.int32)
        lengths = np.zeros(len(rows), dtype=np.int32)
        for index, row in enumerate(rows):
            context = row[-block_size:]
            tokens[index, : len(context)] = context
            lengths[index] = len(context)
        next_tokens, cache = decoder.prefill(tokens, lengths, settings)
        return next_tokens, cache, lengths

    next_tokens, cache, positions = prefill() if max_new_tokens else (None, None, None)
    for produced in range(max_new_tokens):
        chosen = keras.ops.convert_to_numpy(next_tokens)
        for row, token in zip(rows, chosen):
            row.append(int(token))
        yield chosen
        if produced + 1 == max_new_tokens:
            break
        if positions.max() >= block_size:  # a row's window is full: slide it
            next_tokens, cache, positions = prefill()
        else:
            next_tokens, cache = decoder.step(next_tokens, cache, positions, settings)
            positions = positions + 1


def _settings(model, temperature, top_k, top_p):
    check_sampling_settings(0, temperature, top_k, top_p)
    top_k = model.tokenizer.vocabulary_size if top_k is None else top_k
    return np.array([temperature, top_k, top_p], dtype=np.float32)


def stream(model, prompt="", max_new_tokens=200, temperature=1.0, top_k=None, top_p=1.0, seed=None,
           unknown="error"):
    """An iterator over the continuation of `prompt`, one decoded token at a time.

    Settings and prompt are checked at once, before the first token. Prompt
    characters the vocabulary lacks raise an `InputError` naming them
    (`unknown="error"`), are left out (`"skip"`) or become spaces
    (`"replace"`). An empty prompt starts from a newline (or, without one in
    the vocabulary, from the first token); that start is not yielded.
    """
    check_sampling_settings(max_new_tokens, temperature, top_k, top_p)
    settings = _settings(model, temperature, top_k, top_p)
    prompt_ids = _prompt_ids(model.tokenizer, prompt, unknown)
    decode = model.tokenizer.decode
    return (decode(tokens[:1]) for tokens in _decode(model, [prompt_ids], max_new_tokens, settings, seed))


def generate(model, prompt="", max_new_tokens=200, temperature=1.0, top_k=None, top_p=1.0, seed=None,
             unknown="error"):
    """Return `prompt` followed by `max_new_tokens` sampled tokens, as text.

    `prompt` may be a list of prompts, of any lengths: they are decoded
    together in one batch and a list of texts comes back.
    """
    prompts = [prompt] if isinstance(prompt, str) else list(prompt)
    if not prompts:
        raise ConfigError("give at least one prompt")
    check_sampling_settings(max_new_tokens, temperature, top_k, top_p)
    settings = _settings(model, temperature, top_k, top_p)
    prompts_ids = [_prompt_ids(model.tokenizer, p, unknown) for p in prompts]
    steps = list(_decode(model, prompts_ids, max_new_tokens, settings, seed))
    new_tokens = np.stack(steps, axis=1) if steps else np.zeros((len(prompts), 0), dtype=np.int32)
    texts = [p + model.tokenizer.decode(ids) for p, ids in zip(prompts, new_tokens)]
    return texts[0] if isinstance(prompt, str) else texts


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
