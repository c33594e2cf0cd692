"""Routing with the local engine through the real app: a key's reasoning budget enforced by the
engine, a key with thinking off, and overflow to an upstream when the local queue is full (never
for a key limited to the local engine), unless the engine caches the conversation's prefix.
Tiny random-weight checkpoint, real Redis, mock upstream."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
import pytest_asyncio
from redis.asyncio import Redis

from gateway.config.settings import Settings
from gateway.keys.records import KeyCreate
from gateway.keys.store import KeySpace, KeyStore
from gateway.resources import PIPELINE, ROUTER
from providers.local.provider import LocalProvider
from testkit.gateway_app import REDIS_URL, start_gateway
from testkit.mock_upstream import MockUpstream
from tests.support.local_gateway import local_settings
from tests.support.routing import EASY, fields, until

pytestmark = pytest.mark.asyncio(loop_scope="module")


class LocalRouted:
    def __init__(self, root: str, app: Any, prefix: str, mock: MockUpstream) -> None:
        self.root, self.app, self.prefix, self.mock = root, app, prefix, mock
        self.clients: list[openai.AsyncOpenAI] = []

    @property
    def provider(self) -> LocalProvider:
        provider = self.app[ROUTER].providers["local"].local  # the loaded engine's
        assert isinstance(provider, LocalProvider)
        return provider

    async def client(self, **policy: Any) -> openai.AsyncOpenAI:
        redis = Redis.from_url(REDIS_URL)
        try:
            body = KeyCreate(name="e2e-routing", policy=policy or None)
            secret, _ = await KeyStore(redis, prefix=self.prefix).create(body)
        finally:
            await redis.aclose()
        client = openai.AsyncOpenAI(base_url=f"{self.root}/v1", api_key=secret, max_retries=0)
        self.clients.append(client)
        return client


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def routed(tiny_checkpoint: Path) -> AsyncIterator[LocalRouted]:
    mock = MockUpstream()
    await mock.start()
    prefix = f"test:{uuid.uuid4().hex}:"
    base = local_settings(prefix, tiny_checkpoint, max_num_seqs=1).model_dump()
    base["providers"]["mock"] = {"kind": "openai", "base_url": mock.base_url}
    base["models"]["auto-local"] = {
        "routing": "auto",
        "routes": [
            {"provider": "local", "model": "deepseek-v3.1"},
            {"provider": "mock", "model": "echo"},
        ],
    }
    # one request running fills the queue allowance; beyond it, 64 cached tokens keep one more
    base["routing"] = {"local_max_queue": 0, "prefix": {"wait_cost_tokens": 64, "max_queue": 1}}
    runner, root = await start_gateway(Settings(**base))
    gateway = LocalRouted(root, runner.app, prefix, mock)
    try:
        yield gateway
    finally:
        for client in gateway.clients:
            await client.close()
        await runner.cleanup()
        await mock.stop()
        redis = Redis.from_url(REDIS_URL)
        keys = [k async for k in redis.scan_iter(match=f"{prefix}*", count=1000)]
        if keys:
            await redis.delete(*keys)
        await redis.aclose()


async def test_a_reasoning_budget_is_exact_and_an_answer_follows(routed: LocalRouted) -> None:
    client = await routed.client(max_reasoning_tokens=5)
    raw = await client.chat.completions.with_raw_response.create(
        model="deepseek-reasoner",
        messages=[{"role": "user", "content": "Think about the sea."}],
        max_tokens=16,
        temperature=0,
    )
    answer = raw.parse()
    assert answer.usage is not None and answer.usage.completion_tokens_details is not None
    assert answer.usage.completion_tokens_details.reasoning_tokens == 5
    assert answer.usage.completion_tokens == 16  # the answer went on after thinking ended
    assert answer.choices[0].message.model_extra["reasoning_content"]
    assert answer.choices[0].message.content
    route = fields(raw.headers["x-gateway-route"])
    assert (route["provider"], route["thinking"], route["reason"]) == ("local", "on", "route")
    # streamed, the same budget
    stream = await client.chat.completions.create(
        model="deepseek-reasoner",
        messages=[{"role": "user", "content": "And about the mountains?"}],
        max_tokens=12,
        stream=True,
        stream_options={"include_usage": True},
    )
    usage = [chunk.usage async for chunk in stream if chunk.usage is not None]
    assert usage[0].completion_tokens_details.reasoning_tokens == 5


async def test_a_key_with_thinking_off_gets_no_reasoning_from_the_reasoner(
    routed: LocalRouted,
) -> None:
    client = await routed.client(thinking="off")
    raw = await client.chat.completions.with_raw_response.create(
        model="deepseek-reasoner",
        messages=[{"role": "user", "content": "Think about the sea."}],
        max_tokens=8,
    )
    answer = raw.parse()
    assert not answer.choices[0].message.model_extra.get("reasoning_content")
    assert answer.usage is not None and answer.usage.completion_tokens_details is not None
    assert answer.usage.completion_tokens_details.reasoning_tokens == 0
    assert fields(raw.headers["x-gateway-route"])["reason"] == "policy:off"


@asynccontextmanager
async def busy_engine(routed: LocalRouted) -> AsyncIterator[None]:
    """The engine's one slot taken by a long stream, until exit."""
    key = (await routed.client()).api_key
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {key}"}) as http:
        body = {
            "model": "deepseek-chat",
            "messages": [{"role": "user", "content": "Go on and on."}],
            "max_tokens": 100000,
            "stream": True,
        }
        async with http.post(routed.root + "/v1/chat/completions", json=body) as busy:
            await busy.content.readline()

            async def running() -> bool:
                return routed.provider.engine_stats().num_running == 1

            await until(running)
            yield


async def queued(routed: LocalRouted) -> None:
    """Until one request waits for the engine's slot."""

    async def waiting() -> bool:
        return routed.provider.engine_stats().num_waiting == 1

    await until(waiting)


async def test_overflow_to_an_upstream_when_the_local_queue_is_full(routed: LocalRouted) -> None:
    local_only = await routed.client(providers="local")
    _, route = await _route(local_only, EASY)  # an idle engine serves auto-local itself
    assert (route["provider"], "overflow" in route) == ("local", False)
    async with busy_engine(routed):
        sent = len(routed.mock.requests)
        _, route = await _route(await routed.client(), EASY)
        assert (route["provider"], route["overflow"]) == ("mock", "queue")
        assert len(routed.mock.requests) == sent + 1
        # a key that may not use upstreams waits for the local engine instead
        waiting = asyncio.ensure_future(_route(local_only, EASY))
        await queued(routed)
        assert len(routed.mock.requests) == sent + 1
    _, route = await waiting  # the busy stream closed: its slot is free
    assert route["provider"] == "local" and "overflow" not in route


def conversation(topic: str) -> list[dict[str, str]]:
    """A first turn with a long system prompt of its own (about 300 tokens)."""
    system = f"{topic}: " + " ".join(f"rule {i} is to stay on {topic}." for i in range(30))
    return [{"role": "system", "content": system}, {"role": "user", "content": "Begin."}]


async def test_a_cached_conversation_stays_local_under_a_queue_a_cold_one_overflows(
    routed: LocalRouted,
) -> None:
    client = await routed.client()
    first = conversation("tides")
    answer, route = await _route(client, "", first)  # idle: served here, its prefix now cached
    assert route["provider"] == "local" and "kept" not in route and "overflow" not in route
    follow_up = [
        *first,
        {"role": "assistant", "content": answer.choices[0].message.content},
        {"role": "user", "content": "Go on."},
    ]
    local_only = await routed.client(providers="local")
    async with busy_engine(routed):
        sent = len(routed.mock.requests)
        _, cold = await _route(client, "", conversation("comets"))
        assert (cold["provider"], cold["cached"], cold["overflow"]) == ("mock", "0", "queue")
        # the conversation the engine holds waits for it instead of going upstream
        kept = asyncio.ensure_future(_route(client, "", follow_up))
        await queued(routed)
        assert len(routed.mock.requests) == sent + 1  # the cold one only
    answer, route = await kept
    assert (route["provider"], route["kept"], "overflow" in route) == ("local", "prefix", False)
    cached = int(route["cached"])
    assert cached >= 64
    details = answer.usage.prompt_tokens_details
    assert details is not None and (details.cached_tokens or 0) >= cached  # as it ran
    # a local-only key is never sent upstream, cached or not
    async with busy_engine(routed):
        waiting = asyncio.ensure_future(_route(local_only, "", conversation("dunes")))
        await queued(routed)
        assert len(routed.mock.requests) == sent + 1
    _, alone = await waiting
    assert alone["provider"] == "local" and "overflow" not in alone and "cached" not in alone
    # the usage record and the metrics say why
    await routed.app[PIPELINE].drain()
    redis = Redis.from_url(REDIS_URL)
    try:
        entries = await redis.xrange(KeySpace(routed.prefix).usage_log())
    finally:
        await redis.aclose()
    records = [fields(e[b"route"].decode()) for _, e in entries]
    assert route in records and cold in records
    async with aiohttp.ClientSession() as http, http.get(routed.root + "/metrics") as resp:
        text = await resp.text()
    for load, why in (("prefix", route), ("queue", cold)):
        assert (
            f'gateway_routing_decisions_total{{load="{load}",mode="applied",'
            f'provider="{why["provider"]}",reason="{why["reason"]}",thinking="{why["thinking"]}"}}'
        ) in text


async def _route(
    client: openai.AsyncOpenAI, text: str, messages: list[dict[str, str]] | None = None
) -> tuple[Any, dict[str, str]]:
    raw = await client.chat.completions.with_raw_response.create(
        model="auto-local",
        messages=messages or [{"role": "user", "content": text}],  # type: ignore[arg-type]
        max_tokens=4,
    )
    return raw.parse(), fields(raw.headers["x-gateway-route"])


async def test_the_prompt_is_tokenized_once_and_off_the_event_loop(
    routed: LocalRouted, monkeypatch: pytest.MonkeyPatch
) -> None:
    tokenizer = routed.provider._tokenizer
    encode_chat = tokenizer.encode_chat
    threads: list[threading.Thread] = []

    def counted(*args: Any, **kwargs: Any) -> list[int]:
        threads.append(threading.current_thread())
        return encode_chat(*args, **kwargs)

    monkeypatch.setattr(tokenizer, "encode_chat", counted)
    client = await routed.client()
    for model in ("deepseek-reasoner", "auto-local"):  # forced on; decided by the router
        threads.clear()
        answer = await client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "One prompt, once."}], max_tokens=3
        )
        assert answer.usage is not None and answer.usage.prompt_tokens > 0
        assert len(threads) == 1 and threads[0] is not threading.main_thread()
