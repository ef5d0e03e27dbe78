"""Rows of text written through the decode engine: each row's text, its stop strings and its end.

    rows = TextRows(Engine(model, 2), model.tokenizer)
    written = rows.admit(["a", "b"], [ids_a, ids_b], SamplingConfig(max_new_tokens=50, seed=1))
    while rows:
        written = rows.step()
    # each call: {key: Written}, the text each row's new tokens add, and why it ended once it has

This is the one loop every writer of text shares: `generate` and `stream`,
a Seq2Seq's targets, chat replies and the server's worker. A row's text ends
before the tokenizer's end token, before its first stop string (for an
answer, the chat template's end of turn among them), or at its
max_new_tokens; an ended row leaves the engine at once, so that its slot is
free for the next.
"""

import dataclasses

import numpy as np

from gptlite.decode.engine import CHUNK_SIZE, Drawn
from gptlite.decode.sampling import row_configs
from gptlite.text import templates
from gptlite.text.continuation import Continuation


class NewText:
    """One row's new text, token by token: it ends before the tokenizer's end token, before its first stop
    string, or at its max_new_tokens. `finish_reason` is then "stop" (end token or stop string) or "length";
    `tokens` counts the tokens it took."""

    def __init__(self, tokenizer, config, streaming=True):
        self.continuation = Continuation(tokenizer, list(config.stop), streaming)
        self.limit = config.max_new_tokens
        self.tokens = 0
        self.finish_reason = None if self.limit else "length"

    @property
    def ended(self):
        return self.finish_reason is not None

    def add(self, ids):
        """The text that token ids add; ids past the row's end add nothing."""
        text = ""
        for token in ids:
            if self.ended:
                break
            self.tokens += 1
            text += self.continuation.add(int(token))
            if not self.continuation.ended and self.tokens >= self.limit:
                text += self.continuation.finish()  # which may find a stop string in the text held back
            if self.continuation.ended:
                self.finish_reason = "stop" if self.continuation.stopped else "length"
        return text


@dataclasses.dataclass
class Written:
    """What one call added to a row: the text of each token it took (`pieces`), those tokens (a Drawn), how
    many tokens the row has taken in all, and, once it has ended, why: "stop" or "length"."""

    pieces: list
    drawn: Drawn
    tokens: int
    finish_reason: str = None

    @property
    def text(self):
        return "".join(self.pieces)


def ending_at_turn_end(tokenizer, config):
    """`config` with the chat template's end of turn among its stop strings, where the template has one."""
    end = templates.turn_end(tokenizer)
    return config if end is None else config.replace(stop=tuple(dict.fromkeys((*config.stop, end))))


class TextRows:
    """Rows of text decoding together in one engine, each known by a key of the caller's.

    `admit` prefills rows, `step` draws the next tokens of every row; each
    gives {key: Written}. `cancel` drops a row before its end. Unless
    `streaming`, text is wanted only whole (see `Continuation`). `len()`
    counts the rows still decoding.
    """

    def __init__(self, engine, tokenizer, streaming=True):
        self.engine, self.tokenizer, self.streaming = engine, tokenizer, streaming
        self._rows = {}  # engine row -> (key, NewText)
        self._handles = {}  # key -> engine row

    def __len__(self):
        return len(self._rows)

    def keys(self):
        """The keys of the rows still decoding, as a list."""
        return [key for key, _ in self._rows.values()]

    def admit(self, keys, rows_ids, sampling, sources=None, logprobs=False, answers=False, streaming=None,
              next_steps=None):
        """Prefill rows: their keys, token ids and SamplingConfigs (one for every row, each row then seeded from
        it, or one each), a Seq2Seq's sources (N, S) or None. With `answers`, a row is a chat answer that ends
        at the template's end of turn; `streaming` (None: this TextRows's) says whether its text is wanted as
        it comes. Each of these two is one value for every row or a list of one each. A row of max_new_tokens 0
        ends at once, without decoding. `next_steps`: the caller's next call is `step(next_steps, logprobs)`,
        whose program is then built while the prefill runs (see `Engine.admit`)."""
        keys = list(keys)
        configs = row_configs(sampling, len(keys))
        answers, streaming = (values if isinstance(values, (list, tuple)) else [values] * len(keys)
                              for values in (answers, self.streaming if streaming is None else streaming))
        configs = [ending_at_turn_end(self.tokenizer, config) if answer else config
                   for config, answer in zip(configs, answers)]
        texts = [NewText(self.tokenizer, config, row_streaming) for config, row_streaming in zip(configs, streaming)]
        written = {key: Written([], Drawn(np.zeros(0, np.int32)), 0, text.finish_reason)
                   for key, text in zip(keys, texts) if text.ended}
        live = [index for index, text in enumerate(texts) if not text.ended]
        if live:
            # The prefill draws one token a row: the step after it draws at most what the rows want beyond it.
            if next_steps is not None:
                next_steps = min(next_steps, max(texts[index].limit for index in live) - 1)
            drawn = self.engine.admit([rows_ids[index] for index in live], [configs[index] for index in live],
                                      None if sources is None else np.asarray(sources)[live], logprobs,
                                      next_steps=next_steps)
            for handle, index in zip(drawn, live):
                self._rows[handle] = (keys[index], texts[index])
                self._handles[keys[index]] = handle
            written.update(self._written(drawn))
        return {key: written[key] for key in keys}

    def step(self, max_steps=CHUNK_SIZE, logprobs=False):
        """Draw up to `max_steps` tokens of every row, no more than it still wants: a row that has them waits
        while the others go on."""
        if not self._rows:
            return {}
        limits = {handle: text.limit - text.tokens for handle, (_, text) in self._rows.items()}
        return self._written(self.engine.step(min(max_steps, max(limits.values())), logprobs, limits))

    def finish(self, written):
        """Decode every row to its end, from what `admit` gave (`written`): {key: its whole text}."""
        texts = {key: row.text for key, row in written.items()}
        while self._rows:
            for key, row in self.step().items():
                texts[key] += row.text
        return texts

    def cancel(self, key):
        """Stop decoding a row; its text ends where it is."""
        handle = self._handles.pop(key)
        del self._rows[handle]
        self.engine.retire(handle)

    def _written(self, drawn):
        """Each row's text from the engine's tokens; rows that have ended leave the engine."""
        written = {}
        for handle, tokens in drawn.items():
            key, text = self._rows[handle]
            before = text.tokens
            pieces = []
            for token in tokens.ids:
                if text.ended:
                    break
                pieces.append(text.add([token]))
            taken = text.tokens - before
            kept = (getattr(tokens, field.name) for field in dataclasses.fields(tokens))
            written[key] = Written(pieces, Drawn(*(None if values is None else values[:taken] for values in kept)),
                                   text.tokens, text.finish_reason)
            if text.ended:
                self.cancel(key)
        return written
