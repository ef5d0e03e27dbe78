"""Writing text with a trained model: `generate` and `stream` continue a GPT's
prompt, `generate_target` writes a Seq2Seq's target for a source.

All three run the same decode loop (`gptlite.decoding`) and turn its tokens
into text the same way (`_texts`): each row's text ends before the
tokenizer's end token or its first stop string, and decoding ends once every
row has ended. We use our own sampler and beam search rather than
KerasHub's: theirs fix k, p and temperature as Python values (one trace per
setting) and run the whole loop to the end in one call, which cannot stream;
their beam search steps all rows from one shared position through a buffer
as long as the whole output (one compile per output length), where ours
uses the per-row windows and compiled loops that sampling does.
"""

import numpy as np

from gptlite import decoding
from gptlite.errors import ConfigError, InputError
from gptlite.model import Seq2Seq
from gptlite.sampling import check_beams, check_sampling_settings, sampler_settings
from gptlite.text import Continuation, known_text, stop_strings

# Sources decoded per call at most; a longer list is split into calls of
# this many (the last padded), so that it compiles once.
TARGET_BATCH = 256


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
    rows = _continuations(model, [prompt], max_new_tokens, temperature, top_k, top_p, seed, unknown, stop,
                          use_cache, slide, None, streaming=True)
    return (pieces[0] for pieces in rows if pieces[0])


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
    rows = _continuations(model, prompts, max_new_tokens, temperature, top_k, top_p, seed, unknown, stop,
                          use_cache, slide, num_beams, streaming=False)
    texts = [prompt_text + "".join(pieces) for prompt_text, *pieces in zip(prompts, *rows)]
    return texts[0] if isinstance(prompt, str) else texts


class RowsStream:
    """Several prompts continued together in one batch, each with its own length and stop strings.

    Iterating gives, for each new position, a list of each row's new text
    ("" for a row that has ended). `finish_reasons[i]` becomes "stop" when
    row i meets the end token or one of its stop strings, and "length" when
    it has its `max_new_tokens[i]` tokens; decoding ends when every row has
    ended, or when the caller stops iterating. `prompt_tokens[i]` and
    `completion_tokens[i]` count row i's tokens (a prompt longer than the
    context counts whole; the model sees its last block_size tokens). The
    rows share the sampling settings and `seed`: with one row, the text is
    what `generate` writes for the same settings and seed.
    """

    def __init__(self, model, prompts, max_new_tokens, temperature=1.0, top_k=None, top_p=1.0, seed=None,
                 stops=None, unknown="error"):
        if not prompts:
            raise ConfigError("give at least one prompt")
        if isinstance(model, Seq2Seq):
            raise ConfigError("RowsStream continues a GPT's prompts; a Seq2Seq writes targets with generate_target")
        self.limits = [max_new_tokens] * len(prompts) if isinstance(max_new_tokens, int) else list(max_new_tokens)
        _check(model, max(self.limits), temperature, top_k, top_p, 1, None)
        rows_ids = [_prompt_ids(model.tokenizer, prompt, unknown) for prompt in prompts]
        self.prompt_tokens = [len(ids) for ids in rows_ids]
        self.completion_tokens = [0] * len(prompts)
        self.finish_reasons = [None] * len(prompts)
        self._rows = [Continuation(model.tokenizer, stop_strings(row_stops), streaming=True)
                      for row_stops in (stops or [()] * len(prompts))]
        self._tokens = _tokens(model, rows_ids, None, max(self.limits), temperature, top_k, top_p, _seed(seed),
                               True, 1, None)

    def __iter__(self):
        for row, limit in enumerate(self.limits):
            if limit == 0:
                self.finish_reasons[row] = "length"
        if all(self.finish_reasons):
            return
        for step_tokens in self._tokens:
            yield [self._add(row, int(token)) for row, token in enumerate(step_tokens)]
            if all(self.finish_reasons):
                return

    def _add(self, row, token):
        if self.finish_reasons[row]:
            return ""
        continuation = self._rows[row]
        self.completion_tokens[row] += 1
        text = continuation.add(token)
        if not continuation.ended and self.completion_tokens[row] >= self.limits[row]:
            text += continuation.finish()  # which may find a stop string in the text held back
        if continuation.ended:
            self.finish_reasons[row] = "stop" if continuation.stopped else "length"
        return text


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
    target as soon as its batch of TARGET_BATCH is decoded. Everything is checked at once.
    """
    if not isinstance(model, Seq2Seq):
        raise ConfigError(f"generate_target needs a Seq2Seq model, not a {type(model).__name__}; "
                          f"a GPT continues a prompt with generate")
    sources = list(sources)
    if not sources:
        raise ConfigError("give at least one source")
    block_size = model.config.block_size
    max_new_tokens = block_size - 1 if max_new_tokens is None else max_new_tokens
    _check(model, max_new_tokens, temperature, top_k, top_p, 1, num_beams)
    source_ids = np.zeros((len(sources), block_size), np.int32)
    for index, text in enumerate(sources):
        ids = model.tokenizer.encode(known_text(model.tokenizer, text, unknown, "source"))
        if len(ids) > block_size:
            shortened = text if len(text) <= 40 else text[:40] + "..."
            raise InputError(f"the source {shortened!r} is {len(ids)} tokens long; "
                             f"this model reads sources of up to {block_size}")
        source_ids[index, :len(ids)] = ids
    return _decode_targets(model, source_ids, min(max_new_tokens, block_size - 1), temperature, top_k, top_p, seed,
                           stop_strings(stop), use_cache, num_beams)


def _decode_targets(model, source_ids, max_new_tokens, temperature, top_k, top_p, seed, stops, use_cache, num_beams):
    batch_size = min(len(source_ids), TARGET_BATCH)
    seed = _seed(seed)
    starts = [[model.tokenizer.start_token_id]] * batch_size
    for index, first in enumerate(range(0, len(source_ids), batch_size)):
        batch = np.zeros((batch_size, source_ids.shape[1]), np.int32)
        rows = source_ids[first:first + batch_size]
        batch[:len(rows)] = rows
        # Each batch draws its own noise, so that batches of the same sources differ.
        batch_seed = (seed * 1_000_003 + index) % 2**31 if index else seed
        texts = _texts(model, _tokens(model, starts, batch, max_new_tokens, temperature, top_k, top_p, batch_seed,
                                      use_cache, 1, num_beams), batch_size, stops, streaming=False)
        yield from ["".join(pieces) for pieces in zip(*texts)][:len(rows)]


def _continuations(model, prompts, max_new_tokens, temperature, top_k, top_p, seed, unknown, stop, use_cache, slide,
                   num_beams, streaming):
    """Check everything at once; then an iterator over each step's new text of every prompt's row."""
    if not prompts:
        raise ConfigError("give at least one prompt")
    _check(model, max_new_tokens, temperature, top_k, top_p, slide, num_beams)
    rows_ids = [_prompt_ids(model.tokenizer, prompt, unknown) for prompt in prompts]
    stops = stop_strings(stop)
    tokens = _tokens(model, rows_ids, None, max_new_tokens, temperature, top_k, top_p, _seed(seed), use_cache, slide,
                     num_beams)
    return _texts(model, tokens, len(prompts), stops, streaming)


def _tokens(model, rows_ids, sources, max_new_tokens, temperature, top_k, top_p, seed, use_cache, slide, num_beams):
    """Each new position's tokens, an int array (B,) of every row's."""
    window, lengths = decoding.windows(model.config.block_size, rows_ids)
    if num_beams is None:
        settings = sampler_settings(model.tokenizer.vocabulary_size, temperature, top_k, top_p)
        return decoding.sample(model, window, lengths, sources, max_new_tokens, settings, np.int32(seed), use_cache,
                               slide)
    return iter(decoding.beam_search(model, window, lengths, sources, max_new_tokens, num_beams,
                                     model.tokenizer.end_token_id, use_cache, slide).T)


def _texts(model, tokens, count, stops, streaming):
    """Yield, for each step, a list of the new text of each of `count` rows, until every row has ended.

    Unless `streaming`, a row's text may come all at its end.
    """
    rows = [Continuation(model.tokenizer, stops, streaming) for _ in range(count)]
    for step_tokens in tokens:
        yield [row.add(token) for row, token in zip(rows, step_tokens)]
        if all(row.ended for row in rows):
            return
    yield [row.finish() for row in rows]


def _check(model, max_new_tokens, temperature, top_k, top_p, slide, num_beams):
    check_sampling_settings(max_new_tokens, temperature, top_k, top_p)
    block_size = model.config.block_size
    if isinstance(slide, bool) or not isinstance(slide, int) or not 1 <= slide <= block_size:
        raise ConfigError(f"slide must be a whole number from 1 to the block size, {block_size}; got {slide!r}")
    if num_beams is not None:
        check_beams(num_beams, model.tokenizer.vocabulary_size)


def _seed(seed):
    return int(np.random.default_rng().integers(2**31)) if seed is None else seed % 2**31


def _prompt_ids(tokenizer, prompt, unknown="error"):
    prompt = known_text(tokenizer, prompt, unknown, "prompt")
    start = [int(i) for i in tokenizer.text_start_ids]  # a pretrained model's beginning-of-text token
    if not prompt:
        if start:
            return start
        # Start from a new line, as a text does; lacking one, from the first token.
        return [int(tokenizer.encode("\n")[0])] if not tokenizer.unknown_characters("\n") else [0]
    return start + [int(i) for i in tokenizer.encode(prompt)]
