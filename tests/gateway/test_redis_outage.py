"""Redis going away under a running gateway: clear 503s, no hang, back to normal once it is back
(over TCP with a password, and over the unix socket the embedded server uses)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import aiohttp
import pytest
from redis.asyncio import Redis

from gateway.keys.records import KeyCreate
from gateway.keys.store import KeyStore
from testkit.gateway_app import PrivateRedis, gateway_settings, start_gateway
from testkit.mock_upstream import MockUpstream

PREFIX = "gw:"


@asynccontextmanager
async def gateway_on(mock: MockUpstream, url: str) -> AsyncIterator[tuple[str, str]]:
    """A keyed gateway on the Redis at `url`: (root, user key)."""
    settings = gateway_settings(mock, PREFIX)
    redis_settings = settings.redis.model_copy(update={"url": url, "timeout_s": 1.0})
    runner, root = await start_gateway(settings.model_copy(update={"redis": redis_settings}))
    client = Redis.from_url(url)
    secret, _ = await KeyStore(client, prefix=PREFIX).create(KeyCreate(name="outage"))
    await client.aclose()
    try:
        yield root, secret
    finally:
        await runner.cleanup()


async def chat(root: str, key: str) -> tuple[int, dict[str, object]]:
    body = {"model": "echo-model", "messages": [{"role": "user", "content": "hi"}]}
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"{root}/v1/chat/completions",
            json=body,
            headers={"Authorization": f"Bearer {key}"},
            timeout=aiohttp.ClientTimeout(total=10),
        ) as resp,
    ):
        return resp.status, await resp.json()


@pytest.mark.parametrize(
    "url",
    [
        lambda r: r.url(),
        lambda r: f"unix://{r.socket}?password={r.password}",
    ],
    ids=["tcp", "unix socket"],
)
async def test_requests_get_503_while_redis_is_down_and_succeed_once_it_is_back(
    mock_upstream: MockUpstream,
    private_redis: PrivateRedis,
    url: Callable[[PrivateRedis], str],
) -> None:
    async with gateway_on(mock_upstream, url(private_redis)) as (root, key):
        assert (await chat(root, key))[0] == 200
        private_redis.stop()
        for _ in range(2):  # the connection is found dead, then a new one is refused
            status, body = await asyncio.wait_for(chat(root, key), timeout=8)
            assert status == 503, body
            assert body["error"]["code"] == "state_store_unavailable"  # type: ignore[index]
        private_redis.start()  # the append-only file brings the key back
        assert (await chat(root, key))[0] == 200
