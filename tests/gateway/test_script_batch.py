"""Lua scripts sent one pipeline per loop tick, against the real Redis."""

from __future__ import annotations

import asyncio
import uuid

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from gateway.keys.script_batch import Script, ScriptBatcher

INCR = Script.of("return redis.call('INCRBY', KEYS[1], ARGV[1])")


async def test_calls_in_one_tick_share_a_pipeline_and_keep_their_results(redis: Redis) -> None:
    key = f"test:{uuid.uuid4().hex}"
    batcher = ScriptBatcher(redis)
    sent: list[int] = []
    original = batcher._send

    async def counting(batch: list) -> None:  # type: ignore[type-arg]
        sent.append(len(batch))
        await original(batch)

    batcher._send = counting  # type: ignore[method-assign]
    try:
        results = await asyncio.gather(*(batcher.run(INCR, [key], [1]) for _ in range(50)))
        assert sorted(results) == list(range(1, 51))
        assert sent == [50]
        assert await batcher.run(INCR, [key], [5]) == 55
    finally:
        await redis.delete(key)


async def test_a_script_unknown_to_the_server_is_loaded(redis: Redis) -> None:
    fresh = Script.of(f"return '{uuid.uuid4().hex}'")  # never loaded: EVALSHA says NOSCRIPT
    assert await ScriptBatcher(redis).run(fresh, [], []) == fresh.source.split("'")[1].encode()


async def test_a_failing_script_fails_only_its_caller(redis: Redis) -> None:
    batcher = ScriptBatcher(redis)
    bad = Script.of("return redis.call('NO_SUCH_COMMAND')")
    key = f"test:{uuid.uuid4().hex}"
    ok, failed = await asyncio.gather(
        batcher.run(INCR, [key], [2]), batcher.run(bad, [], []), return_exceptions=True
    )
    await redis.delete(key)
    assert ok == 2 and isinstance(failed, ResponseError)
