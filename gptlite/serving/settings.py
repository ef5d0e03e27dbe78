"""How the server batches and what it allows (`ServeSettings`).

Nothing here imports Keras."""

import dataclasses

from gptlite.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class ServeSettings:
    """How the server batches and what it allows."""

    batch_window_ms: float = 10.0  # how long the first request of a batch waits for others
    max_batch: int = 8  # rows decoded together at most
    max_queue: int = 64  # requests waiting at most; beyond it, 503
    max_tokens_limit: int = 1024  # the most `max_tokens` a request may ask for
    max_n: int = 8  # the most choices per prompt
    api_key: str = None  # given: every API call needs `Authorization: Bearer <api_key>`
    truncate: str = "left"  # a prompt longer than the context: "left" cuts it as generate does, "none" refuses it

    def __post_init__(self):
        for name in ("max_batch", "max_queue", "max_tokens_limit", "max_n"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be a positive whole number, got {value!r}")
        if not (isinstance(self.batch_window_ms, (int, float)) and 0 <= self.batch_window_ms <= 10_000):
            raise ConfigError(f"batch_window_ms must be from 0 to 10000, got {self.batch_window_ms!r}")
        if self.truncate not in ("left", "none"):
            raise ConfigError(f"truncate must be 'left' or 'none', got {self.truncate!r}")
