"""A fake monotonic clock for code that takes ``clock=``: tests move time, they never sleep."""

from __future__ import annotations


class FakeClock:
    """Callable like ``time.monotonic``; ``advance`` (or setting ``now``) moves it."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        """Move the clock forward by ``seconds`` and return the new time."""
        self.now += seconds
        return self.now
