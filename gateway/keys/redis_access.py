"""`RedisAccessControl`: the AccessControl contract on Redis (keys, limits, usage)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

import structlog
from redis.asyncio import Redis

from gateway.access.contract import Grant, Outcome, Principal, Ticket
from gateway.errors import AuthenticationError
from gateway.keys.keeper import TRANSIENT, Keeper
from gateway.keys.limiter import REFUSED, Admission, Limiter, Settlement
from gateway.keys.script_batch import Unsent
from gateway.keys.spool import Spool
from gateway.keys.store import SECRET_PREFIX, KeyStore, Retired, digest, micros
from gateway.keys.usage import usage_entry
from gateway.routing.policy import DEFAULT_POLICY
from gateway.usage_store.pricing import Pricing
from plumbing.busy_wait import BusyWait

log = structlog.get_logger("gateway.access.contract")
_FREE = (0.0, 0.0)


class RedisAccessControl:
    """Authenticates by secret digest, admits and settles with one Lua script each.

    `authenticate` keeps what it learnt about a digest for `auth_cache_s` seconds, so a request
    costs two Redis round trips (admit, settle), not three. That is safe because admission
    re-checks the key as it is in Redis on every request: a key revoked, rotated, disabled,
    expired or restricted on any replica is refused by the very next admission everywhere.
    (Only endpoints without admission, such as the model list, may see a cached answer.)

    A request's concurrency slot and reservation are a lease of `slot_lease_s`, renewed while
    it runs (see `Keeper`): a replica that dies mid-request, or loses Redis, holds them for at
    most that long. Settlements Redis does not take are spooled under `spool_dir` and retried.
    `busy`: the process's `BusyWait`, which waits for the scripts' replies. `clock` (epoch
    seconds) is injectable for tests; replicas sharing Redis are assumed to have synchronized
    clocks.
    """

    def __init__(
        self,
        redis: Redis,
        *,
        prefix: str,
        usage_stream_maxlen: int,
        slot_lease_s: float = 15.0,
        spool_dir: Path = Path(".data/spool"),
        timeout_s: float = 5.0,
        auth_cache_s: float = 2.0,
        auth_cache_size: int = 10_000,
        busy: BusyWait | None = None,
        clock: Callable[[], float] = time.time,
        pricing: Pricing | None = None,
    ) -> None:
        self._pricing = pricing
        self.store = KeyStore(redis, prefix=prefix, clock=clock)
        self._limiter = Limiter(
            redis,
            self.store.space,
            usage_stream_maxlen=usage_stream_maxlen,
            slot_lease_s=slot_lease_s,
            timeout_s=timeout_s,
            busy=busy,
            clock=clock,
        )
        self.keeper = Keeper(self._limiter, Spool(spool_dir))
        self._clock = clock
        self._cache: dict[str, tuple[float, Principal]] = {}
        self._lookups: dict[str, asyncio.Future[Principal]] = {}
        self._cache_s = auth_cache_s
        self._cache_size = auth_cache_size
        self._token_costs: dict[tuple[str, tuple[tuple[str, str], ...]], tuple[float, float]] = {}

    async def start(self) -> None:
        """Adopt and begin replaying settlements a previous run left in the spool."""
        await self.keeper.start()

    async def aclose(self, *, grace_s: float = 5.0) -> None:
        """After the last settlement: try to land what is pending for up to `grace_s` (what
        is left stays spooled for the next start), then close the connection."""
        await self.keeper.settle_all(grace_s)
        await self.keeper.aclose()
        await self._limiter.aclose()

    async def authenticate(self, token: str | None) -> Principal:
        if not token:
            raise AuthenticationError(
                "No API key provided; send it as 'Authorization: Bearer sk-...'."
            )
        hexdigest = digest(token)
        now = time.monotonic()
        cached = self._cache.get(hexdigest)
        if cached is not None and cached[0] > now:
            return cached[1]
        if not token.startswith(SECRET_PREFIX):
            raise AuthenticationError("Incorrect API key provided.")
        # Concurrent misses for one digest share one lookup (no stampede when an entry expires).
        pending = self._lookups.get(hexdigest)
        if pending is None:
            pending = asyncio.ensure_future(self._principal(token, hexdigest))
            self._lookups[hexdigest] = pending
            pending.add_done_callback(partial(self._forget_lookup, hexdigest))
        return await asyncio.shield(pending)

    def _forget_lookup(self, hexdigest: str, done: asyncio.Future[Principal]) -> None:
        self._lookups.pop(hexdigest, None)
        if not done.cancelled():
            done.exception()  # retrieved here too, in case every waiter went away

    async def _principal(self, token: str, hexdigest: str) -> Principal:
        record = await self.store.lookup(token)
        if record is None:
            retired = await self.store.retired(token)  # only on the way to a 401
            if retired is None:
                raise AuthenticationError("Incorrect API key provided.")
            raise AuthenticationError(retired_message(retired))
        if record.disabled:
            raise AuthenticationError("This API key is disabled.")
        if record.is_expired(datetime.fromtimestamp(self._clock(), UTC)):
            raise AuthenticationError("This API key has expired.")
        models = None if record.models is None else frozenset(record.models)
        policy = DEFAULT_POLICY if record.policy is None else record.policy.policy()
        principal = Principal(record.id, record.name, models, hexdigest, policy)
        if len(self._cache) >= self._cache_size:
            self._cache.clear()
        self._cache[hexdigest] = (time.monotonic() + self._cache_s, principal)
        return principal

    def admit(self, ticket: Ticket) -> asyncio.Future[Grant]:
        """The admission script is sent at once; the future holds the grant (or raises the
        refusal or Redis's failure). No task is made for it: it is on every request's path."""
        principal = ticket.principal
        now = self._clock()
        token = self._limiter.token(now)
        return self._limiter.admit(
            token,
            now,
            principal.key_id,
            principal.credential,
            ticket.model,
            ticket.prompt_tokens,
            ticket.max_tokens,
            partial(self._granted, ticket, token),
            at_once=not self.keeper.holding,  # no other request under way: nothing to batch
            token_cost=self._token_cost(ticket),
        )

    def _token_cost(self, ticket: Ticket) -> tuple[float, float]:
        """The worst-case cost of a prompt and of an output token, in millionths of the
        currency (numerically the price per million tokens); cached per model and routes."""
        if self._pricing is None:
            return _FREE
        wanted = (ticket.model, ticket.routes)
        found = self._token_costs.get(wanted)
        if found is None:
            if len(self._token_costs) >= self._cache_size:
                self._token_costs.clear()
            found = self._token_costs[wanted] = self._pricing.worst(*wanted)
        return found

    def _granted(self, ticket: Ticket, token: str, admission: Admission | BaseException) -> Grant:
        key_id = ticket.principal.key_id
        if isinstance(admission, BaseException):
            if isinstance(admission, TRANSIENT) and not isinstance(admission, Unsent):
                self.keeper.abandon(token, key_id)  # it may have run, or may run later
            raise admission
        self.keeper.hold(token, key_id)
        return Grant(
            ticket=ticket,
            max_tokens=admission.max_tokens,
            reserved_tokens=admission.reserved_tokens,
            headers=admission.headers,
            token=admission.token,
            reserved_cost=admission.reserved_cost,
        )

    def settle(self, grant: Grant, outcome: Outcome) -> asyncio.Future[None]:
        """Settle now (the script is sent at once), or spool and retry until Redis takes it
        (never charged twice); the future is done when Redis or the spool has it."""
        cost = self._cost(grant, outcome)
        settlement = Settlement(
            key_id=grant.ticket.principal.key_id,
            token=grant.token,
            reserved=grant.reserved_tokens,
            used=outcome.usage.total_tokens,
            entry=usage_entry(grant, outcome, self._clock(), cost),
            reserved_cost=grant.reserved_cost,
            used_cost=micros(cost),
        )
        self.keeper.drop(grant.token)
        return self._send(settlement)

    def refused(self, ticket: Ticket, outcome: Outcome) -> asyncio.Future[None]:
        """Record a request refused at admission (429) in usage, as a settlement is (spooled
        while Redis is away, recorded once): no tokens, its status and error code."""
        now = self._clock()
        refusal = Grant(ticket=ticket, max_tokens=ticket.max_tokens, reserved_tokens=0)
        return self._send(
            Settlement(
                key_id=ticket.principal.key_id,
                token=self._limiter.token(now),
                reserved=REFUSED,
                used=0,
                entry=usage_entry(refusal, outcome, now),
            )
        )

    def _send(self, settlement: Settlement) -> asyncio.Future[None]:
        landing = self._limiter.settle(settlement, at_once=not self.keeper.holding)
        done: asyncio.Future[None] = landing.get_loop().create_future()
        landing.add_done_callback(partial(self._landed, settlement, done))
        return done

    def _cost(self, grant: Grant, outcome: Outcome) -> float:
        if self._pricing is None:
            return 0.0
        usage = outcome.usage
        return self._pricing.cost(
            grant.ticket.model,
            outcome.provider,
            outcome.route_model,
            usage.prompt_tokens,
            usage.cached_prompt_tokens,
            usage.completion_tokens,
        )

    def _landed(
        self, settlement: Settlement, done: asyncio.Future[None], landing: asyncio.Future[int]
    ) -> None:
        if landing.cancelled():
            done.cancel()
        elif (exc := landing.exception()) is None:
            done.set_result(None)
        elif isinstance(exc, TRANSIENT):
            log.warning(
                "settlement_deferred",
                error=str(exc),
                request_id=settlement.entry.record.get("request_id"),
            )
            spooled = asyncio.ensure_future(self.keeper.defer(settlement))
            spooled.add_done_callback(partial(_chain, done))
        else:
            done.set_exception(exc)


def retired_message(retired: Retired) -> str:
    when = retired.at.strftime("%Y-%m-%d %H:%M UTC")
    if retired.why == "rotated":
        return f"This API key was rotated on {when}: use the new secret it was given then."
    return f"This API key was revoked on {when}."


def _chain(done: asyncio.Future[None], step: asyncio.Future[None]) -> None:
    """`done` ends as `step` did."""
    if step.cancelled():
        done.cancel()
    elif (exc := step.exception()) is None:
        done.set_result(None)
    else:
        done.set_exception(exc)
