"""The sampling settings (`SamplingConfig`): each one a field, declared once with its default, its check, its help
and the limit an HTTP request holds it to. The command line's flags (`cli.flags.add_sampling_flags`) and the
server's request fields (`serving.parsing`) are made from these fields, so a new setting is one field here and
its use in the sampler.

Plain Python: the commands build their flags from it before they choose a backend.
"""

import dataclasses
import math
import re

import numpy as np

from gptlite import setting as declaring
from gptlite.errors import ConfigError
from gptlite.text.continuation import stop_strings

# Log-probabilities of this many likeliest tokens come with each token when asked for (OpenAI's most).
TOP_LOGPROBS = 5
# The most new tokens a page (the exported one, the served one) writes in one go: its decoding loop keeps every
# token's attention to show.
MOST_NEW_TOKENS = 4096
# The largest whole number a browser's numbers hold exactly: a page's bound on a seed.
MOST_EXACT_INTEGER = 2**53 - 1


def setting(default, help, metavar=None, request=None, limits=None, most=None, bounds=None):
    """A SamplingConfig field, declared as every setting is (`gptlite.setting.setting`: its `default`, the `help`
    its flag shows, the `metavar` that names the flag's value), with what only a sampling setting has: the name
    an HTTP request gives it (`request`: the setting's own unless given); the `limits` (low or None, high) a
    request may ask within, where they are narrower than the library's; the `most` strings a request may give; a
    number's `bounds` (low, high, whether low itself is refused), None for none, as `__post_init__` checks them
    (the tests hold the two alike): what the web page's settings are checked against."""
    return declaring.setting(default, help, metavar=metavar, request=request, limits=limits, most=most,
                             bounds=bounds)


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
    """How a row's new tokens are chosen, checked when made; the library, the command line and the server
    share these defaults.

    temperature 0 takes the likeliest token; otherwise logits are divided by
    it, then only the `top_k` likeliest tokens are kept (None: all), of
    those the smallest set whose probability reaches `top_p` (the nucleus),
    and of those the ones at least `min_p` times as likely as the likeliest.
    `repetition_penalty` above 1 makes tokens already in the context less
    likely (a positive logit is divided by it, a negative one multiplied, as
    in the CTRL paper). `seed` makes the text repeatable (None: different
    each time); `stop` strings end the text just before the first of them.
    """

    # The server's own limit on max_tokens is a serving setting (`ServeSettings.max_tokens_limit`).
    max_new_tokens: int = setting(200, "tokens to write (default: 200)", "N", request="max_tokens",
                                  bounds=(0, None, False))
    temperature: float = setting(1.0, "below 1 is safer, above 1 wilder; 0 always takes the likeliest token "
                                      "(default: 1)", limits=(None, 2.0), bounds=(0, None, False))  # OpenAI's limit
    top_k: int = setting(None, "sample only among the K likeliest tokens (default: all)", "K",
                         limits=(None, 2**31 - 1), bounds=(1, None, False))  # as the sampler's tensors hold it
    top_p: float = setting(1.0, "sample only among the likeliest tokens whose probabilities add up to P (nucleus "
                                "sampling; default: 1, off)", "P", bounds=(0, 1, True))
    min_p: float = setting(0.0, "sample only among tokens at least P times as likely as the likeliest (default: 0, "
                                "off)", "P", bounds=(0, 1, False))
    repetition_penalty: float = setting(1.0, "above 1, make tokens already in the context less likely (default: 1, "
                                             "off)", "R", limits=(None, 100.0), bounds=(0, None, True))
    seed: int = setting(None, "make the samples repeatable (default: different each time)",
                        limits=(-2**63, 2**63 - 1), bounds=(None, None, False))  # OpenAI's
    stop: tuple = setting((), "end the text just before STRING appears (may be given more than once)", "STRING",
                          most=4)  # OpenAI's

    def __post_init__(self):
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, (int, np.integer)) \
                or self.max_new_tokens < 0:
            raise ConfigError(f"max_new_tokens must be zero or a positive whole number, got {self.max_new_tokens!r}",
                              "max_new_tokens")
        if not (_is_finite_number(self.temperature) and self.temperature >= 0):
            raise ConfigError(f"temperature must be 0 (greedy) or positive, got {self.temperature!r}", "temperature")
        if self.top_k is not None and (isinstance(self.top_k, bool) or not isinstance(self.top_k, (int, np.integer))
                                       or self.top_k < 1):
            raise ConfigError(f"top_k must be a whole number of at least 1, got {self.top_k!r}", "top_k")
        if not (_is_number(self.top_p) and 0 < self.top_p <= 1):
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p!r}", "top_p")
        if not (_is_number(self.min_p) and 0 <= self.min_p <= 1):
            raise ConfigError(f"min_p must be in [0, 1], got {self.min_p!r}", "min_p")
        if not (_is_finite_number(self.repetition_penalty) and self.repetition_penalty > 0):
            raise ConfigError(f"repetition_penalty must be a positive number (1 is none), got "
                              f"{self.repetition_penalty!r}", "repetition_penalty")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, (int, np.integer))):
            raise ConfigError(f"seed must be a whole number or None, got {self.seed!r}", "seed")
        object.__setattr__(self, "stop", tuple(stop_strings(self.stop)))

    def replace(self, **changes):
        """A copy with `changes`, checked; a name that is no setting raises a ConfigError."""
        unknown = sorted(set(changes) - set(SAMPLING_SETTINGS))
        if unknown:
            raise ConfigError(f"unknown sampling setting {unknown[0]!r}; the settings are "
                              f"{', '.join(SAMPLING_SETTINGS)}")
        return dataclasses.replace(self, **changes)

    def for_rows(self, count):
        """`count` copies of this config, one for each row that shares it: the first row's seed is `seed` (None:
        a random one), the others' are made from it, so that no two rows draw the same noise."""
        seed = int(np.random.default_rng().integers(2**31)) if self.seed is None else int(self.seed) % 2**31
        seeds = [seed] + [(seed * 1_000_003 + index) % 2**31 for index in range(1, count)]
        return [dataclasses.replace(self, seed=row_seed) for row_seed in seeds]


# Every sampling setting, by its field: what the doors (flags, requests) are made from.
SAMPLING_FIELDS = {field.name: field for field in dataclasses.fields(SamplingConfig)}
SAMPLING_SETTINGS = tuple(SAMPLING_FIELDS)


def is_whole_number_setting(name):
    """Whether a sampling setting takes a whole number (top_k, seed, max_new_tokens)."""
    return SAMPLING_FIELDS[name].type is int


def _is_number(value):
    return isinstance(value, (int, float, np.floating, np.integer)) and not isinstance(value, bool)


def _is_finite_number(value):
    try:
        return _is_number(value) and math.isfinite(value)
    except OverflowError:  # a whole number too large for a float
        return False


def sampling_settings(**defaults):
    """The sampling settings a page offers (the exported page, the served one, a trace's view in Jupyter), in
    SamplingConfig's order, each made from its field: its name, help, default (or `defaults`'), whether it is a
    whole number, its bounds (the library's, narrowed by what a server's request may ask and by what a page can
    hold: MOST_NEW_TOKENS, MOST_EXACT_INTEGER) and a sentence saying them. A setting a page has no box for (a
    list of stop strings) is left out."""
    offered = []
    for name, field in SAMPLING_FIELDS.items():
        if field.metadata["bounds"] is None:
            continue
        least, most, least_refused = field.metadata["bounds"]
        whole = is_whole_number_setting(name)
        request_least, request_most = field.metadata["limits"] or (None, None)
        least = _tighter(max, least, request_least, -MOST_EXACT_INTEGER if whole else None)
        most = _tighter(min, most, request_most, MOST_EXACT_INTEGER if whole else None,
                        MOST_NEW_TOKENS if name == "max_new_tokens" else None)
        # What an empty box means, where the default is none: the help's "(default: ...)".
        empty = re.search(r"\(default: ([^)]*)\)", field.metadata["help"]) if field.default is None else None
        offered.append(dict(name=name, request=field.metadata["request"] or name, help=field.metadata["help"],
                            default=defaults.get(name, field.default), whole=whole, least=least,
                            least_refused=least_refused, most=most, empty=empty and empty[1],
                            says=_bounds_said(whole, least, least_refused, most, field.default)))
    return offered


def _tighter(pick, *bounds):
    given = [bound for bound in bounds if bound is not None]
    return pick(given) if given else None


def _bounds_said(whole, least, least_refused, most, default):
    """A setting's bounds in words: "a number above 0 and at most 1", "a whole number from 1 to 4096, or empty"."""
    kind = "a whole number" if whole else "a number"
    if least is not None and most is not None and not least_refused:
        said = f"{kind} from {_number(least)} to {_number(most)}"
    else:
        parts = [f"{'above' if least_refused else 'at least'} {_number(least)}" if least is not None else None,
                 f"at most {_number(most)}" if most is not None else None]
        said = " and ".join([kind + " " + parts[0]] + parts[1:] if parts[0] else [kind] + parts[1:]) \
            if any(parts) else kind
    return said + (", or empty" if default is None else "")


def _number(value):
    return f"{int(value):,}" if float(value).is_integer() else f"{value:g}"
