"""What keeps a process's Redis state right in the background: leases, releases, retries.

- Live requests' slots are leases; the keeper renews every one of them in one call per third of
  a lease, so a process that dies or loses Redis holds capacity for at most one lease.
- An admission the gateway gave up on (no answer in time, connection lost) is released as soon
  as Redis answers again, whether it ran, runs later or never arrived.
- A settlement Redis did not take is appended to the spool (on disk) and retried with backoff
  until it lands; being idempotent, a retry of one that did land changes nothing. Spooled
  settlements of a previous run are adopted and replayed at start.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import defaultdict
from collections.abc import Awaitable

import structlog
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from gateway.keys.limiter import Limiter, Settlement
from gateway.keys.spool import Spool

log = structlog.get_logger("gateway.keeper")

# Errors after which a call's effect in Redis is unknown or absent; worth another try.
TRANSIENT = (RedisConnectionError, RedisTimeoutError, OSError)


class Keeper:
    def __init__(
        self,
        limiter: Limiter,
        spool: Spool,
        *,
        backoff_s: tuple[float, float] = (0.1, 2.0),
    ) -> None:
        self._limiter = limiter
        self._spool = spool
        self._renew_every_s = limiter.lease_ms / 3000
        self._backoff = backoff_s
        self._live: dict[str, str] = {}  # request token -> key id
        self._releases: dict[str, str] = {}  # request token -> key id
        self._pending: dict[str, Settlement] = {}  # request token -> settlement
        self._wake = asyncio.Event()
        self._failing = False  # the last pass failed: wait out the backoff, not every arrival
        self._task: asyncio.Task[None] | None = None

    @property
    def holding(self) -> int:
        """Requests admitted and not yet settled."""
        return len(self._live)

    @property
    def pending(self) -> int:
        """Releases and settlements waiting for Redis."""
        return len(self._releases) + len(self._pending)

    async def start(self) -> None:
        """Adopt the spooled settlements of processes that are gone, then begin."""
        for settlement in await self._spool.adopt():
            self._pending[settlement.token] = settlement
        self._ensure_running()

    def hold(self, token: str, key_id: str) -> None:
        """A request was admitted: keep its lease renewed until `drop`."""
        self._live[token] = key_id
        self._ensure_running()

    def drop(self, token: str) -> None:
        self._live.pop(token, None)

    def abandon(self, token: str, key_id: str) -> None:
        """The gateway gave up on this admission: release it once Redis answers."""
        self._releases[token] = key_id
        self._ensure_running()
        if not self._failing:
            self._wake.set()

    async def defer(self, settlement: Settlement) -> None:
        """Keep a settlement Redis did not take: on disk first, then retried until it lands."""
        self._pending[settlement.token] = settlement
        self._ensure_running()
        try:
            await self._spool.append([settlement])
        finally:
            if not self._failing:
                self._wake.set()

    async def settle_all(self, within_s: float) -> None:
        """Try to land everything pending for up to `within_s` (shutdown); what is left stays
        in the spool for the next start."""
        loop = asyncio.get_running_loop()
        end = loop.time() + within_s
        delay = self._backoff[0]
        while self.pending and loop.time() < end:
            if not await self._catch_up():
                await asyncio.sleep(min(delay, max(end - loop.time(), 0)))
                delay = min(delay * 2, self._backoff[1])

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self.pending:
            log.warning("left_for_next_start", settlements=len(self._pending))
        self._spool.close()

    def _ensure_running(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        delay = self._backoff[0]
        renewed_at = time.monotonic()
        while True:
            try:
                delay, renewed_at = await self._step(delay, renewed_at)
            except Exception:  # a bug here must not end the leases of every live request
                log.exception("keeper_failed")
                await asyncio.sleep(self._backoff[1])

    async def _step(self, delay: float, renewed_at: float) -> tuple[float, float]:
        if self.pending:
            ok = await self._catch_up()
            self._failing = not ok
            delay = self._backoff[0] if ok else min(delay * 2, self._backoff[1])
            wait = 0.0 if ok and self.pending else delay
        else:
            wait = max(renewed_at + self._renew_every_s - time.monotonic(), 0)
        self._wake.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), wait)
        if time.monotonic() >= renewed_at + self._renew_every_s:
            renewed_at = time.monotonic()
            await self._renew()
        return delay, renewed_at

    async def _renew(self) -> None:
        live: dict[str, list[str]] = defaultdict(list)
        for token, key_id in self._live.items():
            live[key_id].append(token)
        try:
            await self._limiter.renew(live)
        except RedisError as exc:
            log.warning("lease_renewal_failed", error=str(exc), live=len(self._live))

    async def _catch_up(self) -> bool:
        """One pass over pending releases and settlements, sent together; True when every one
        was answered."""
        releases = list(self._releases.items())
        settlements = list(self._pending.values())
        calls: list[Awaitable[object]] = [
            self._limiter.release(key_id, token) for token, key_id in releases
        ]
        calls += [self._limiter.settle(s) for s in settlements]
        results = await asyncio.gather(*calls, return_exceptions=True)
        ok = True
        for (token, _), result in zip(releases, results, strict=False):
            if isinstance(result, TRANSIENT):
                ok = False
            else:
                self._releases.pop(token, None)
                if isinstance(result, BaseException):
                    log.error("release_failed", error=str(result))
        for settlement, result in zip(settlements, results[len(releases) :], strict=True):
            if isinstance(result, TRANSIENT):
                ok = False
                continue
            self._pending.pop(settlement.token, None)
            if isinstance(result, BaseException):
                log.error("settlement_dropped", token=settlement.token, error=str(result))
            else:
                log.info("settlement_replayed", token=settlement.token, charged=result)
        if settlements and not self._pending:
            await self._spool.clear()
        return ok
