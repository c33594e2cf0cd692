"""Circuit breakers and rate-limit back-off, one per route key: (provider, upstream model,
account). `account` is the account's identity (its environment variable) on a provider whose
`api_key_envs` spreads keys over several accounts, "" otherwise. One model's failures never
block another model of the same provider.

What counts as a failure of the upstream (`counts_as_failure`): 5xx answers, timeouts
(connect, first byte, idle, answer; HTTP 408 and 504), refused or dropped connections,
malformed or broken answers and streams (an error event, a body cut before its end), and
401/403 (the gateway's own key for that account is refused: every request on it fails alike).
Never counted: 429 (back-pressure, below), 4xx caused by the request (400, 404, 413, 422:
`retryable` False; the upstream answered, which counts as a success), a full local engine
queue (load, not health), a local engine still loading, and a client that went away.

States of a breaker: closed -> open on `failures` consecutive failures, or an error rate of
`error_rate` over the last `window` outcomes (outcomes are kept from a key's first failure on).
While open, its route is skipped, except one probe request at a time, at most one per
`cooldown_s` (half_open while that probe is out). Any success closes it; a failure keeps it
open for another `cooldown_s`. When every route of a model is open the pipeline tries them
anyway (panic mode), so a single-route model recovers with its upstream's first answer.

A 429 sets a back-off on its key for the upstream's Retry-After (`rate_limit_backoff_s`
without one, at most `max_backoff_s`): the route is skipped until then, nothing else changes.

Transitions are logged: a warning when a breaker opens (key, counts, last error), info when it
closes. The hot path is one dict lookup per route (`check`), plus the clock only where a key
has a breaker or a back-off.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Literal

import structlog

from gateway.config.routing import BreakerSettings
from providers import errors as perr

log = structlog.get_logger("gateway.breaker")

State = Literal["closed", "open", "half_open"]
Key = tuple[str, str, str]  # (provider, upstream model, account identity or "")

# What `Breakers.check` says of a key.
ALLOW = 0
OPEN = 1  # its breaker is open (a probe is out, or the next one is not due)
BACKOFF = 2  # the upstream asked for a pause (429)
EXHAUSTED = 3  # every account of the route was tried by this request already


def counts_as_failure(exc: perr.ProviderError) -> bool:
    """Whether `exc` counts toward opening its route's breaker (see the module)."""
    if isinstance(exc, perr.UpstreamRateLimited | perr.Overloaded | perr.EngineLoading):
        return False
    return exc.retryable


def describe_error(exc: perr.ProviderError) -> str:
    """The one-line error a breaker keeps as its last (for logs and /readyz)."""
    status = f" (HTTP {exc.upstream_status})" if exc.upstream_status else ""
    return f"{exc.code}{status}: {exc.message}"


class Breaker:
    """One key's breaker (see the module for its states)."""

    __slots__ = (
        "_settings",
        "_clock",
        "_outcomes",
        "consecutive",
        "opened_at",
        "_probe_due",
        "_probing",
        "times_opened",
        "last_error",
    )

    def __init__(self, settings: BreakerSettings, clock: Callable[[], float]) -> None:
        self._settings = settings
        self._clock = clock
        self._outcomes: deque[bool] = deque(maxlen=settings.window)  # True: failed
        self.consecutive = 0
        self.opened_at: float | None = None
        self._probe_due = 0.0  # while open: when the next probe may go
        self._probing = False
        self.times_opened = 0
        self.last_error = ""

    @property
    def state(self) -> State:
        if self.opened_at is None:
            return "closed"
        return "half_open" if self._probing else "open"

    @property
    def failed_in_window(self) -> int:
        return sum(self._outcomes)

    @property
    def window_size(self) -> int:
        return len(self._outcomes)

    def probe_in_s(self) -> float:
        """Seconds until the next probe may go (0 when closed)."""
        if self.opened_at is None:
            return 0.0
        return max(0.0, self._probe_due - self._clock())

    def allow(self) -> bool:
        """Whether a request may take this route now (while open: as its probe)."""
        if self.opened_at is None:
            return True
        if self._probing:
            return False
        now = self._clock()
        if now < self._probe_due:
            return False
        self._probing = True
        return True

    def success(self) -> bool:
        """Record a success; True when it closed the breaker."""
        self._outcomes.append(False)
        self.consecutive = 0
        if self.opened_at is None:
            return False
        self.opened_at = None
        self._probing = False
        return True

    def failure(self, error: str) -> bool:
        """Record a failure; True when it opened the breaker."""
        self._outcomes.append(True)
        self.consecutive += 1
        self.last_error = error
        s = self._settings
        if self.opened_at is not None:  # still failing: the next probe after a cooldown
            self._probing = False
            self._probe_due = self._clock() + s.cooldown_s
            return False
        full = len(self._outcomes) == s.window
        if self.consecutive >= s.failures or (
            full and sum(self._outcomes) >= s.error_rate * s.window
        ):
            now = self._clock()
            self.opened_at = now
            self._probe_due = now + s.cooldown_s
            self._probing = False
            self.times_opened += 1
            return True
        return False

    def release(self) -> None:
        """A request that took the route ended without a verdict on the upstream (the client
        left, the engine was busy): a probe it carried may be sent again."""
        self._probing = False


class Breakers:
    """The breakers and back-offs of every route key, created on a key's first failure or
    429 (at most `settings.max_tracked`; healthy ones are forgotten first), and what was last
    seen of each provider (for /readyz and /metrics)."""

    def __init__(
        self, settings: BreakerSettings, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._settings = settings
        self._clock = clock
        self._breakers: dict[Key, Breaker] = {}
        self._backoff: dict[Key, float] = {}  # key -> until (clock)
        self._last_success: dict[str, float] = {}  # provider -> when
        self._last_error: dict[str, tuple[float, str]] = {}  # provider -> (when, error)
        # Providers with several accounts: their identities, in their configured order.
        self.accounts: dict[str, tuple[str, ...]] = {}

    @property
    def settings(self) -> BreakerSettings:
        return self._settings

    def check(self, key: Key) -> int:
        """ALLOW, OPEN or BACKOFF for a request about to take `key`'s route (ALLOW on an open
        breaker makes the request its probe: report its outcome)."""
        if self._backoff:
            until = self._backoff.get(key)
            if until is not None:
                if self._clock() < until:
                    return BACKOFF
                del self._backoff[key]
        breaker = self._breakers.get(key)
        if breaker is None or breaker.allow():
            return ALLOW
        return OPEN

    def success(self, key: Key) -> None:
        self._last_success[key[0]] = self._clock()
        breaker = self._breakers.get(key)
        if breaker is None:
            return
        opened_at = breaker.opened_at
        if breaker.success() and opened_at is not None:
            log.info(
                "breaker_closed",
                provider=key[0],
                model=key[1],
                account=key[2],
                open_s=round(self._clock() - opened_at, 3),
            )

    def failure(self, key: Key, error: str) -> None:
        now = self._clock()
        self._last_error[key[0]] = (now, error)
        breaker = self._breakers.get(key)
        if breaker is None:
            self._make_room()
            breaker = self._breakers[key] = Breaker(self._settings, self._clock)
        if breaker.failure(error):
            log.warning(
                "breaker_opened",
                provider=key[0],
                model=key[1],
                account=key[2],
                consecutive_failures=breaker.consecutive,
                window_failures=breaker.failed_in_window,
                window=breaker.window_size,
                times_opened=breaker.times_opened,
                last_error=error,
                probe_every_s=self._settings.cooldown_s,
            )

    def rate_limited(self, key: Key, retry_after_s: float | None, error: str) -> None:
        """A 429 on `key`: skip its route for `retry_after_s` (the upstream's Retry-After)."""
        s = self._settings
        wait = s.rate_limit_backoff_s if retry_after_s is None else retry_after_s
        wait = min(wait, s.max_backoff_s)
        now = self._clock()
        self._last_error[key[0]] = (now, error)
        if wait > 0:
            if key not in self._backoff and len(self._backoff) >= s.max_tracked:
                self._expire_backoffs(now)
            if key in self._backoff or len(self._backoff) < s.max_tracked:
                self._backoff[key] = now + wait

    def release(self, key: Key) -> None:
        breaker = self._breakers.get(key)
        if breaker is not None:
            breaker.release()

    def wait_s(self, keys: Iterable[Key]) -> float:
        """The shortest time until one of `keys` may be tried again (probe or back-off end)."""
        now = self._clock()
        waits = []
        for key in keys:
            until = self._backoff.get(key)
            if until is not None and until > now:
                waits.append(until - now)
            breaker = self._breakers.get(key)
            if breaker is not None and breaker.opened_at is not None:
                waits.append(breaker.probe_in_s())
        return min(waits, default=0.0)

    def is_failing(self, provider: str, model: str) -> bool:
        """Whether the route (provider, model) is known to be failing: its breaker is open
        (on a provider of several accounts: every account's)."""
        accounts = self.accounts.get(provider, ("",))
        for account in accounts:
            breaker = self._breakers.get((provider, model, account))
            if breaker is None or breaker.opened_at is None:
                return False
        return True

    def items(self) -> Iterator[tuple[Key, Breaker]]:
        return iter(list(self._breakers.items()))

    def backoffs(self) -> dict[Key, float]:
        """Keys in back-off now, and the seconds left."""
        now = self._clock()
        return {k: until - now for k, until in self._backoff.items() if until > now}

    def last_success_age_s(self, provider: str) -> float | None:
        when = self._last_success.get(provider)
        return None if when is None else self._clock() - when

    def last_error(self, provider: str) -> tuple[float, str] | None:
        """(seconds ago, error) of the provider's last failure or 429, if any."""
        seen = self._last_error.get(provider)
        return None if seen is None else (self._clock() - seen[0], seen[1])

    def _make_room(self) -> None:
        """Keep at most `max_tracked` breakers: forget closed ones first, then the oldest."""
        if len(self._breakers) < self._settings.max_tracked:
            return
        for key, breaker in list(self._breakers.items()):
            if breaker.opened_at is None:
                del self._breakers[key]
                return
        del self._breakers[next(iter(self._breakers))]

    def _expire_backoffs(self, now: float) -> None:
        for key, until in list(self._backoff.items()):
            if until <= now:
                del self._backoff[key]
