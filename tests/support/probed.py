"""A live gateway (the real app on a free port, the shared Redis under the test's prefix) with one
key that has limits, so that the slots and reservations it holds are tracked in Redis: what the
probe tests check after every fault (one usage record per request, nothing held)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from redis.asyncio import Redis

from gateway.config.settings import Settings
from gateway.keys.records import KeyCreate
from gateway.keys.store import KeySpace, KeyStore, text
from testkit.gateway_app import REDIS_URL, Gateway, start_gateway
from testkit.mock_upstream import MockUpstream


@dataclass
class Probed(Gateway):
    key_id: str = ""

    async def held(self) -> tuple[int, int]:
        """(slots, reserved tokens) the key holds now."""
        space = KeySpace(self.prefix)
        redis = Redis.from_url(REDIS_URL)
        try:
            slots = await redis.zcard(space.slots(self.key_id))
            tokens = int(await redis.hget(space.held(self.key_id), "_sum") or 0)
            return slots, tokens
        finally:
            await redis.aclose()

    async def statuses(self) -> list[str]:
        """The status of every usage record, oldest first."""
        redis = Redis.from_url(REDIS_URL)
        try:
            entries = await redis.xrange(KeySpace(self.prefix).usage_log())
            return [text(fields[b"status"]) for _, fields in entries]
        finally:
            await redis.aclose()

    async def outcomes(self) -> list[str]:
        """Every usage record's status, and its error code where it has one ("200
        upstream_unavailable": a stream that failed after its 200), oldest first."""
        redis = Redis.from_url(REDIS_URL)
        try:
            entries = await redis.xrange(KeySpace(self.prefix).usage_log())
            return [
                " ".join(filter(None, (text(f[b"status"]), text(f.get(b"error_code", b"")))))
                for _, f in entries
            ]
        finally:
            await redis.aclose()


async def clear_prefix(prefix: str) -> None:
    """Remove every key under `prefix` from the shared Redis."""
    client = Redis.from_url(REDIS_URL)
    keys = [k async for k in client.scan_iter(match=f"{prefix}*", count=1000)]
    if keys:
        await client.delete(*keys)
    await client.aclose()


@asynccontextmanager
async def probed_gateway(
    settings: Settings, mock: MockUpstream, max_concurrency: int = 8
) -> AsyncIterator[Probed]:
    """The gateway for `settings` (made with `gateway_settings`), with a key allowed
    `max_concurrency` concurrent requests and a large TPM."""
    prefix = settings.redis.key_prefix
    runner, root = await start_gateway(settings)
    redis = Redis.from_url(REDIS_URL)
    limits = KeyCreate(name="probe", max_concurrency=max_concurrency, tpm=10**9)
    secret, record = await KeyStore(redis, prefix=prefix).create(limits)
    await redis.aclose()
    try:
        yield Probed(
            root, secret, mock, runner.app, prefix, settings.server.max_body_bytes, record.id
        )
    finally:
        await runner.cleanup()
