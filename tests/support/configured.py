"""A live gateway with settings of a test's own (the `gateway` fixture's, with overrides) and
one user key created with the limits the test asks for."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from redis.asyncio import Redis

from gateway.keys.records import KeyCreate
from gateway.keys.store import KeyStore
from testkit.gateway_app import REDIS_URL, Gateway, gateway_settings, start_gateway
from testkit.mock_upstream import MockUpstream


@asynccontextmanager
async def configured_gateway(
    mock: MockUpstream, prefix: str, *, key: dict[str, Any] | None = None, **overrides: Any
) -> AsyncIterator[Gateway]:
    settings = gateway_settings(mock, prefix, **overrides)
    runner, root = await start_gateway(settings)
    try:
        redis = Redis.from_url(REDIS_URL)
        try:
            create = KeyCreate(name="tests", **(key or {}))
            secret, _ = await KeyStore(redis, prefix=prefix).create(create)
        finally:
            await redis.aclose()
        yield Gateway(root, secret, mock, runner.app, prefix, settings.server.max_body_bytes)
    finally:
        await runner.cleanup()
