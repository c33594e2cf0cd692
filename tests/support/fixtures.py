"""Fixtures every test may use: a live gateway over the mock upstream on the real Redis under a
unique key prefix, that Redis and its prefix, a private redis-server, and a count of script
writes."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis

from gateway.keys import script_channel
from gateway.keys.records import KeyCreate
from gateway.keys.store import KeyStore
from testkit.gateway_app import REDIS_URL, Gateway, PrivateRedis, gateway_settings, start_gateway
from testkit.mock_upstream import MockUpstream


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    server = PrivateRedis(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
async def redis() -> AsyncIterator[Redis]:
    """A client of the real Redis (shared with other users: touch only your own prefix)."""
    client = Redis.from_url(REDIS_URL)
    yield client
    await client.aclose()


@pytest.fixture
async def redis_prefix() -> AsyncIterator[str]:
    prefix = f"test:{uuid.uuid4().hex}:"
    yield prefix
    client = Redis.from_url(REDIS_URL)
    keys = [k async for k in client.scan_iter(match=f"{prefix}*", count=1000)]
    if keys:
        await client.delete(*keys)
    await client.aclose()


@pytest.fixture
async def gateway(mock_upstream: MockUpstream, redis_prefix: str) -> AsyncIterator[Gateway]:
    settings = gateway_settings(mock_upstream, redis_prefix)
    runner, root = await start_gateway(settings)
    redis = Redis.from_url(REDIS_URL)
    secret, _ = await KeyStore(redis, prefix=redis_prefix).create(KeyCreate(name="tests"))
    await redis.aclose()
    try:
        yield Gateway(
            root, secret, mock_upstream, runner.app, redis_prefix, settings.server.max_body_bytes
        )
    finally:
        await runner.cleanup()


@pytest.fixture
def script_writes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many script calls each write to Redis carried (`_Channel.send`), in order; a test
    clears it after its set-up calls."""
    writes: list[int] = []
    send = script_channel.Channel.send

    def counting(channel: Any, calls: Any) -> None:
        writes.append(len(calls))
        send(channel, calls)

    monkeypatch.setattr(script_channel.Channel, "send", counting)
    return writes
