"""Sampling text from a trained GPT, one token at a time.

Each step runs the model on a fixed-size window of the last `block_size`
tokens (right-padded; causality makes the padding invisible to the position
read), so the forward pass compiles once per model and batch size. The next
token is chosen by a KerasHub sampler: greedy for temperature 0, top-k when
`top_k` is given, plain sampling otherwise.
"""

import weakref

import keras
import numpy as np

from gptlite.errors import ConfigError, InputError

# One compiled forward function per model, made on first use.
_compiled_forward = weakref.WeakKeyDictionary()


def stream(model, prompt="", max_new_tokens=200, temperature=1.0, top_k=None, seed=None, unknown="error"):
    """An iterator over the continuation of `prompt`, one decoded token at a time.

    Settings and prompt are checked at once, before the first token.
    Prompt characters the vocabulary lacks raise an `InputError` naming them
    (`unknown="error"`), are left out (`"skip"`) or become spaces (`"replace"`).

    An empty prompt starts from a newline (or, without one in the
    vocabulary, from the first token); that start is not yielded. When the
    text outgrows `block_size`, the model sees only the last `block_size`
    tokens.
    """
    check_sampling_settings(max_new_tokens, temperature, top_k)
    return _stream_tokens(
        model, _prompt_ids(model.tokenizer, prompt, unknown), max_new_tokens,
        _make_sampler(temperature, top_k, seed, model.tokenizer.vocabulary_size),
    )


def generate(model, prompt="", max_new_tokens=200, temperature=1.0, top_k=None, seed=None, unknown="error"):
    """Return `prompt` followed by `max_new_tokens` sampled tokens, as text."""
    return prompt + "".join(stream(model, prompt, max_new_tokens, temperature, top_k, seed, unknown))


def _stream_tokens(model, prompt_ids, max_new_tokens, sampler):
    tokenizer = model.tokenizer
    block_size = model.config.block_size
    forward = _forward_at(model)
    ids = list(prompt_ids)
    window = np.zeros((1, block_size), dtype=np.int32)  # (B, T)
    for _ in range(max_new_tokens):
        context = ids[-block_size:]
        window[0, : len(context)] = context
        window[0, len(context):] = 0
        logits = forward(window, np.int32(len(context) - 1))  # (B, V)
        next_token = sampler.get_next_token(sampler.compute_probabilities(logits))
        token = int(keras.ops.convert_to_numpy(next_token)[0])
        ids.append(token)
        yield tokenizer.decode([token])


def _forward_at(model):
    """A function (tokens (B, T), index) -> logits (B, V) at that position, compiled once."""
    if model not in _compiled_forward:

        def forward(tokens, index):
            logits = model(tokens, training=False)  # (B, T, V)
            return keras.ops.take(logits, index, axis=1)  # (B, V)

        if keras.backend.backend() == "tensorflow":
            import tensorflow as tf

            forward = tf.function(forward, jit_compile=True)
        _compiled_forward[model] = forward
    return _compiled_forward[model]


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


def _make_sampler(temperature, top_k, seed, vocabulary_size):
    from keras_hub import samplers

    if temperature == 0:
        return samplers.GreedySampler()
    if top_k is not None and top_k < vocabulary_size:
        return samplers.TopKSampler(k=top_k, seed=seed, temperature=temperature)
    return samplers.RandomSampler(seed=seed, temperature=temperature)


def check_sampling_settings(max_new_tokens, temperature, top_k):
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ConfigError(f"max_new_tokens must be zero or a positive whole number, got {max_new_tokens!r}")
    if temperature < 0:
        raise ConfigError(f"temperature must be 0 (greedy) or positive, got {temperature}")
    if top_k is not None and top_k < 1:
        raise ConfigError(f"top_k must be at least 1, got {top_k}")
