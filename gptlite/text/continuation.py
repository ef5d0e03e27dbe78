"""A row's continuation as text: token ids turned back into whole characters
(`TextBuilder`), stop strings, and the text a row may show so far
(`Continuation`)."""

from gptlite.errors import ConfigError

class TextBuilder:
    """One row's text, built token by token.

    A byte-level token may carry only part of a character's UTF-8 bytes;
    decoded alone it gives U+FFFD. So tokens wait, up to the four bytes one
    character can take, until together they decode to whole characters.
    """

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.waiting = []

    def add(self, token):
        """Add a token id; return the text it completes ("" while waiting)."""
        self.waiting.append(int(token))
        piece = self.tokenizer.decode_after(self.waiting)
        if piece.endswith("\ufffd") and len(self.waiting) < 4:
            return ""
        self.waiting = []
        return piece

    def hold(self, token):
        """Add a token id to decode later, with `finish`."""
        self.waiting.append(int(token))

    def finish(self):
        """The rest of the text: any tokens still waiting, decoded as they are."""
        rest = self.tokenizer.decode_after(self.waiting) if self.waiting else ""
        self.waiting = []
        return rest


def stop_strings(stop):
    """`stop` (a string, a list of them, or None) as a checked list."""
    try:
        stops = [stop] if isinstance(stop, str) else list(stop or ())
    except TypeError:  # not a collection: a number, say
        stops = [stop]
    if any(not isinstance(s, str) or not s for s in stops):
        raise ConfigError(f"stop strings must be non-empty text, got {stop!r}", "stop")
    return stops


def first_stop(text, stops):
    """Where the first stop string in `text` begins, or None."""
    found = [index for index in (text.find(s) for s in stops) if index >= 0]
    return min(found) if found else None


class Continuation:
    """One row's new text, token by token, ended by the tokenizer's end token or a stop string.

    `add` returns the text that is certain: text that could be the start of
    a stop string is held back until it is clear whether it is. Unless
    `streaming`, text is wanted only whole: without stop strings to look
    for, tokens are then decoded once, at the end.
    """

    def __init__(self, tokenizer, stops, streaming=True):
        self.builder = TextBuilder(tokenizer)
        self.end_token = tokenizer.end_token_id
        self.stops = stops
        self.decode_at_end = not streaming and not stops
        self.held = ""
        self.ended = False
        self.stopped = False  # ended by the end token or a stop string, not by running out of tokens

    def add(self, token):
        if self.ended:
            return ""
        if token == self.end_token:
            self.stopped = True
            return self.finish()
        if self.decode_at_end:
            self.builder.hold(token)
            return ""
        if not self.stops:
            return self.builder.add(token)  # nothing to hold back
        self.held += self.builder.add(token)
        return self._release(final=False)

    def finish(self):
        """The rest of the text, at the end of decoding or at the end token."""
        if self.ended:
            return ""
        self.held += self.builder.finish()
        return self._release(final=True)

    def _release(self, final):
        end = first_stop(self.held, self.stops) if self.stops else None
        if end is not None or final:
            self.ended = True
            self.stopped = self.stopped or end is not None
            released, self.held = self.held[:end], ""
            return released
        keep = max((k for s in self.stops for k in range(1, min(len(s), len(self.held) + 1))
                    if self.held.endswith(s[:k])), default=0)
        released, self.held = self.held[:len(self.held) - keep], self.held[len(self.held) - keep:]
        return released
