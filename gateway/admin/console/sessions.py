"""Console sessions and sign-in rate limits, kept in Redis under the key prefix.

A session is a random token in an HttpOnly cookie; Redis holds only its SHA-256 (so a dump of
Redis cannot be replayed as a cookie), with the session's CSRF token and a fingerprint of the
admin key it signed in with: changing the admin key ends every session. Sessions expire after
`ttl_s` and end at sign-out (`revoke`) or all at once (`revoke_all`).
"""

from __future__ import annotations

import hashlib
import hmac
import math
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

from redis.asyncio import Redis

from gateway.keys.store import text

TOKEN_BYTES = 32


def _sha(value: str) -> str:
    return hashlib.sha256(value.encode("utf-8", "surrogateescape")).hexdigest()


@dataclass(frozen=True)
class Session:
    token_hash: str
    csrf: str
    created_s: float


class SessionStore:
    def __init__(self, redis: Redis, prefix: str, admin_key: str, ttl_s: int) -> None:
        self._redis = redis
        self._prefix = f"{prefix}console:"
        self._fingerprint = _sha(f"console-session:{admin_key}")
        self.ttl_s = ttl_s

    def _key(self, token_hash: str) -> str:
        return f"{self._prefix}session:{token_hash}"

    def _index(self) -> str:
        return f"{self._prefix}sessions"

    async def create(self) -> tuple[str, Session]:
        """A new session: (the cookie's token, the session)."""
        token = secrets.token_urlsafe(TOKEN_BYTES)
        session = Session(_sha(token), secrets.token_urlsafe(TOKEN_BYTES), time.time())
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hset(
                self._key(session.token_hash),
                mapping={
                    "csrf": session.csrf,
                    "created": str(session.created_s),
                    "admin": self._fingerprint,
                },
            )
            pipe.expire(self._key(session.token_hash), self.ttl_s)
            pipe.sadd(self._index(), session.token_hash)
            pipe.expire(self._index(), self.ttl_s)
            await pipe.execute()
        return token, session

    async def get(self, token: str | None) -> Session | None:
        """The live session of a cookie's token, or None."""
        if not token or len(token) > 128:
            return None
        token_hash = _sha(token)
        found = await self._redis.hgetall(self._key(token_hash))
        if not found:
            return None
        data = {text(k): text(v) for k, v in found.items()}
        if not hmac.compare_digest(data.get("admin", ""), self._fingerprint):
            await self.revoke(token)
            return None
        return Session(token_hash, data["csrf"], float(data["created"]))

    async def revoke(self, token: str) -> None:
        token_hash = _sha(token)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.delete(self._key(token_hash))
            pipe.srem(self._index(), token_hash)
            await pipe.execute()

    async def revoke_all(self) -> int:
        """End every console session; how many there were."""
        hashes = [text(h) for h in await self._redis.smembers(self._index())]
        async with self._redis.pipeline(transaction=True) as pipe:
            for token_hash in hashes:
                pipe.delete(self._key(token_hash))
            pipe.delete(self._index())
            done = await pipe.execute()
        return sum(int(n) for n in done[:-1])


# A sliding window per client: the moments (ms) of its accepted attempts in the last window.
# KEYS[1]: the client's sorted set; ARGV: now (ms), limit, window (ms), a unique member.
# Returns {1, 0} when allowed (and counted), else {0, ms until the oldest attempt leaves}.
_SLIDING_WINDOW = """
local now, limit, window = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
if redis.call('ZCARD', KEYS[1]) >= limit then
  local oldest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  return {0, tonumber(oldest[2]) + window - now}
end
redis.call('ZADD', KEYS[1], now, ARGV[4])
redis.call('PEXPIRE', KEYS[1], window)
return {1, 0}
"""
WINDOW_S = 60


class LoginLimiter:
    """At most `per_minute` sign-in attempts per client address in any 60 seconds (a sliding
    window, so no burst passes around a clock minute's edge). Refused attempts are not
    counted. `clock` (epoch seconds) is injectable for tests."""

    def __init__(
        self,
        redis: Redis,
        prefix: str,
        per_minute: int,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._prefix = f"{prefix}console:login:"
        self._script = redis.register_script(_SLIDING_WINDOW)
        self._clock = clock
        self.per_minute = per_minute

    async def allow(self, client: str) -> tuple[bool, int]:
        """(allowed, seconds until an attempt is allowed again: 0 when allowed)."""
        now_ms = int(self._clock() * 1000)
        allowed, wait_ms = await self._script(
            keys=[f"{self._prefix}{_sha(client)[:32]}"],
            args=[now_ms, self.per_minute, WINDOW_S * 1000, f"{now_ms}:{secrets.token_hex(4)}"],
        )
        return bool(allowed), max(1, math.ceil(int(wait_ms) / 1000)) if not allowed else 0
