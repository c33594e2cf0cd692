"""A settable clock for the limiter tests, and a start time 10 s into a minute."""

from __future__ import annotations

from datetime import UTC, datetime

START = datetime(2026, 11, 29, 12, 0, 10, tzinfo=UTC).timestamp()  # 10 s into a minute


class Clock:
    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> float:
        return self.now
