"""`RedisAccessControl`: the AccessControl contract on Redis (keys, limits, usage)."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime

from redis.asyncio import Redis

from gateway.access import Grant, Outcome, Principal, Ticket
from gateway.errors import AuthenticationError
from gateway.keys.limiter import Limiter
from gateway.keys.store import SECRET_PREFIX, KeyStore
from gateway.keys.usage import usage_entry


class RedisAccessControl:
    """Authenticates by secret digest, admits and settles with one Lua script each.

    `slot_ttl_s` bounds how long a request may hold its concurrency slot and reservation; a
    replica that dies mid-request leaks them for at most that long. `clock` (epoch seconds) is
    injectable for tests; replicas sharing Redis are assumed to have synchronized clocks.
    """

    def __init__(
        self,
        redis: Redis,
        *,
        prefix: str,
        usage_stream_maxlen: int,
        slot_ttl_s: float = 1800.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = KeyStore(redis, prefix=prefix, clock=clock)
        self._limiter = Limiter(
            redis,
            self.store.space,
            usage_stream_maxlen=usage_stream_maxlen,
            slot_ttl_s=slot_ttl_s,
            clock=clock,
        )
        self._clock = clock

    async def authenticate(self, token: str | None) -> Principal:
        if not token:
            raise AuthenticationError(
                "No API key provided; send it as 'Authorization: Bearer sk-...'."
            )
        record = await self.store.lookup(token) if token.startswith(SECRET_PREFIX) else None
        if record is None:
            raise AuthenticationError("Incorrect API key provided.")
        if record.disabled:
            raise AuthenticationError("This API key is disabled.")
        if record.is_expired(datetime.fromtimestamp(self._clock(), UTC)):
            raise AuthenticationError("This API key has expired.")
        models = None if record.models is None else frozenset(record.models)
        return Principal(key_id=record.id, name=record.name, models=models)

    async def admit(self, ticket: Ticket) -> Grant:
        admission = await self._limiter.admit(
            ticket.principal.key_id, ticket.prompt_tokens, ticket.max_tokens
        )
        return Grant(
            ticket=ticket,
            max_tokens=admission.max_tokens,
            reserved_tokens=admission.reserved_tokens,
            headers=admission.headers,
            token=admission.token,
        )

    async def settle(self, grant: Grant, outcome: Outcome) -> None:
        entry = usage_entry(grant, outcome, self._clock())
        await self._limiter.settle(
            grant.ticket.principal.key_id,
            grant.token,
            grant.reserved_tokens,
            outcome.usage.total_tokens,
            entry,
        )
