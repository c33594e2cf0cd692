"""Client-chosen model names are bounded: `provider/model` is routed only
where the provider's `direct_models` allows it, and metrics and usage count models under
configured names, so inventing names grows neither `/metrics` nor the usage counters."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import openai
import pytest
from redis.asyncio import Redis

from gateway.keys.records import KeyCreate
from gateway.keys.store import KeyStore
from testkit.gateway_app import REDIS_URL, Gateway, gateway_settings, start_gateway
from testkit.mock_upstream import MockUpstream

USER = [{"role": "user", "content": "hi there"}]


@pytest.fixture
async def bounded(mock_upstream: MockUpstream, redis_prefix: str) -> AsyncIterator[Gateway]:
    settings = gateway_settings(mock_upstream, redis_prefix)
    providers: dict[str, Any] = {name: p.model_dump() for name, p in settings.providers.items()}
    providers["mock"]["direct_models"] = ("echo-chunks-*", "tools")
    providers["impatient"]["direct_models"] = ()
    settings = gateway_settings(mock_upstream, redis_prefix, providers=providers)
    runner, root = await start_gateway(settings)
    redis = Redis.from_url(REDIS_URL)
    secret, _ = await KeyStore(redis, prefix=redis_prefix).create(KeyCreate(name="t"))
    await redis.aclose()
    try:
        yield Gateway(root, secret, mock_upstream, runner.app, redis_prefix, 64 * 1024)
    finally:
        await runner.cleanup()


async def test_direct_addressing_only_where_the_provider_allows_it(bounded: Gateway) -> None:
    for model in ("mock/echo-chunks-3", "mock/tools"):
        resp = await bounded.post_raw({"model": model, "messages": USER})
        assert resp.status == 200, (model, resp.body)
    for model in ("mock/fail-500", "mock/echo", "impatient/echo", "nobody/echo", "mock/"):
        resp = await bounded.post_raw({"model": model, "messages": USER})
        assert resp.status == 404, (model, resp.body)
        assert b"model_not_found" in resp.body


async def test_a_model_that_can_be_asked_for_can_be_retrieved(bounded: Gateway) -> None:
    """GET /v1/models/{id} agrees with what requests may name (direct ids are not listed)."""
    client = bounded.async_client()
    card = await client.models.retrieve("mock/echo-chunks-3")
    assert (card.id, card.owned_by) == ("mock/echo-chunks-3", "mock")
    assert (await client.models.retrieve("echo-model")).id == "echo-model"
    for model in ("mock/echo", "nobody/echo", "invented"):
        with pytest.raises(openai.NotFoundError):
            await client.models.retrieve(model)
    listed = {m.id async for m in client.models.list()}
    assert "echo-model" in listed and not any("/" in m for m in listed)


async def test_invented_names_add_no_metric_series_or_usage_fields(
    bounded: Gateway, redis: Redis
) -> None:
    async def metrics() -> str:
        async with aiohttp.ClientSession() as session, session.get(f"{bounded.root}/metrics") as r:
            return await r.text()

    client = bounded.async_client()
    await client.chat.completions.create(model="echo-model", messages=USER)
    await client.chat.completions.create(model="mock/echo-chunks-1", messages=USER)
    await bounded.settled()
    before = len(await metrics())
    for i in range(2, 60):
        await client.chat.completions.create(model=f"mock/echo-chunks-{i}", messages=USER)
    for i in range(60):
        resp = await bounded.post_raw({"model": f"invented-{i}", "messages": USER})
        assert resp.status == 404
    await bounded.settled()
    text = await metrics()
    assert len(text) - before < 200  # counts grew; no series did
    assert 'model="mock/echo-chunks-*"' in text and 'model="echo-model"' in text
    assert "echo-chunks-7" not in text and "invented" not in text
    fields: set[str] = set()
    async for key in redis.scan_iter(match=f"{bounded.prefix}usage:*"):
        if await redis.type(key) == b"hash":
            fields |= {f.decode().split("|", 2)[2] for f in await redis.hkeys(key)}
    assert fields == {"echo-model", "mock/echo-chunks-*"}
