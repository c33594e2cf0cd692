"""A live gateway for the Messages API tests: the real app in front of the mock OpenAI-compatible
upstream, model-id patterns and a thinking-signing secret set, one user key; the official
anthropic SDK as client."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import anthropic
import pytest
from redis.asyncio import Redis

from gateway.keys.records import KeyCreate
from gateway.keys.store import KeySpace, KeyStore
from testkit.gateway_app import (
    REDIS_URL,
    Gateway,
    RawResponse,
    gateway_settings,
    start_gateway,
)
from testkit.mock_upstream import MockUpstream
from tests.support.messages_rules import MessagesStream, check_messages_stream

USER = [{"role": "user", "content": "hello there world"}]
LOOKUP = {
    "name": "lookup",
    "description": "Look something up",
    "input_schema": {"type": "object", "properties": {"query": {"type": "string"}}},
}


@pytest.fixture
async def gw(mock_upstream: MockUpstream, redis_prefix: str) -> AsyncIterator[MessagesGateway]:
    mock = {
        "kind": "openai",
        "base_url": mock_upstream.base_url,
        "idle_timeout_s": 5,
        "direct_models": ["*"],
    }
    settings = gateway_settings(
        mock_upstream,
        redis_prefix,
        server={"host": "127.0.0.1", "port": 0, "max_body_bytes": 64 * 1024, "keepalive_s": 0.05},
        providers={"mock": mock, "history": {**mock, "send_reasoning_history": True}},
        models={
            "echo-model": {"routes": [{"provider": "mock", "model": "echo"}]},
            "reasoner-model": {"routes": [{"provider": "mock", "model": "echo", "thinking": True}]},
            "thinker": {"routes": [{"provider": "history", "model": "reasoning-content"}]},
            "tools-model": {"routes": [{"provider": "mock", "model": "tools"}]},
            "stall-model": {"routes": [{"provider": "mock", "model": "stall"}]},
        },
        model_patterns={"claude-*haiku*": "echo-model", "claude-*": "reasoner-model"},
        messages={"signing_secret": "test-signing-secret"},
    )
    runner, root = await start_gateway(settings)
    redis = Redis.from_url(REDIS_URL)
    secret, _ = await KeyStore(redis, prefix=redis_prefix).create(KeyCreate(name="tests"))
    await redis.aclose()
    gateway = MessagesGateway(root, secret, mock_upstream, runner.app, redis_prefix, 64 * 1024)
    try:
        yield gateway
    finally:
        for made in gateway.clients:
            await made.close()
        await runner.cleanup()


@dataclass
class MessagesGateway(Gateway):
    clients: list[anthropic.AsyncAnthropic] = field(default_factory=list)

    def client(self, **kw: Any) -> anthropic.AsyncAnthropic:
        """An anthropic SDK client of this gateway, closed with the fixture."""
        kw.setdefault("max_retries", 0)
        made = anthropic.AsyncAnthropic(
            base_url=self.root, api_key=kw.pop("api_key", self.key), **kw
        )
        self.clients.append(made)
        return made


async def post(
    gw: MessagesGateway, body: bytes, headers: dict[str, str] | None = None
) -> RawResponse:
    hdrs = {"x-api-key": gw.key} if headers is None else headers
    return await gw.post_bytes(body, path="/v1/messages", headers=hdrs)


async def raw_stream(
    gw: MessagesGateway, body: dict[str, Any], path: str = "/v1/messages"
) -> MessagesStream:
    resp = await gw.post_bytes(
        json.dumps({**body, "stream": True}).encode(), path=path, headers={"x-api-key": gw.key}
    )
    assert resp.status == 200, resp.body
    assert resp.headers["Content-Type"].startswith("text/event-stream")
    return check_messages_stream(resp.body)


async def usage_records(gw: MessagesGateway) -> list[dict[bytes, bytes]]:
    """The usage log entries of the gateway's Redis prefix, once every request is settled."""
    await gw.settled()
    redis = Redis.from_url(REDIS_URL)
    entries = [fields for _, fields in await redis.xrange(KeySpace(gw.prefix).usage_log())]
    await redis.aclose()
    return entries
