"""The console's sign-in limit is a sliding window: no more than `per_minute` attempts in any
60 seconds, also around a clock minute's edge (a fixed per-minute window let twice as many
through there). Against a real Redis, with an injected clock."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from gateway.admin.console.sessions import LoginLimiter


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def prefix(redis: Redis) -> AsyncIterator[str]:
    name = f"test:{uuid.uuid4().hex}:"
    yield name
    keys = [key async for key in redis.scan_iter(match=name + "*")]
    if keys:
        await redis.delete(*keys)


async def test_no_burst_passes_at_a_minutes_edge(redis: Redis, prefix: str) -> None:
    edge = 1_800_000_000 // 60 * 60 + 60.0  # a clock minute's first instant
    clock = Clock(edge - 1.0)
    limiter = LoginLimiter(redis, prefix, 10, clock=clock)
    assert [(await limiter.allow("10.0.0.1"))[0] for _ in range(10)] == [True] * 10
    clock.now = edge + 1.0  # the next clock minute: a fixed window would start afresh here
    allowed, retry_s = await limiter.allow("10.0.0.1")
    assert not allowed and retry_s == 58  # until the first attempt is 60 s old
    assert (await limiter.allow("10.0.0.2"))[0]  # per client address
    clock.now = edge + 58.5  # still within 60 s of every attempt
    assert not (await limiter.allow("10.0.0.1"))[0]
    clock.now = edge + 59.0  # the 10 attempts are 60 s old now (refused ones never counted)
    assert [(await limiter.allow("10.0.0.1"))[0] for _ in range(11)] == [True] * 10 + [False]


async def test_an_attempt_a_window_apart_always_passes(redis: Redis, prefix: str) -> None:
    clock = Clock(1_800_000_000.0)
    limiter = LoginLimiter(redis, prefix, 2, clock=clock)
    for _ in range(5):
        assert (await limiter.allow("c"))[0] and (await limiter.allow("c"))[0]
        assert (await limiter.allow("c")) == (False, 60)
        clock.now += 60.0
