"""What a console POST hands to the GET page it redirects to (post/redirect/get), in Redis.

Every change answers 303 to a GET page, so a reload never repeats it. What that page must show
once travels server-side, bound to the session and taken (read and deleted at once) by the
page that shows it:
  - a new or rotated key's secret (`put_secret`/`take_secret`): shown once; a reload finds
    nothing (the page then says the secret cannot be shown again). It is kept in Redis for at
    most `ttl_s` (never written to the URL, a log or the browser's history);
  - a one-time message for the next page (`put_flash`/`take_flash`): a notice, or a refused
    form's error and its values, shown again for correction.
"""

from __future__ import annotations

import json
from typing import Any

from redis.asyncio import Redis

TTL_S = 300


class Handoff:
    def __init__(self, redis: Redis, prefix: str, ttl_s: int = TTL_S) -> None:
        self._redis = redis
        self._prefix = f"{prefix}console:handoff:"
        self.ttl_s = ttl_s

    async def put_secret(self, session: str, key_id: str, secret: str) -> None:
        await self._redis.set(f"{self._prefix}{session}:secret:{key_id}", secret, ex=self.ttl_s)

    async def take_secret(self, session: str, key_id: str) -> str | None:
        raw = await self._redis.getdel(f"{self._prefix}{session}:secret:{key_id}")
        return None if raw is None else raw.decode() if isinstance(raw, bytes) else str(raw)

    async def put_flash(self, session: str, **message: Any) -> None:
        await self._redis.set(f"{self._prefix}{session}:flash", json.dumps(message), ex=self.ttl_s)

    async def take_flash(self, session: str) -> dict[str, Any]:
        raw = await self._redis.getdel(f"{self._prefix}{session}:flash")
        return {} if raw is None else dict(json.loads(raw))
