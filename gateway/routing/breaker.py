"""A circuit breaker per provider: failing providers are skipped at once, not waited on.

closed -> open: `failures` consecutive failures, or an error rate of at least `error_rate` over
the last `window` calls. open -> half-open: after `cooldown_s`. half-open: one probe request is
let through (another one only if the probe is still unanswered a cooldown later); its success
closes the breaker, its failure opens it again for another cooldown.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Literal

from gateway.config.routing import BreakerSettings

State = Literal["closed", "open", "half_open"]


class Breaker:
    def __init__(self, settings: BreakerSettings, clock: Callable[[], float]) -> None:
        self._settings = settings
        self._clock = clock
        self._outcomes: deque[bool] = deque(maxlen=settings.window)  # True: failed
        self._consecutive = 0
        self._opened_at: float | None = None
        self._probe_at: float | None = None
        self.times_opened = 0

    @property
    def state(self) -> State:
        if self._opened_at is None:
            return "closed"
        if self._clock() - self._opened_at >= self._settings.cooldown_s:
            return "half_open"
        return "open"

    def retry_after_s(self) -> float:
        if self._opened_at is None:
            return 0.0
        return max(0.0, self._opened_at + self._settings.cooldown_s - self._clock())

    def allow(self) -> bool:
        """Whether a request may go to this provider now (in half-open: the probe)."""
        state = self.state
        if state == "closed":
            return True
        if state == "open":
            return False
        now = self._clock()
        if self._probe_at is not None and now - self._probe_at < self._settings.cooldown_s:
            return False
        self._probe_at = now
        return True

    def success(self) -> None:
        self._outcomes.append(False)
        self._consecutive = 0
        self._opened_at = self._probe_at = None

    def failure(self) -> None:
        self._outcomes.append(True)
        self._consecutive += 1
        if self._opened_at is not None:  # the probe failed: another cooldown
            self._open()
            return
        s = self._settings
        full = len(self._outcomes) == s.window
        if self._consecutive >= s.failures or (
            full and sum(self._outcomes) >= s.error_rate * s.window
        ):
            self._open()

    def _open(self) -> None:
        self._opened_at = self._clock()
        self._probe_at = None
        self._outcomes.clear()
        self.times_opened += 1


class Breakers:
    """One breaker per provider name (those not listed are never skipped)."""

    def __init__(
        self,
        names: Iterable[str],
        settings: BreakerSettings,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._breakers = {name: Breaker(settings, clock) for name in names}

    def get(self, name: str) -> Breaker | None:
        return self._breakers.get(name)

    def allow(self, name: str) -> bool:
        breaker = self._breakers.get(name)
        return breaker is None or breaker.allow()

    def success(self, name: str) -> None:
        if (breaker := self._breakers.get(name)) is not None:
            breaker.success()

    def failure(self, name: str) -> None:
        if (breaker := self._breakers.get(name)) is not None:
            breaker.failure()

    def states(self) -> dict[str, State]:
        return {name: b.state for name, b in self._breakers.items()}

    def times_opened(self) -> dict[str, int]:
        return {name: b.times_opened for name, b in self._breakers.items()}

    def retry_after_s(self, names: Iterable[str]) -> float:
        waits = [b.retry_after_s() for n in names if (b := self._breakers.get(n)) is not None]
        return min(waits, default=0.0)
