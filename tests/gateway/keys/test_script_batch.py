"""Lua scripts on one pipelined connection: against the real Redis, a private redis-server (auth,
db, unix socket, restarts) and servers that misbehave."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from gateway.keys.script_batch import BatchedScript, Script, ScriptBatcher
from plumbing import busy_wait
from plumbing.busy_wait import BusyWait, Spin
from testkit.gateway_app import REDIS_URL, PrivateRedis, closed_port

INCR = Script.of("return redis.call('INCRBY', KEYS[1], ARGV[1])")


@pytest.fixture
async def batcher(redis: Redis) -> AsyncIterator[ScriptBatcher]:
    scripts = ScriptBatcher(redis)
    yield scripts
    await scripts.aclose()


@pytest.fixture
async def key(redis: Redis) -> AsyncIterator[str]:
    name = f"test:{uuid.uuid4().hex}"
    yield name
    await redis.delete(name)


async def test_calls_in_one_tick_share_one_write_and_run_in_order(
    batcher: ScriptBatcher, key: str, script_writes: list[int]
) -> None:
    assert await batcher.run(INCR, [key], [0]) == 0  # the script is in the server's cache now
    script_writes.clear()  # from here on
    results = await asyncio.gather(*(batcher.run(INCR, [key], [1]) for _ in range(50)))
    assert results == list(range(1, 51))  # one connection, replies in the order of the calls
    assert script_writes == [50]
    assert await batcher.run(INCR, [key], [5]) == 55
    assert script_writes == [50, 1]


async def test_an_at_once_call_on_a_quiet_connection_goes_at_once_its_tick_in_one_write(
    batcher: ScriptBatcher, key: str, script_writes: list[int]
) -> None:
    assert await batcher.run(INCR, [key], [0]) == 0  # the script is in the server's cache now
    script_writes.clear()  # from here on
    first = batcher.run(INCR, [key], [1], at_once=True)
    assert script_writes == [1]  # nothing else in flight: written before the tick ends
    rest = (batcher.run(INCR, [key], [1], at_once=True) for _ in range(49))
    results = await asyncio.gather(first, *rest)
    assert results == list(range(1, 51))  # one connection, replies in the order of the calls
    assert script_writes == [1, 49]


async def test_a_script_unknown_to_the_server_is_sent_again_as_eval(
    batcher: ScriptBatcher, key: str
) -> None:
    fresh = Script.of(f"return '{uuid.uuid4().hex}'")  # never loaded: EVALSHA says NOSCRIPT
    first, second, third = await asyncio.gather(
        batcher.run(INCR, [key], [1]), batcher.run(fresh, [], []), batcher.run(INCR, [key], [1])
    )
    assert (first, third) == (1, 2)
    assert second == fresh.source.split("'")[1].encode()


async def test_a_failing_script_fails_only_its_caller(batcher: ScriptBatcher, key: str) -> None:
    bad = Script.of("return redis.call('NO_SUCH_COMMAND')")
    ok, failed, after = await asyncio.gather(
        batcher.run(INCR, [key], [2]),
        batcher.run(bad, [], []),
        batcher.run(INCR, [key], [1]),
        return_exceptions=True,
    )
    assert (ok, after) == (2, 3) and isinstance(failed, ResponseError)


async def test_a_closed_batcher_refuses_calls(redis: Redis) -> None:
    scripts = ScriptBatcher(redis)
    await scripts.aclose()
    with pytest.raises(RedisConnectionError):
        await scripts.run(INCR, ["unused"], [1])


async def test_authenticates_and_selects_the_database_of_the_url(
    private_redis: PrivateRedis,
) -> None:
    client = Redis.from_url(private_redis.url(db=3))
    scripts = ScriptBatcher(client)
    try:
        assert await scripts.run(INCR, ["counter"], [7]) == 7
        assert await client.get("counter") == b"7"
    finally:
        await scripts.aclose()
        await client.aclose()
    in_db0 = Redis.from_url(private_redis.url(db=0))
    assert await in_db0.get("counter") is None
    await in_db0.aclose()


async def test_connects_over_a_unix_socket(private_redis: PrivateRedis) -> None:
    client = Redis.from_url(f"unix://{private_redis.socket}?db=2&password={private_redis.password}")
    scripts = ScriptBatcher(client)
    try:
        assert await scripts.run(INCR, ["counter"], [3]) == 3
        assert await client.get("counter") == b"3"
    finally:
        await scripts.aclose()
        await client.aclose()


async def test_a_wrong_password_fails_the_calls_with_a_redis_error(
    private_redis: PrivateRedis,
) -> None:
    client = Redis.from_url(private_redis.url(password="wrong"))
    scripts = ScriptBatcher(client)
    try:
        with pytest.raises(RedisConnectionError):
            await scripts.run(INCR, ["counter"], [1])
    finally:
        await scripts.aclose()
        await client.aclose()


async def test_a_lost_connection_fails_its_calls_and_the_next_call_reconnects(
    private_redis: PrivateRedis,
) -> None:
    client = Redis.from_url(private_redis.url())
    scripts = ScriptBatcher(client)
    try:
        assert await scripts.run(INCR, ["n"], [1]) == 1
        await client.client_kill_filter(_type="normal", skipme=True)  # drops the batcher's
        # The end of the connection is there to read, but the loop has not read it yet: an
        # at-once call must not be written at once into the dead connection (it would fail).
        assert await scripts.run(INCR, ["n"], [1], at_once=True) == 2
    finally:
        await scripts.aclose()
        await client.aclose()


async def _silent_server(answer: bytes | None) -> tuple[asyncio.Server, int]:
    """A server that reads requests and answers `answer` (None: never answers)."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while await reader.read(65536):
                if answer is not None:
                    writer.write(answer)
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


@pytest.mark.parametrize(
    ("answer", "error"),
    [(None, RedisTimeoutError), (b"?garbage\r\n", RedisError)],
    ids=["no answer", "not RESP"],
)
async def test_a_server_that_does_not_answer_properly_fails_every_waiting_call(
    answer: bytes | None, error: type[Exception]
) -> None:
    server, port = await _silent_server(answer)
    client = Redis.from_url(f"redis://127.0.0.1:{port}/0")
    scripts = ScriptBatcher(client, timeout_s=0.3)
    try:
        results = await asyncio.gather(
            *(scripts.run(INCR, ["k"], [1]) for _ in range(3)), return_exceptions=True
        )
        assert all(isinstance(r, error) for r in results), results
    finally:
        await scripts.aclose()
        await client.aclose()
        server.close()
        await server.wait_closed()


async def test_an_unreachable_server_fails_the_calls_with_a_connection_error() -> None:
    client = Redis.from_url(f"redis://127.0.0.1:{closed_port()}/0")
    scripts = ScriptBatcher(client, timeout_s=1)
    try:
        with pytest.raises(RedisConnectionError):
            await scripts.run(INCR, ["k"], [1])
    finally:
        await scripts.aclose()
        await client.aclose()


def test_runs_on_uvloop_the_loop_the_gateway_serves_on() -> None:
    uvloop = pytest.importorskip("uvloop")
    key = f"test:{uuid.uuid4().hex}"

    async def main() -> list[Any]:
        client = Redis.from_url(REDIS_URL)
        scripts = ScriptBatcher(client)
        try:
            return list(await asyncio.gather(*(scripts.run(INCR, [key], [2]) for _ in range(3))))
        finally:
            await scripts.aclose()
            await client.delete(key)
            await client.aclose()

    assert uvloop.run(main()) == [2, 4, 6]


async def test_waiting_for_a_reply_the_loop_spins_and_stops_once_it_is_in(
    redis: Redis, key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    yields: list[int] = []
    monkeypatch.setattr(busy_wait.os, "sched_yield", lambda: yields.append(1))
    scripts = ScriptBatcher(redis, busy=BusyWait(Spin(0.5, 4)))
    try:
        assert await scripts.run(INCR, [key], [1]) == 1  # opens the connection
        yields.clear()
        assert await scripts.run(INCR, [key], [1]) == 2
        assert yields, "the loop slept instead of polling for the reply"
        spun = len(yields)
        await asyncio.sleep(0.05)  # no call waits: the loop sleeps again
        assert len(yields) <= spun + 1
    finally:
        await scripts.aclose()


async def test_the_spin_is_bounded_in_time_and_off_when_many_calls_wait(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    yields: list[int] = []
    monkeypatch.setattr(busy_wait.os, "sched_yield", lambda: yields.append(1))
    server, port = await _silent_server(None)  # reads, never answers
    client = Redis.from_url(f"redis://127.0.0.1:{port}/0")
    scripts = ScriptBatcher(client, timeout_s=30, busy=BusyWait(Spin(0.02, 2)))
    try:
        waiting = asyncio.ensure_future(scripts.run(INCR, ["k"], [1]))
        await _until(lambda: bool(yields))  # sent: the loop polls for the reply
        spun = await _settled(yields)  # and stops 20 ms after the send, though the call waits
        assert not waiting.done()
        more = [asyncio.ensure_future(scripts.run(INCR, ["k"], [1])) for _ in range(3)]
        await asyncio.sleep(0.1)  # four calls wait, more than the two allowed: no spin at all
        assert len(yields) == spun
        for call in (waiting, *more):
            call.cancel()
    finally:
        await scripts.aclose()
        await client.aclose()
        server.close()
        await server.wait_closed()


async def _until(done: Any, within_s: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + within_s
    while not done():
        assert asyncio.get_running_loop().time() < deadline, "not within the deadline"
        await asyncio.sleep(0.005)


async def _settled(counts: list[int], within_s: float = 10.0) -> int:
    """The length of `counts` once it has stopped growing for 50 ms."""
    deadline = asyncio.get_running_loop().time() + within_s
    while True:
        seen = len(counts)
        await asyncio.sleep(0.05)
        if len(counts) == seen:
            return seen
        assert asyncio.get_running_loop().time() < deadline, "the spin did not stop"


# Items: ARGV[1] a factor shared by the batch, ARGV[2] the packed items, each {where its keys
# start, amount}; each item's reply is {its new value, how many keys the call was passed}.
ADD = BatchedScript(
    Script.of("""
local out, items = {}, cmsgpack.unpack(ARGV[2])
for i = 1, #items do
  local amount = items[i][2] * tonumber(ARGV[1])
  out[i] = {redis.call('INCRBY', KEYS[items[i][1] + 1], amount), #KEYS}
end
return out
"""),
    head=(10,),
    max_items=20,
)


async def test_items_of_one_tick_share_one_call_naming_each_key_once(
    batcher: ScriptBatcher, redis: Redis, script_writes: list[int]
) -> None:
    a, b = f"test:{uuid.uuid4().hex}", f"test:{uuid.uuid4().hex}"
    try:
        await batcher.run_item(ADD, (a,), [0])  # the script is in the server's cache now
        script_writes.clear()
        replies = await asyncio.gather(
            *(batcher.run_item(ADD, (a if i % 3 else b,), [1]) for i in range(30)),
            batcher.run(INCR, [a], [1000]),
        )
        # 30 items in two calls of at most 20, and the plain call after them, in one write.
        assert script_writes == [3]
        totals = {a: 0, b: 0}
        expected = []
        for i in range(30):
            totals[a if i % 3 else b] += 10
            expected.append([totals[a if i % 3 else b], 2])
        assert replies[:30] == expected
        assert replies[30] == int(await redis.get(a) or 0) == 1000 + 10 * 20
    finally:
        await redis.delete(a, b)


async def test_a_failing_batch_fails_each_of_its_items_and_nothing_else(
    batcher: ScriptBatcher, key: str
) -> None:
    bad = BatchedScript(Script.of("return redis.call('NO_SUCH_COMMAND')"))
    short = BatchedScript(Script.of("return {1}"))  # one reply for two items
    results = await asyncio.gather(
        batcher.run(INCR, [key], [2]),
        batcher.run_item(bad, (key,), [1]),
        batcher.run_item(bad, (key,), [1]),
        batcher.run_item(short, (key,), []),
        batcher.run_item(short, (key,), []),
        batcher.run(INCR, [key], [1]),
        return_exceptions=True,
    )
    assert (results[0], results[5]) == (2, 3)
    assert all(isinstance(r, ResponseError) for r in results[1:3])
    assert all(isinstance(r, RedisError) for r in results[3:5])


async def test_a_batched_script_unknown_to_the_server_is_sent_again_as_eval(
    batcher: ScriptBatcher,
) -> None:
    fresh = BatchedScript(Script.of(f"return {{ARGV[1], '{uuid.uuid4().hex}'}}"), head=(7,))
    first, second = await asyncio.gather(
        batcher.run_item(fresh, (), []), batcher.run_item(fresh, (), [])
    )
    assert first == b"7" and second == fresh.script.source.split("'")[1].encode()


async def test_a_lone_item_goes_at_once_and_a_closed_batcher_refuses_items(
    redis: Redis, key: str, script_writes: list[int]
) -> None:
    scripts = ScriptBatcher(redis)
    await scripts.run_item(ADD, (key,), [1])
    script_writes.clear()
    alone = scripts.run_item(ADD, (key,), [1], at_once=True)
    assert script_writes == [1]
    assert await alone == [20, 1]
    await scripts.aclose()
    with pytest.raises(RedisConnectionError):
        await scripts.run_item(ADD, (key,), [1])
