"""Errors raised for user mistakes, and the checks of a setting's value that raise them.

The command-line tools turn any `GPTLiteError` into a one-line message and exit
status 2; anything else is a bug and keeps its traceback.
"""


class GPTLiteError(Exception):
    """Base class for every error gptlite raises on purpose."""


class ConfigError(GPTLiteError, ValueError):
    """A hyperparameter or option has a value that cannot work; `setting` names it, where one does."""

    def __init__(self, message, setting=None):
        super().__init__(message)
        self.setting = setting


class InputError(GPTLiteError, ValueError):
    """Text, a prompt or a model file that gptlite cannot use."""


class TooLargeError(InputError):
    """What was asked would hold more at once than gptlite holds: a trace past its size."""


class MissingFileError(GPTLiteError, FileNotFoundError):
    """A file the user named does not exist."""


class RunExistsError(GPTLiteError, FileExistsError):
    """The output folder already holds a trained model."""


class TrainingDiverged(GPTLiteError, ArithmeticError):
    """The training loss became NaN or infinite."""


class TrainingInterrupted(GPTLiteError):
    """Training stopped on request (Ctrl-C or SIGTERM) after saving a checkpoint."""

    def __init__(self, message, signal_number):
        super().__init__(message)
        self.signal_number = signal_number


def first_line(error, limit=200):
    """An exception's message as one line, cut at a word if long."""
    lines = str(error).strip().splitlines() or [type(error).__name__]
    line = lines[0]
    return line if len(line) <= limit else line[:limit].rsplit(" ", 1)[0] + " ..."


# Checking a setting's value, for the settings' dataclasses (GPTConfig, TrainingConfig).
def is_count(value):
    """Whether `value` is a whole number of at least 1 (True is not)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def is_fraction(value):
    """Whether `value` is a number in [0, 1): a dropout rate, or the share of a running mean kept each step."""
    return 0 <= value < 1


def require(name, value, is_valid, description):
    """Raise a ConfigError naming the setting unless `is_valid(value)`; `description` says what it must be."""
    try:
        valid = is_valid(value)
    except TypeError:  # a value of the wrong type altogether
        valid = False
    if not valid:
        raise ConfigError(f"{name} must be {description}, got {value!r}")


def divisors_near(width, heads):
    """The one or two divisors of `width` nearest `heads`, as "2 or 4": what to suggest for a count that does not
    divide it."""
    divisors = [d for d in range(1, width + 1) if width % d == 0]
    closest = sorted(divisors, key=lambda d: (abs(d - heads), d))[:2]
    return " or ".join(str(d) for d in sorted(closest))


def one_of(names):
    """`names` as "one of 'a', 'b'", for a setting's description."""
    return "one of " + ", ".join(repr(name) for name in names)
