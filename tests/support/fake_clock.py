"""A fake monotonic clock for retry and backoff tests."""

from __future__ import annotations

__all__ = ["Clock"]


class Clock:
    """A fake monotonic clock that moves only when the code under test sleeps."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds
