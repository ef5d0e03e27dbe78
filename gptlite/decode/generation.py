"""Writing text with a trained model: `generate` and `stream` continue a GPT's
prompt, `generate_target` writes a Seq2Seq's target for a source.

All of them decode through one `gptlite.decode.engine.Engine` and turn each row's
tokens into text the same way (`NewText`): a row's text ends before the
tokenizer's end token, before its first stop string, or at its
max_new_tokens, and decoding ends once every row has ended. Sampling
settings come as one `SamplingConfig` (or as its fields by name):

    gptlite.generate(model, "ROMEO:", 100, temperature=0.8, seed=1)
    gptlite.generate(model, "ROMEO:", sampling=gptlite.SamplingConfig(max_new_tokens=100, top_p=0.9))

We use our own sampler and beam search rather than KerasHub's: theirs fix k,
p and temperature as Python values (one trace per setting) and run the whole
loop to the end in one call, which cannot stream or admit new rows; their
beam search steps all rows from one shared position through a buffer as long
as the whole output (one compile per output length), where ours uses the
engine's per-row windows and compiled loops.
"""

import numpy as np

from gptlite.decode.engine import CHUNK_SIZE, Engine
from gptlite.decode.rows import NewText, TextRows
from gptlite.decode.sampling import check_beams
from gptlite.decode.settings import SamplingConfig
from gptlite.errors import ConfigError, InputError
from gptlite.model.gpt import check_use
from gptlite.text.tokenizers import known_text

# Sources decoded per call at most; a longer list is split into calls of
# this many (the last padded), so that it compiles once.
TARGET_BATCH = 256
# The first call after the prefill draws this many tokens: text starts flowing at once.
FIRST_CHUNK_SIZE = 8


def stream(model, prompt="", max_new_tokens=None, sampling=None, *, unknown="error", use_cache=True, slide=1,
           **settings):
    """An iterator over the continuation of `prompt`, one decoded token at a time.

    Sampling settings are as for `generate`. Text that might be the start of
    a stop string is held back until it is clear whether it is. Settings and
    prompt are checked at once, before the first token. Prompt characters
    the vocabulary lacks raise an `InputError` naming them
    (`unknown="error"`), are left out (`"skip"`) or become spaces
    (`"replace"`). An empty prompt starts from a newline (or, without one in
    the vocabulary, from the first token); that start is not yielded.
    """
    rows = RowsStream(model, [prompt], sampling_config(sampling, max_new_tokens, settings), unknown=unknown,
                      use_cache=use_cache, slide=slide)
    return (pieces[0] for pieces in rows if pieces[0])


def generate(model, prompt="", max_new_tokens=None, sampling=None, *, unknown="error", use_cache=True, slide=1,
             num_beams=None, **settings):
    """Return `prompt` followed by up to `max_new_tokens` new tokens, as text.

    Sampling settings: a `SamplingConfig` as `sampling`, and any of its
    fields by name (temperature, top_k, top_p, min_p, repetition_penalty,
    seed, stop), which replace the config's. `prompt` may be a list of
    prompts, of any lengths: they are decoded together in one batch and a
    list of texts comes back. Each row draws from a seed of its own (the
    first prompt's is `seed`), so a row's text is the same whatever shares
    its batch. With `stop`, each continuation ends before its first stop
    string, and decoding ends once every row has met one (or the end token,
    where the tokenizer has one).

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
    beams instead of sampling (the sampling settings but stop do not
    apply); one beam is greedy decoding.
    """
    prompts = [prompt] if isinstance(prompt, str) else list(prompt)
    config = sampling_config(sampling, max_new_tokens, settings)
    if num_beams is not None:
        pieces = _beam_texts(model, prompts, config, unknown, use_cache, slide, num_beams)
    else:
        configs, rows_ids = _rows(model, prompts, config, unknown, slide)
        rows = TextRows(Engine(model, len(prompts), use_cache=use_cache, slide=slide, reach=_reach(rows_ids, configs)),
                        model.tokenizer, streaming=False)
        written = rows.finish(rows.admit(range(len(prompts)), rows_ids, configs, next_steps=CHUNK_SIZE))
        pieces = [written[index] for index in range(len(prompts))]
    texts = [prompt_text + text for prompt_text, text in zip(prompts, pieces)]
    return texts[0] if isinstance(prompt, str) else texts


def sampling_config(sampling=None, max_new_tokens=None, settings=None):
    """`sampling` (a SamplingConfig, or None for the defaults) with `max_new_tokens` and `settings` replacing its
    values."""
    if sampling is None:
        sampling = SamplingConfig()
    elif not isinstance(sampling, SamplingConfig):
        raise ConfigError(f"sampling must be a SamplingConfig, got {type(sampling).__name__}")
    changes = dict(settings or {})
    if max_new_tokens is not None:
        changes["max_new_tokens"] = max_new_tokens
    return sampling.replace(**changes) if changes else sampling


class RowsStream:
    """Several prompts continued together in one batch, each with its own sampling settings.

    `sampling` is one SamplingConfig for every row or a list of one per row
    (each with its own max_new_tokens, stop strings and seed; a seed of None
    is a random one; one config with a seed gives each row a seed made from
    it, see `generate`). Iterating gives, for each new position, a list of
    each row's new text ("" for a row that has ended); decoding ends when
    every row has ended, or when the caller stops iterating.
    `finish_reasons[i]` then says why row i ended; `prompt_tokens[i]` and
    `completion_tokens[i]` count its tokens (a prompt longer than the context
    counts whole; the model sees its last block_size tokens). With
    `answers`, each row is a chat answer: it ends at the template's end of
    turn too.
    """

    def __init__(self, model, prompts, sampling=None, *, unknown="error", use_cache=True, slide=1, streaming=True,
                 rows_ids=None, answers=False):
        self.configs, self.rows_ids = _rows(model, prompts, sampling, unknown, slide, rows_ids)
        self.answers = answers
        self.prompt_tokens = [len(ids) for ids in self.rows_ids]
        engine = Engine(model, len(prompts), use_cache=use_cache, slide=slide,
                        reach=_reach(self.rows_ids, self.configs))
        self.text_rows = TextRows(engine, model.tokenizer, streaming)
        self.finish_reasons = [None] * len(prompts)  # each row's, once it has ended: "stop" or "length"
        self.completion_tokens = [0] * len(prompts)

    def __iter__(self):
        written = self.text_rows.admit(range(len(self.configs)), self.rows_ids, self.configs, answers=self.answers,
                                       next_steps=FIRST_CHUNK_SIZE)
        calls = 0
        while written:
            for index, row in written.items():
                self.finish_reasons[index], self.completion_tokens[index] = row.finish_reason, row.tokens
            for column in range(max(len(row.pieces) for row in written.values())):
                pieces = [""] * len(self.configs)
                for index, row in written.items():
                    if column < len(row.pieces):
                        pieces[index] = row.pieces[column]
                yield pieces
            if not self.text_rows:
                return
            written = self.text_rows.step(FIRST_CHUNK_SIZE if calls == 0 else CHUNK_SIZE)
            calls += 1


def _rows(model, prompts, sampling, unknown, slide, rows_ids=None):
    """Prompts to continue, checked: (each row's SamplingConfig, each row's token ids). `sampling` is one config
    for every row (each row then seeded from its seed) or a list of one each; `rows_ids`, the prompts' ids where
    the caller has encoded them (a conversation's, say)."""
    if not prompts:
        raise ConfigError("give at least one prompt")
    check_use(model, "continue a prompt")
    configs = list(sampling) if isinstance(sampling, (list, tuple)) else \
        sampling_config(sampling).for_rows(len(prompts))
    if len(configs) != len(prompts) or not all(isinstance(config, SamplingConfig) for config in configs):
        raise ConfigError("sampling must be one SamplingConfig or a list of one for each prompt")
    _check_slide(model, slide)
    if rows_ids is not None:
        return configs, [list(ids) for ids in rows_ids]
    return configs, [prompt_ids(model.tokenizer, prompt, unknown) for prompt in prompts]


def _reach(rows_ids, configs):
    """The most positions a row will fill: its prompt and its new tokens (each row's config its own)."""
    return max(len(ids) + config.max_new_tokens for ids, config in zip(rows_ids, configs))


def _beam_texts(model, prompts, config, unknown, use_cache, slide, num_beams):
    if not prompts:
        raise ConfigError("give at least one prompt")
    _check_slide(model, slide)
    check_beams(num_beams, model.tokenizer.vocabulary_size)
    rows_ids = [prompt_ids(model.tokenizer, prompt, unknown) for prompt in prompts]
    reach = _reach(rows_ids, [config] * len(rows_ids))
    engine = Engine(model, len(prompts), use_cache=use_cache, slide=slide, reach=reach)
    sequences = engine.beam_search(rows_ids, config.max_new_tokens, num_beams, model.tokenizer.end_token_id)
    return [_text_of(model.tokenizer, config, ids) for ids in sequences]


def generate_target(model, source, max_new_tokens=None, sampling=None, *, unknown="error", use_cache=True,
                    num_beams=None, **settings):
    """The target that a Seq2Seq model writes for `source`, as text.

    `source` may be a list of texts: they are decoded together in batches
    and a list of targets comes back. A target ends before the end token,
    after `max_new_tokens` tokens (default and most: block_size - 1), or
    before its first `stop` string. Unlike a GPT's `generate`, the default
    temperature is 0: the likeliest token at each step. Sampling settings,
    `unknown` (for characters the vocabulary lacks), `use_cache` and
    `num_beams` are as for `generate`.
    """
    targets = iter_targets(model, [source] if isinstance(source, str) else source, max_new_tokens, sampling,
                           unknown=unknown, use_cache=use_cache, num_beams=num_beams, **settings)
    return next(targets) if isinstance(source, str) else list(targets)


def iter_targets(model, sources, max_new_tokens=None, sampling=None, *, unknown="error", use_cache=True,
                 num_beams=None, **settings):
    """As `generate_target` for a list of sources: an iterator that gives each
    target as soon as its batch of TARGET_BATCH is decoded. Everything is checked at once.
    """
    check_use(model, "write targets")
    sources = list(sources)
    if not sources:
        raise ConfigError("give at least one source")
    block_size = model.config.block_size
    settings = {"temperature": 0.0, **settings} if sampling is None else settings
    config = sampling_config(sampling, max_new_tokens, settings)
    config = config.replace(max_new_tokens=min(config.max_new_tokens, block_size - 1)) \
        if max_new_tokens is not None or sampling is not None else config.replace(max_new_tokens=block_size - 1)
    if num_beams is not None:
        check_beams(num_beams, model.tokenizer.vocabulary_size)
    return _decode_targets(model, source_ids(model.tokenizer, block_size, sources, unknown), config, use_cache,
                           num_beams)


def source_ids(tokenizer, block_size, sources, unknown="error"):
    """Source texts as a Seq2Seq reads them: (N, block_size) token ids, each row padded with the pad id (0); a
    source longer than block_size is refused."""
    ids_of = np.zeros((len(sources), block_size), np.int32)
    for index, text in enumerate(sources):
        ids = tokenizer.encode(known_text(tokenizer, text, unknown, "source"))
        if len(ids) > block_size:
            shortened = text if len(text) <= 40 else text[:40] + "..."
            raise InputError(f"the source {shortened!r} is {len(ids)} tokens long; "
                             f"this model reads sources of up to {block_size}")
        ids_of[index, :len(ids)] = ids
    return ids_of


def _decode_targets(model, source_ids, config, use_cache, num_beams):
    batch_size = min(len(source_ids), TARGET_BATCH)
    configs = config.for_rows(len(source_ids))  # every source a seed of its own, whichever batch it is in
    start = [model.tokenizer.start_token_id]
    engine = Engine(model, batch_size, use_cache=use_cache, reach=1 + config.max_new_tokens)  # a start token, a target
    for first in range(0, len(source_ids), batch_size):
        sources = source_ids[first:first + batch_size]
        if num_beams is not None:
            padded = np.concatenate([sources, np.repeat(sources[:1], batch_size - len(sources), axis=0)])
            sequences = engine.beam_search([start] * batch_size, config.max_new_tokens, num_beams,
                                           model.tokenizer.end_token_id, padded)
            yield from [_text_of(model.tokenizer, config, ids) for ids in sequences[:len(sources)]]
            continue
        rows = TextRows(engine, model.tokenizer, streaming=False)
        texts = rows.finish(rows.admit(range(len(sources)), [start] * len(sources),
                                       configs[first:first + len(sources)], sources))
        yield from (texts[index] for index in range(len(sources)))


def _text_of(tokenizer, config, ids):
    """The text of a whole row of token ids, ended as a decoded row's is."""
    row = NewText(tokenizer, config, streaming=False)
    return row.add(ids) + row.continuation.finish()


def _check_slide(model, slide):
    block_size = model.config.block_size
    if isinstance(slide, bool) or not isinstance(slide, int) or not 1 <= slide <= block_size:
        raise ConfigError(f"slide must be a whole number from 1 to the block size, {block_size}; got {slide!r}")


def prompt_ids(tokenizer, prompt, unknown="error"):
    """A prompt's token ids as the model reads them: the tokenizer's start of text first, where it has one."""
    prompt = known_text(tokenizer, prompt, unknown, "prompt")
    start = [int(i) for i in tokenizer.text_start_ids]  # a pretrained model's beginning-of-text token
    if not prompt:
        if start:
            return start
        # Start from a new line, as a text does; lacking one, from the first token.
        return [int(tokenizer.encode("\n")[0])] if not tokenizer.unknown_characters("\n") else [0]
    return start + [int(i) for i in tokenizer.encode(prompt)]
