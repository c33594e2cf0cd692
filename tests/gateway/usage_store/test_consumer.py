"""The consumer moves the usage stream into the store: each record stored exactly once, acked
after its commit, trimmed only once stored, across a consumer killed mid-batch, a crash between
commit and ack, the database and Redis stopped mid-batch."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from redis.asyncio import Redis
from redis.exceptions import RedisError

from gateway.config.usage import UsageSettings
from gateway.keys.store import text
from gateway.usage_store import consumer as consumer_module
from gateway.usage_store.consumer import UsageConsumer
from gateway.usage_store.queries import ExportQuery, SummaryQuery
from gateway.usage_store.rows import row_of
from gateway.usage_store.store import UsageStore
from testkit.gateway_app import REDIS_URL, PrivateRedis
from testkit.postgres import PrivatePostgres
from tests.support.usage_records import stream_fields

SETTINGS = UsageSettings(enabled=True, batch_size=100, block_ms=50, retry_s=0.05, flush_ms=0)


async def add(redis: Redis, stream: str, n: int, first: int = 0) -> list[str]:
    """XADD `n` records as settlement does; their entry ids."""
    now = time.time()
    async with redis.pipeline(transaction=False) as pipe:
        for i in range(first, first + n):
            pipe.xadd(stream, stream_fields(i, now))  # type: ignore[arg-type]
        return [text(entry_id) for entry_id in await pipe.execute()]


async def eventually(check, within_s: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + within_s
    while not await check():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


async def reconcile(store: UsageStore, added: list[str]) -> None:
    """Every record added is stored exactly once, and counted once in the rollups."""
    stored = [row[0] async for chunk in store.export(ExportQuery()) for row in chunk]
    assert sorted(stored) == sorted(added)  # none lost, none twice (ids are the primary key)
    [total] = await store.summary(SummaryQuery(latency=False))
    assert total["requests"] == len(added)


def consumer(redis: Redis, store: UsageStore, stream: str, **over: object) -> UsageConsumer:
    settings = SETTINGS.model_copy(update=over)
    return UsageConsumer(
        redis, store, stream=stream, settings=settings, local_providers=frozenset()
    )


@pytest.fixture
async def redis() -> Redis:
    client = Redis.from_url(REDIS_URL)
    yield client  # type: ignore[misc]
    await client.aclose()


@pytest.fixture
def stream() -> str:
    return f"gwtest-usage-{uuid.uuid4().hex[:10]}:usage-log"


async def test_stores_acks_and_trims_only_what_is_stored(
    store_url: str, redis: Redis, stream: str
) -> None:
    store = await UsageStore.open(store_url)
    try:
        added = await add(redis, stream, 250)
        c = consumer(redis, store, stream)
        await c.ensure_group()
        assert await c.step() == 100
        assert await redis.xlen(stream) == 150  # the stored 100 are trimmed, the rest stay
        while await c.step(block_ms=10):
            pass
        await reconcile(store, added)
        assert await redis.xlen(stream) == 0
        assert (await redis.xpending(stream, SETTINGS.group))["pending"] == 0
    finally:
        await store.aclose()
        await redis.delete(stream)


async def test_a_full_batch_reads_the_next_while_stored_and_stop_stores_it(
    store_url: str, redis: Redis, stream: str
) -> None:
    """While a full batch is stored the next is read (pending, not trimmed); a consumer
    stopped then stores that batch before `run` returns instead of leaving it to be claimed."""
    store = await UsageStore.open(store_url)
    try:
        added = await add(redis, stream, 300)
        c = consumer(redis, store, stream)
        await c.ensure_group()
        assert await c.step() == 100
        assert (await redis.xpending(stream, SETTINGS.group))["pending"] == 100
        assert await redis.xlen(stream) == 200
        c.stop()
        await asyncio.wait_for(c.run(), 30)
        assert (await redis.xpending(stream, SETTINGS.group))["pending"] == 0
        assert await redis.xlen(stream) == 100 and c.stored == 200
        rest = consumer(redis, store, stream)
        while await rest.step(block_ms=10):
            pass
        await reconcile(store, added)
    finally:
        await store.aclose()
        await redis.delete(stream)


async def test_batches_read_in_chunks_store_each_record_once(
    store_url: str, redis: Redis, stream: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch is read a chunk at a time, new entries and a restarted consumer's pending ones
    (read on from the last of each chunk): every record stored once."""
    monkeypatch.setattr(consumer_module, "_READ_CHUNK", 30)
    store = await UsageStore.open(store_url)
    try:
        added = await add(redis, stream, 250)
        first = consumer(redis, store, stream)
        await first.ensure_group()
        assert await first.step() == 100  # and the next 100 read ahead: pending, not stored
        assert (await redis.xpending(stream, SETTINGS.group))["pending"] == 100
        again = consumer(redis, store, stream)
        again.name = first.name  # the same consumer, restarted: its pending ones first
        assert await again.step() == 100
        assert again.stored == 100
        while await again.step(block_ms=10):
            pass
        await reconcile(store, added)
        assert await redis.xlen(stream) == 0
    finally:
        await store.aclose()
        await redis.delete(stream)


async def test_an_entry_that_is_not_utf8_is_stored_not_stuck(
    store_url: str, redis: Redis, stream: str
) -> None:
    """Bytes that are not UTF-8 in an entry (written by anything but the gateway) read as
    U+FFFD: the entry is stored and the stream moves on."""
    store = await UsageStore.open(store_url)
    try:
        fields = {**stream_fields(0, time.time()), "model": "m\udcff"}
        raw = {k: v.encode("utf-8", "surrogateescape") for k, v in fields.items()}
        added = [text(await redis.xadd(stream, raw)), *await add(redis, stream, 3, first=1)]
        c = consumer(redis, store, stream)
        await c.ensure_group()
        assert await c.step() == 4
        await reconcile(store, added)
        models = await store.summary(SummaryQuery(group_by="model", latency=False))
        assert {r["model"] for r in models} == {"m\ufffd", "model0", "model1"}
    finally:
        await store.aclose()
        await redis.delete(stream)


async def test_a_crash_between_commit_and_ack_stores_nothing_twice(
    tmp_path: Path, redis: Redis, stream: str
) -> None:
    store = await UsageStore.open(f"sqlite+aiosqlite:///{tmp_path / 'usage.db'}")
    try:
        added = await add(redis, stream, 120)
        dead = consumer(redis, store, stream, name="dead")
        await dead.ensure_group()
        # "dead" reads a batch and commits it, then dies before its XACK.
        reply = await redis.xreadgroup(SETTINGS.group, "dead", {stream: ">"}, count=80)
        rows = [
            row_of(text(i), {text(k): text(v) for k, v in f.items()}, frozenset())
            for i, f in reply[0][1]
        ]
        assert await store.insert(rows) == 80
        assert await redis.xlen(stream) == 120  # nothing acked: nothing trimmed
        alive = consumer(redis, store, stream, name="alive", claim_idle_s=0.01)
        await asyncio.sleep(0.02)  # let the dead consumer's entries idle past claim_idle_s
        while await alive.step(block_ms=10):
            pass
        assert alive.stored == 40  # the 80 claimed were stored before: not again
        await reconcile(store, added)
        assert await redis.xlen(stream) == 0
    finally:
        await store.aclose()
        await redis.delete(stream)


class _FailingStore:
    """A store whose inserts fail while `failing` (a database outage), else the store's."""

    def __init__(self, store: UsageStore) -> None:
        self.store = store
        self.failing = False

    async def insert(self, rows: list[dict[str, object]]) -> int:
        if self.failing:
            raise OSError("the database is down")
        return await self.store.insert(rows)


async def test_after_an_outage_its_own_unstored_batches_are_read_again_at_once(
    tmp_path: Path, redis: Redis, stream: str
) -> None:
    """A consumer that read two full batches (one being stored, the next read ahead) and
    failed to store them re-reads all of its own pending entries as soon as the database is
    back, also when new entries read ahead meanwhile end in a short batch: none waits to be
    claimed (`claim_idle_s`, an hour here)."""
    store = await UsageStore.open(f"sqlite+aiosqlite:///{tmp_path / 'usage.db'}")
    failing = _FailingStore(store)
    c = UsageConsumer(
        redis,
        failing,  # type: ignore[arg-type]
        stream=stream,
        settings=SETTINGS.model_copy(update={"claim_idle_s": 3600.0}),
        local_providers=frozenset(),
    )
    added = await add(redis, stream, 350)
    await c.ensure_group()
    failing.failing = True
    with pytest.raises(OSError):
        await c.step()  # 100 read and 100 read ahead, not stored
    assert (await redis.xpending(stream, SETTINGS.group))["pending"] == 200
    failing.failing = False
    # Back: 100 of its own and 100 new, then the 100 read ahead and 50 new, then those 50
    # (a short batch), then its other 100 at once.
    task = asyncio.create_task(c.run())
    try:

        async def all_stored() -> bool:
            return c.stored == 350

        await eventually(all_stored)
        await reconcile(store, added)
        assert (await redis.xpending(stream, SETTINGS.group))["pending"] == 0
    finally:
        c.stop()
        await task
        await store.aclose()
        await redis.delete(stream)


_CHILD = """
import asyncio, pathlib, sys
from redis.asyncio import Redis
from gateway.usage_store.consumer import UsageConsumer
from gateway.config.usage import UsageSettings
from gateway.usage_store.store import UsageStore

HELD_AT = 4  # batches stored before the one the child is held in

async def main():
    store = await UsageStore.open(sys.argv[1])
    held = pathlib.Path(sys.argv[4])
    insert, batches = store.insert, 0

    async def insert_then_hold(rows):
        # Batches 1..HELD_AT are stored; the next one is read (pending in the group, not
        # stored, not acked) when the child says so and waits to be killed.
        nonlocal batches
        batches += 1
        if batches > HELD_AT:
            held.write_text(str(len(rows)))
            await asyncio.Event().wait()
        return await insert(rows)

    store.insert = insert_then_hold
    redis = Redis.from_url(sys.argv[3])
    settings = UsageSettings(enabled=True, batch_size=50, block_ms=50)
    await UsageConsumer(redis, store, stream=sys.argv[2], settings=settings,
                        local_providers=frozenset(), name="child").run()

asyncio.run(main())
"""


def start_child(store_url: str, stream: str, held: Path) -> subprocess.Popen[bytes]:
    """A consumer in a process of its own (named "child"), on the shared Redis, that stores 4
    batches of 50 and is then held in its 5th, read and not stored, until killed; it writes
    that batch's size to `held` when it gets there."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    args = [sys.executable, "-c", _CHILD, store_url, stream, REDIS_URL, str(held)]
    return subprocess.Popen(args, env=env)


@pytest.mark.slow
async def test_a_consumer_killed_mid_batch_loses_nothing(
    store_url: str, redis: Redis, stream: str, tmp_path: Path
) -> None:
    store = await UsageStore.open(store_url)
    held = tmp_path / "held"
    added = await add(redis, stream, 3000)  # before the child reads: every batch is full
    child = start_child(store_url, stream, held)
    try:

        async def child_held() -> bool:
            return held.exists() and held.read_text() != ""

        await eventually(child_held, within_s=120)  # a child's start is slow on a busy machine
        # Known point: 4 batches stored and one read, not stored, not acknowledged.
        assert await store.count() == 200
        pending = await redis.xpending(stream, SETTINGS.group)
        assert pending["pending"] >= int(held.read_text()) == 50
        child.send_signal(signal.SIGKILL)  # mid-batch
        child.wait(timeout=10)
        alive = consumer(redis, store, stream, name="alive", claim_idle_s=0.05)

        async def all_stored() -> bool:
            await alive.step(block_ms=10)
            return await store.count() == 3000 and await redis.xlen(stream) == 0

        await eventually(all_stored)
        await reconcile(store, added)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        await store.aclose()
        await redis.delete(stream)


async def test_live_traffic_is_stored_a_flush_interval_at_a_time(
    store_url: str, redis: Redis, stream: str
) -> None:
    """After a batch that was not full the consumer waits `flush_ms` before it reads again:
    records added meanwhile wait in the stream; a stop ends the wait at once."""
    store = await UsageStore.open(store_url)
    added = await add(redis, stream, 5)  # (before the consumer starts: one batch)
    c = consumer(redis, store, stream, flush_ms=60_000)
    task = asyncio.create_task(c.run())
    try:

        async def first_stored() -> bool:
            return c.stored == 5

        await eventually(first_stored)
        added += await add(redis, stream, 5, first=5)
        await asyncio.sleep(0.5)  # many reads' worth without the wait
        assert c.stored == 5 and await redis.xlen(stream) == 5
        c.stop()
        await asyncio.wait_for(task, 10)
        await reconcile(store, added[:5])
    finally:
        c.stop()
        await task
        await store.aclose()
        await redis.delete(stream)


@pytest.mark.slow
async def test_the_database_stopped_mid_batch_loses_nothing(redis: Redis, stream: str) -> None:
    pg = PrivatePostgres()
    pg.start()
    store = await UsageStore.open(pg.url())
    c = consumer(redis, store, stream)  # (its unstored batches re-read at once, not claimed)
    task = asyncio.create_task(c.run())
    try:
        added = await add(redis, stream, 1000)

        async def some_stored() -> bool:
            return c.stored >= 100

        await eventually(some_stored)
        pg.kill()  # immediate shutdown, as a crash
        added += await add(redis, stream, 500, first=1000)
        assert await redis.xlen(stream) > 0  # waiting in the stream
        pg.start()

        async def all_stored() -> bool:
            try:
                return await store.count() == 1500
            except Exception:
                return False

        await eventually(all_stored, within_s=60)
        await reconcile(store, added)

        async def trimmed() -> bool:
            return await redis.xlen(stream) == 0

        await eventually(trimmed)
    finally:
        c.stop()
        await task
        await store.aclose()
        pg.remove()
        await redis.delete(stream)


@pytest.mark.slow
async def test_redis_stopped_mid_batch_loses_nothing(
    tmp_path: Path, private_redis: PrivateRedis
) -> None:
    stream = "gw:usage-log"
    redis = Redis.from_url(private_redis.url())
    store = await UsageStore.open(f"sqlite+aiosqlite:///{tmp_path / 'usage.db'}")
    # A batch read before the stop and not stored is re-read at once after it, not claimed
    # back after claim_idle_s (60 s, beyond the deadlines below).
    c = consumer(redis, store, stream)
    task = asyncio.create_task(c.run())
    try:
        added = await add(redis, stream, 5000)

        async def some_stored() -> bool:
            return c.stored >= 100

        await eventually(some_stored)
        private_redis.stop()  # written to its append-only file, then gone
        assert await store.count() < 5000
        private_redis.start()

        async def loaded() -> bool:  # its append-only file read back
            try:
                return int((await redis.info("persistence"))["loading"]) == 0
            except RedisError:
                return False

        await eventually(loaded)
        added += await add(redis, stream, 300, first=5000)

        async def all_stored() -> bool:
            return await store.count() == 5300

        await eventually(all_stored, within_s=60)
        await reconcile(store, added)
    finally:
        c.stop()
        await task
        await store.aclose()
        await redis.aclose()
