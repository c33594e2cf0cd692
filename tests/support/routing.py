"""A live gateway with auto models in front of the mock upstream, for the routing tests."""

from __future__ import annotations

import asyncio
import os
import sys
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import openai
from aiohttp import web
from redis.asyncio import Redis

from gateway.config.settings import Settings
from gateway.keys.records import KeyCreate
from gateway.keys.store import KeyStore
from gateway.resources import PIPELINE
from testkit.gateway_app import REDIS_URL, closed_port, start_gateway
from testkit.gateway_procs import engines_loaded
from testkit.mock_upstream import MockUpstream

ADMIN_KEY = "admin-" + uuid.uuid4().hex
GOOD_KEY_ENV = "ROUTING_TEST_UPSTREAM_KEY"
HARD = (
    "Find the number of ordered pairs of positive integers (a, b) such that a + b = 1000 and "
    "neither a nor b has a zero digit. Explain step by step."
)
EASY = "Translate good morning into Spanish."


def routing_settings(mock: MockUpstream, prefix: str, **routing: Any) -> Settings:
    """`auto-model` (auto, one route), `shadow-model` (shadow), `static-model` (static),
    `reasoning-auto` (auto, an upstream that always reasons), `flaky-model` (the `flaky`
    provider, then `good`; `flaky` sends no upstream key, `good` sends $GOOD_KEY_ENV),
    `down-model` (`flaky`, always HTTP 500)."""
    upstream = {"kind": "openai", "base_url": mock.base_url, "first_byte_timeout_s": 5}
    return Settings(
        server={"host": "127.0.0.1", "port": 0},
        redis={"url": REDIS_URL, "embedded": False, "key_prefix": prefix},
        logging={"format": "json", "level": "warning"},
        admin={"api_key": ADMIN_KEY},
        usage={"enabled": False},
        use_presets=False,
        providers={
            "mock": upstream,
            "flaky": upstream,
            "good": {**upstream, "api_key_env": GOOD_KEY_ENV},
        },
        models={
            "auto-model": {"routing": "auto", "routes": [{"provider": "mock", "model": "echo"}]},
            "shadow-model": {
                "routing": "shadow",
                "routes": [{"provider": "mock", "model": "echo"}],
            },
            "static-model": {"routes": [{"provider": "mock", "model": "echo"}]},
            "reasoning-auto": {
                "routing": "auto",
                "routes": [{"provider": "mock", "model": "reasoning-content"}],
            },
            "down-model": {"routes": [{"provider": "flaky", "model": "fail-500"}]},
            "flaky-model": {
                "routing": "auto",
                "routes": [
                    {"provider": "flaky", "model": "echo"},
                    {"provider": "good", "model": "echo"},
                ],
            },
        },
        routing=routing,
    )


@dataclass
class Routed:
    root: str
    app: web.Application
    prefix: str
    mock: MockUpstream
    clients: list[openai.AsyncOpenAI] = field(default_factory=list)

    async def key(self, **policy: Any) -> str:
        redis = Redis.from_url(REDIS_URL)
        try:
            body = KeyCreate(name="routing", policy=policy or None)
            secret, _ = await KeyStore(redis, prefix=self.prefix).create(body)
        finally:
            await redis.aclose()
        return secret

    def client(self, key: str) -> openai.AsyncOpenAI:
        """An SDK client, closed with the gateway."""
        client = openai.AsyncOpenAI(base_url=f"{self.root}/v1", api_key=key, max_retries=0)
        self.clients.append(client)
        return client

    async def settled(self) -> None:
        await self.app[PIPELINE].drain()

    def sent_thinking(self) -> Any:
        """What the upstream received as `thinking` in the latest request (None: absent)."""
        return self.mock.requests[-1].body.get("thinking")


@asynccontextmanager
async def open_routed(settings: Settings, mock: MockUpstream) -> AsyncIterator[Routed]:
    runner, root = await start_gateway(settings)
    routed = Routed(root, runner.app, settings.redis.key_prefix, mock)
    try:
        yield routed
    finally:
        for client in routed.clients:
            await client.close()
        await runner.cleanup()


def fields(header: str) -> dict[str, str]:
    """The `x-gateway-route` header's fields."""
    return dict(part.split("=", 1) for part in header.split("; "))


async def chat(client: openai.AsyncOpenAI, model: str, text: str, **kw: Any) -> tuple[Any, dict]:
    """A non-streamed chat answer and its route fields."""
    messages = kw.pop("messages", [{"role": "user", "content": text}])
    raw = await client.chat.completions.with_raw_response.create(
        model=model, messages=messages, **kw
    )
    return raw.parse(), fields(raw.headers["x-gateway-route"])


async def until(predicate: Any, within_s: float = 10.0) -> None:
    """Wait for `predicate()` (an awaitable factory) to be true, with a deadline."""
    deadline = time.monotonic() + within_s
    while not await predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


@asynccontextmanager
async def gateway_process(mock: MockUpstream, prefix: str, tmp: Path) -> AsyncIterator[str]:
    """`python -m gateway serve` in a process of its own with `auto-model` on the shared Redis
    prefix; yields its root URL once it is healthy."""
    config = tmp / "routing.toml"
    config.write_text(
        f"""
[redis]
url = "{REDIS_URL}"
embedded = false
key_prefix = "{prefix}"
[logging]
format = "json"
level = "warning"
[usage]
enabled = false
[providers.mock]
kind = "openai"
base_url = "{mock.base_url}"
[models."auto-model"]
routing = "auto"
routes = [{{ provider = "mock", model = "echo" }}]
"""
    )
    port = closed_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway", "serve", "--config", str(config), "--port", str(port),
        cwd=Path(__file__).parents[2], env={**os.environ, "GATEWAY_USE_PRESETS": "false"},
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    root = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as http:

            async def healthy() -> bool:
                try:
                    async with http.get(f"{root}/healthz") as resp:
                        return resp.status == 200
                except aiohttp.ClientError:
                    assert proc.returncode is None, f"the gateway exited with {proc.returncode}"
                    return False

            await until(healthy, within_s=30)
            await engines_loaded(http, root, within_s=600)
        yield root
    finally:
        if proc.returncode is None:
            proc.terminate()
            await proc.wait()
