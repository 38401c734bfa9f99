"""A clock the tests move by hand: stores and the relay age their cache by it, so expiry is
tested without waiting for time to pass."""

from __future__ import annotations


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now
