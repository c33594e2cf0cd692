"""Helpers of the fault suite: a keyed gateway on a Redis of the test's own, load, and what is
recorded and still held in Redis afterwards."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from redis.asyncio import Redis

from gateway.keys.records import KeyCreate
from gateway.keys.redis_access import RedisAccessControl
from gateway.keys.store import KeySpace, KeyStore, text
from gateway.resources import ACCESS, PIPELINE
from testkit.gateway_app import gateway_settings, start_gateway
from testkit.mock_upstream import MockUpstream

PREFIX = "gw:"
ADMIN = "admin-faults"
SPACE = KeySpace(PREFIX)
USER = [{"role": "user", "content": "alpha beta gamma delta epsilon"}]
MODELS = {
    "echo-model": {"routes": [{"provider": "mock", "model": "echo"}]},
    "gap-model": {"routes": [{"provider": "mock", "model": "echo-chunks-20-gap-0.02"}]},
    "long-model": {"routes": [{"provider": "mock", "model": "echo-chunks-20-gap-0.1"}]},
    "longer-model": {"routes": [{"provider": "mock", "model": "echo-chunks-20-gap-0.2"}]},
    "stall-model": {"routes": [{"provider": "mock", "model": "stall"}]},
    "hang-model": {"routes": [{"provider": "mock", "model": "hang"}]},
    "die-model": {"routes": [{"provider": "mock", "model": "die-midstream-after-3"}]},
    "die-early-model": {"routes": [{"provider": "mock", "model": "die-midstream-after-0"}]},
    "error-model": {"routes": [{"provider": "mock", "model": "error-midstream-after-2"}]},
    "stall-impatient-model": {"routes": [{"provider": "impatient", "model": "stall"}]},
    "fail-model": {"routes": [{"provider": "mock", "model": "fail-500"}]},
}


@dataclass
class Keyed:
    root: str
    key: str
    key_id: str
    app: web.Application
    redis: Redis  # a client of the test's own on the same Redis

    @property
    def access(self) -> RedisAccessControl:
        access = self.app[ACCESS]
        assert isinstance(access, RedisAccessControl)
        return access

    async def settled(self) -> None:
        await self.app[PIPELINE].drain()


@asynccontextmanager
async def keyed_gateway(
    mock: MockUpstream,
    url: str,
    spool_dir: Path,
    *,
    timeout_s: float = 2.0,
    lease_s: float = 15.0,
    **limits: Any,
) -> AsyncIterator[Keyed]:
    """A keyed gateway on the Redis at `url` with one key (`limits` set on it)."""
    settings = gateway_settings(
        mock,
        PREFIX,
        models=MODELS,
        admin={"api_key": ADMIN},
        limits={"spool_dir": spool_dir, "slot_lease_s": lease_s},
    )
    redis_settings = settings.redis.model_copy(update={"url": url, "timeout_s": timeout_s})
    runner, root = await start_gateway(settings.model_copy(update={"redis": redis_settings}))
    client = Redis.from_url(url)
    secret, record = await KeyStore(client, prefix=PREFIX).create(
        KeyCreate(name="faults", **limits)
    )
    try:
        yield Keyed(root, secret, record.id, runner.app, client)
    finally:
        await runner.cleanup()
        await client.aclose()


async def chat(
    session: aiohttp.ClientSession,
    root: str,
    key: str,
    model: str = "echo-model",
    *,
    stream: bool = False,
    within_s: float = 15,
) -> tuple[int, bytes]:
    """One chat request: (status, whole body); a stream is read to its end."""
    body = {"model": model, "messages": USER, "stream": stream, "max_tokens": 50}
    async with session.post(
        f"{root}/v1/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {key}"},
        timeout=aiohttp.ClientTimeout(total=within_s),
    ) as resp:
        return resp.status, await resp.read()


async def records(redis: Redis) -> list[dict[str, str]]:
    """Every usage record in the log, oldest first."""
    entries = await redis.xrange(SPACE.usage_log())
    return [{text(k): text(v) for k, v in fields.items()} for _, fields in entries]


async def held(redis: Redis, key_id: str) -> tuple[int, int]:
    """(slots, reserved tokens) the key holds now."""
    slots = await redis.zcard(SPACE.slots(key_id))
    tokens = int(await redis.hget(SPACE.held(key_id), "_sum") or 0)
    return slots, tokens


async def eventually(check: Callable[[], Awaitable[bool]], within_s: float = 10.0) -> None:
    """Wait until `check()` holds, up to a deadline."""
    deadline = time.monotonic() + within_s
    while not await check():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


async def nothing_held(redis: Redis, key_id: str, within_s: float = 10.0) -> None:
    async def empty() -> bool:
        return await held(redis, key_id) == (0, 0)

    await eventually(empty, within_s)


def spooled(spool_dir: Path) -> list[str]:
    """The settlements waiting in the spool files under `spool_dir` (JSON lines)."""
    files = spool_dir.glob("settlements-*.jsonl")
    return [line for path in files for line in path.read_text().splitlines()]
