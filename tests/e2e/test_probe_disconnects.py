"""Many clients leaving mid-stream at once, on every protocol, from the local engine and from an
upstream: afterwards the key holds no slot or reservation, the engine no running request or KV
block, every request has its usage record (a 499), and the next requests are served."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis

from gateway.config.providers import ModelSettings, ProviderSettings
from gateway.keys.store import KeySpace, text
from testkit.gateway_app import REDIS_URL
from testkit.mock_upstream import MockUpstream
from testkit.rawhttp import request_bytes
from tests.support.local_engine import wait_idle
from tests.support.local_gateway import LocalGateway, local_settings
from tests.support.probed import Probed, clear_prefix, probed_gateway

ASK = "alpha beta gamma delta"
PROTOCOLS: dict[str, tuple[str, dict[str, Any]]] = {
    "chat": ("/v1/chat/completions", {"messages": [{"role": "user", "content": ASK}]}),
    "completions": ("/v1/completions", {"prompt": ASK}),
    "responses": ("/v1/responses", {"input": ASK, "max_output_tokens": 1000}),
    "messages": ("/v1/messages", {"messages": [{"role": "user", "content": ASK}]}),
}
MODELS = ("deepseek-chat", "slow-upstream")  # the local engine, and a slow mock answer


@pytest.fixture
async def gw(tiny_checkpoint: Path, mock_upstream: MockUpstream) -> AsyncIterator[Probed]:
    prefix = f"test:{uuid.uuid4().hex}:"
    settings = local_settings(prefix, tiny_checkpoint)
    mock = ProviderSettings(kind="openai", base_url=mock_upstream.base_url)
    slow = ModelSettings(routes=[{"provider": "mock", "model": "echo-chunks-400-gap-0.02"}])
    providers = {**settings.providers, "mock": mock}
    models = {**settings.models, "slow-upstream": slow}
    settings = settings.model_copy(update={"providers": providers, "models": models})
    try:
        async with probed_gateway(settings, mock_upstream, max_concurrency=16) as gateway:
            yield gateway
    finally:
        await clear_prefix(prefix)


async def leave_after_first_frame(gw: Probed, path: str, body: dict[str, Any]) -> bytes:
    """Stream `body`, read until the first event arrives, then reset the connection."""
    raw = json.dumps(body).encode()
    headers = {**gw.auth_headers(), "Content-Type": "application/json"}
    headers["Content-Length"] = str(len(raw))
    port = int(gw.root.rsplit(":", 1)[1])
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    seen = b""
    try:
        writer.write(request_bytes("POST", path, headers, raw))
        async with asyncio.timeout(60):
            while b"data:" not in seen:
                chunk = await reader.read(4096)
                assert chunk, seen
                seen += chunk
    finally:
        writer.transport.abort()
    return seen


async def records(gw: Probed) -> list[dict[str, str]]:
    redis = Redis.from_url(REDIS_URL)
    try:
        entries = await redis.xrange(KeySpace(gw.prefix).usage_log())
        return [{text(k): text(v) for k, v in fields.items()} for _, fields in entries]
    finally:
        await redis.aclose()


async def test_clients_leaving_mid_stream_everywhere_leave_nothing_behind(gw: Probed) -> None:
    calls = [
        leave_after_first_frame(
            gw, path, {**body, "model": model, "stream": True, "max_tokens": 1000}
        )
        for model in MODELS
        for path, body in PROTOCOLS.values()
        for _ in range(2)
    ]
    seen = await asyncio.gather(*calls)
    assert all(b" 200 " in answer.split(b"\r\n", 1)[0] for answer in seen)
    await wait_idle(LocalGateway(gw.root, gw.key, gw.app, gw.prefix))
    await gw.settled()
    recorded = await records(gw)
    assert len(recorded) == len(calls)
    assert {(r["status"], r["error_code"]) for r in recorded} == {("499", "client_disconnected")}
    assert await gw.held() == (0, 0)
    client = gw.async_client()
    for model in MODELS:  # the capacity is there again
        answer = await client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": ASK}], max_tokens=3
        )
        assert answer.choices[0].finish_reason in ("length", "stop")
