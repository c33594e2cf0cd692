"""Admissions and settlements made in one loop tick go to Redis as one batched script call, which
reads once and writes once what its items share: it must decide and leave Redis exactly as the
same calls made one at a time would. Each scenario runs both ways, on two key spaces with the
same keys, clock and requests, and compares every answer and every counter."""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis

from gateway.access.contract import Grant, Outcome, Principal, Ticket
from gateway.keys.records import KeyCreate, KeyUpdate, UsageQuery
from gateway.keys.redis_access import RedisAccessControl
from gateway.keys.usage import UsageReader
from providers.types import Usage
from tests.support.clock import START, Clock

LIMITS: list[dict[str, object]] = [
    {"budget_tokens": 1500, "max_concurrency": 4},
    {"rpm": 7, "tpm": 900},
    {"budget_tokens": 2500, "budget_period": "day", "tpm": 2000, "max_concurrency": 6},
    {},
    {"max_concurrency": 3, "rpm": 30},
]
# The usage log's cap: below the records a scenario writes, so that it is trimmed.
MAXLEN = 5
# Lowered between admission and settlement: what is charged is then capped by what is left.
LOWERED = {0: 500, 2: 900}


class Space:
    """One key space (prefix) with the same keys as its twin, and the answers it gave."""

    def __init__(self, access: RedisAccessControl) -> None:
        self.access = access
        self.principals: list[Principal] = []

    async def make_keys(self) -> None:
        for limits in LIMITS:
            secret, _ = await self.access.store.create(
                KeyCreate.model_validate({"name": "t", "models": ["m", "n"], **limits})
            )
            self.principals.append(await self.access.authenticate(secret))

    async def state(self, redis: Redis, now: float) -> list[dict[str, Any]]:
        """Every counter a key has at `now`, by the key's place in LIMITS (key ids differ per
        space)."""
        space, out = self.access.store.space, []
        reader = UsageReader(redis, prefix=space.prefix)
        minute = int(now * 1000) // 60_000
        day = time.strftime("%Y-%m-%d", time.gmtime(now))
        for p in self.principals:
            k = p.key_id
            usage = await reader.query(UsageQuery(key_id=k, group_by="key"))
            out.append(
                {
                    "spent": [await redis.get(space.spent(k, s)) for s in ("all", day, day[:7])],
                    "held": await redis.hget(space.held(k), "_sum"),
                    "held_fields": await redis.hlen(space.held(k)),
                    "slots": await redis.zcard(space.slots(k)),
                    "rpm": await redis.get(space.window("rpm", k, minute)),
                    "tpm": await redis.get(space.window("tpm", k, minute)),
                    "usage": usage["totals"],
                }
            )
        # The capped usage log: the records kept (the newest), in order.
        log = await redis.xrange(space.usage_log())
        out.append({"log": [(e[b"charged_tokens"], e[b"status"]) for _, e in log]})
        return out


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def spaces(redis: Redis, clock: Clock, tmp_path: Path) -> AsyncIterator[tuple[Space, Space]]:
    made: list[Space] = []
    for name in ("batched", "one_by_one"):
        access = RedisAccessControl(
            redis,
            prefix=f"test:{uuid.uuid4().hex}:",
            usage_stream_maxlen=MAXLEN,
            slot_lease_s=300,
            spool_dir=tmp_path / name,
            clock=clock,
        )
        made.append(Space(access))
    for space in made:
        await space.make_keys()
    yield made[0], made[1]
    for space in made:
        await space.access.aclose()
        prefix = space.access.store.space.prefix
        keys = [key async for key in redis.scan_iter(match=prefix + "*")]
        if keys:
            await redis.delete(*keys)


def answer(result: object) -> object:
    """What a caller sees of an admission or its refusal (not its random slot token)."""
    if isinstance(result, Grant):
        return ("grant", result.max_tokens, result.reserved_tokens, result.headers)
    return (type(result).__name__, str(result))


async def both_ways(
    calls: list[Callable[[], Awaitable[Any]]], writes: list[int]
) -> tuple[list[object], list[object]]:
    """`calls` (pairs of twins, interleaved) in one tick per space, and one at a time."""
    writes.clear()
    batched = await asyncio.gather(*(c() for c in calls[0::2]), return_exceptions=True)
    # One script call for them all (the first may go alone, at once, on a quiet connection).
    assert writes in ([1], [1, 1])
    one_by_one: list[object] = []
    for c in calls[1::2]:
        try:
            one_by_one.append(await c())
        except Exception as exc:
            one_by_one.append(exc)
    return list(batched), one_by_one


@pytest.mark.parametrize("seed", range(6))
async def test_a_batch_decides_and_counts_as_its_calls_one_at_a_time(
    spaces: tuple[Space, Space], redis: Redis, clock: Clock, seed: int, script_writes: list[int]
) -> None:
    batched, one_by_one = spaces
    rng = random.Random(seed)
    requests = [
        (
            rng.randrange(len(LIMITS)),
            rng.randrange(0, 300),
            rng.randrange(1, 400),
            rng.choice("mnx"),
        )
        for _ in range(40)
    ]

    def admissions() -> list[Callable[[], Awaitable[Any]]]:
        return [
            partial(space.access.admit, Ticket(space.principals[key], model, "r", prompt, most))
            for key, prompt, most, model in requests
            for space in (batched, one_by_one)
        ]

    def settlements(grants: Sequence[tuple[object, object]]) -> list[Callable[[], Awaitable[Any]]]:
        """Twin settlements, some twice over in the same tick (a retry beside the original);
        prompt tokens as the upstream counts them, now and then more than estimated."""
        calls: list[Callable[[], Awaitable[Any]]] = []
        for g, w in grants:
            assert isinstance(g, Grant) and isinstance(w, Grant)
            used = Usage(rng.randrange(0, 300), rng.randrange(0, 500), reasoning_tokens=1)
            outcome = Outcome(used, rng.choice((200, 200, 502)), provider="mock")
            for _ in range(2 if rng.random() < 0.3 else 1):
                calls += [
                    partial(batched.access.settle, g, outcome),
                    partial(one_by_one.access.settle, w, outcome),
                ]
        return calls

    got, want = await both_ways(admissions(), script_writes)
    assert [answer(r) for r in got] == [answer(r) for r in want]
    assert sum(isinstance(r, Grant) for r in got) > 5  # some admitted, some refused
    assert sum(not isinstance(r, Grant) for r in got) > 5

    granted = [(g, w) for g, w in zip(got, want, strict=True) if isinstance(g, Grant)]
    rng.shuffle(granted)
    settled, left = granted[: len(granted) * 2 // 3], granted[len(granted) * 2 // 3 :]
    for key, budget in LOWERED.items():
        for space in (batched, one_by_one):
            patch = KeyUpdate(budget_tokens=budget)
            await space.access.store.update(space.principals[key].key_id, patch)
    await both_ways(settlements(settled), script_writes)
    assert await batched.state(redis, START) == await one_by_one.state(redis, START)

    # Past the lease of the slots left unsettled: the next batch sweeps them where it must.
    clock.now += 301
    got, want = await both_ways(admissions(), script_writes)
    assert [answer(r) for r in got] == [answer(r) for r in want]
    await both_ways(settlements(left), script_writes)  # lapsed: recorded once all the same
    assert await batched.state(redis, clock.now) == await one_by_one.state(redis, clock.now)
    assert await redis.xlen(batched.access.store.space.usage_log()) == MAXLEN  # trimmed
