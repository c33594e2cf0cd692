"""The benchmark's bulk loader stores what the consumer stores: the same records and the same
rollups as settlement's stream entries of those records drained from Redis."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis
from sqlalchemy import select

from benchmarks.usage_load import LOCAL, batches, bulk_load, stream_fields
from gateway.config.usage import UsageSettings
from gateway.usage_store.buckets import DAY_S, HOUR_S
from gateway.usage_store.consumer import UsageConsumer
from gateway.usage_store.schema import ROLLUPS, hourly, records
from gateway.usage_store.store import UsageStore
from testkit.gateway_app import REDIS_URL
from testkit.postgres import PrivatePostgres
from tests.support.reference_rollups import rollups

N, DAYS = 1500, 3
NOW = datetime(2026, 12, 2, 7, tzinfo=UTC)  # the records cross a month's end


@pytest.fixture
async def redis() -> AsyncIterator[Redis]:
    client = Redis.from_url(REDIS_URL)
    yield client
    await client.aclose()


@pytest.fixture
def other_url(store_url: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A second, empty store of `store_url`'s kind."""
    if store_url.startswith("sqlite"):
        return f"sqlite+aiosqlite:///{tmp_path / 'consumed.db'}"
    server: PrivatePostgres = request.getfixturevalue("postgres_server")
    name = f"consumed_{uuid.uuid4().hex[:12]}"
    server.create_database(name)
    return server.url(name)


async def _contents(store: UsageStore) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of the records table and of each rollup, in primary-key order."""
    found = {}
    async with store.writer.connect() as conn:
        for table in (records, *ROLLUPS):
            order = list(table.primary_key.columns)
            found[table.name] = [
                tuple(r) for r in await conn.execute(select(table).order_by(*order))
            ]
    return found


def _same(bulk: list[tuple[Any, ...]], consumed: list[tuple[Any, ...]]) -> bool:
    """Equal rows, sums of decimals to their last bits (added in another order)."""
    return len(bulk) == len(consumed) and all(
        len(a) == len(b)
        and all(
            x == pytest.approx(y, rel=1e-9) if isinstance(x, float) else x == y
            for x, y in zip(a, b, strict=True)
        )  # fmt: skip
        for a, b in zip(bulk, consumed, strict=True)
    )


async def test_the_bulk_load_stores_the_records_and_rollups_the_consumer_stores(
    store_url: str, other_url: str, redis: Redis
) -> None:
    made = [row for batch in batches(N, 400, seed=3, days=DAYS, now=NOW) for row in batch]
    assert (
        len({row["key_id"] for row in made}) > 100
        and len({row["ts_ms"] // DAY_S // 1000 for row in made}) == 4
    )

    bulk = await UsageStore.open(store_url)
    try:
        assert await bulk_load(bulk, N, batch=400, seed=3, days=DAYS, now=NOW) > 0
        loaded = await _contents(bulk)
    finally:
        await bulk.aclose()

    stream = f"gwtest-bulk-{uuid.uuid4().hex[:10]}:usage-log"
    store = await UsageStore.open(other_url)
    try:
        async with redis.pipeline(transaction=False) as pipe:
            for row in made:
                pipe.xadd(stream, stream_fields(row), id=row["record_id"])  # type: ignore[arg-type]
            await pipe.execute()
        settings = UsageSettings(enabled=True, block_ms=10, batch_size=400)
        consumer = UsageConsumer(
            redis, store, stream=stream, settings=settings, local_providers=LOCAL
        )
        await consumer.ensure_group()
        while await consumer.step(block_ms=10):
            pass
        assert consumer.stored == N
        consumed = await _contents(store)
    finally:
        await store.aclose()
        await redis.delete(stream)

    assert [
        tuple(r.values())
        for r in sorted(made, key=lambda r: (r["key_id"], r["ts_ms"], r["record_id"]))
    ] == loaded[records.name]
    for name, rows in loaded.items():
        assert rows and _same(rows, consumed[name]), name
    shape = ROLLUPS[hourly]
    reference = [tuple(r) for r in rollups(made, HOUR_S, shape.dims, shape.added)]
    assert _same(loaded[hourly.name], reference)
