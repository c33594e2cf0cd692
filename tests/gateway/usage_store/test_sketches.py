"""p50/p95 read from the sketch tables, apart from the counter rollups: the same as the
histograms of the records themselves, worked out in Python, for every shape of summary (by
nothing, key, key and model, model and provider, key and status), over ranges of whole months,
whole days and part days, per period and paged; and a store whose rollups held the histograms
gets them moved into the sketch tables with every summary unchanged."""

from __future__ import annotations

import contextlib
import math
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Column, Connection, Integer, MetaData, Table, insert, select

from gateway.usage_store.buckets import DAY_S, HOUR_S, MONTH, bucket_start
from gateway.usage_store.queries import COLUMN, SummaryQuery
from gateway.usage_store.rows import row_of
from gateway.usage_store.schema import (
    COUNTER_ROLLUPS,
    ROLLUPS,
    SKETCH,
    SKETCHES,
    TOTALS,
    daily_key,
    daily_key_model,
    hourly_key,
    monthly_all_keys,
    monthly_key,
    monthly_key_model,
)
from gateway.usage_store.sketch import BUCKETS, bucket_of, quantiles
from gateway.usage_store.store import UsageStore
from gateway.usage_store.summary_sql import sketch_statement
from tests.support.reference_rollups import rollups
from tests.support.usage_records import stream_fields

FIRST = datetime(2026, 1, 20, 3, 30, tzinfo=UTC)
MONTH0 = datetime(2026, 1, 1, tzinfo=UTC)


def _records(n: int = 900, step_s: float = 3.1 * 3600) -> list[dict[str, Any]]:
    """Records from January 20 to mid-May, every 3.1 hours, over 4 keys, 3 models, two
    providers and failures, with latencies spread over many buckets (each key and model its
    own spread) and some without a TTFT."""
    out = []
    for i in range(n):
        ts = FIRST.timestamp() + i * step_s
        fields = stream_fields(
            i,
            ts,
            key_id=f"key{i % 4}",
            model=f"model{i % 3}",
            provider=("mock", "engine")[i % 5 % 2],
            status=(200, 200, 200, 429, 502)[i % 5],
            error_code=("", "", "", "rate_limited", "upstream_error")[i % 5],
            latency_ms=f"{0.5 + (i * 37) % 1000 * (1 + i % 4)}",
            ttft_ms="" if i % 6 == 0 else f"{1 + (i * 11) % 300 * (1 + i % 3)}.25",
        )
        out.append(row_of(f"{int(ts * 1000)}-{i}", fields, frozenset({"engine"})))
    return out


def _period(ts_s: int, interval: str | None) -> str | None:
    if interval is None:
        return None
    grain = {"hour": HOUR_S, "day": DAY_S, "month": MONTH}[interval]
    return datetime.fromtimestamp(bucket_start(ts_s, grain), UTC).isoformat()


def _expected(
    batch: Sequence[dict[str, Any]],
    dims: list[str],
    interval: str | None,
    start: datetime | None,
    end: datetime | None,
) -> dict[tuple[Any, ...], tuple[Any, ...]]:
    """Each group's (and period's) p50/p95 of latency and TTFT from the records' own
    histograms: the records in the whole hours that hold the range (what rollups count)."""
    low = -math.inf if start is None else start.timestamp() // HOUR_S * HOUR_S
    high = math.inf if end is None else -(-end.timestamp() // HOUR_S) * HOUR_S
    groups: dict[tuple[Any, ...], tuple[list[int], list[int]]] = {}
    for r in batch:
        second = r["ts_ms"] // 1000
        if not low <= second < high:
            continue
        group = (_period(second, interval), *(r[COLUMN[d]] for d in dims))
        lat, ttft = groups.setdefault(group, ([0] * BUCKETS, [0] * BUCKETS))
        lat[bucket_of(r["latency_ms"])] += 1
        if r["ttft_ms"] is not None:
            ttft[bucket_of(r["ttft_ms"])] += 1
    return {
        g: (*quantiles(lat, 0.5, 0.95), *quantiles(t, 0.5, 0.95)) for g, (lat, t) in groups.items()
    }


def _got(rows: list[dict[str, Any]], dims: list[str]) -> dict[tuple[Any, ...], tuple[Any, ...]]:
    return {
        (r.get("period"), *(r[d] for d in dims)): (
            r["latency_ms"]["p50"],
            r["latency_ms"]["p95"],
            r["ttft_ms"]["p50"],
            r["ttft_ms"]["p95"],
        )
        for r in rows
    }


@contextlib.asynccontextmanager
async def _opened(store_url: str) -> AsyncIterator[UsageStore]:
    store = await UsageStore.open(store_url)
    try:
        yield store
    finally:
        await store.aclose()


RANGES = (
    (None, None),
    (MONTH0 + timedelta(days=31), MONTH0 + timedelta(days=90)),  # February and March whole
    # part days and part months around whole months (February to April)
    (MONTH0 + timedelta(days=24, hours=7), MONTH0 + timedelta(days=122, hours=5)),
    # part months of more than half a month (the month less its other days), part days of
    # more than half a day (the day less its other hours)
    (MONTH0 + timedelta(days=21, hours=2), MONTH0 + timedelta(days=118, hours=21, minutes=30)),
    (MONTH0 + timedelta(days=40, hours=5), MONTH0 + timedelta(days=40, hours=17)),  # one day
    (MONTH0 + timedelta(days=45, minutes=10), None),
    (None, MONTH0 + timedelta(days=75, hours=1)),
)
GROUPS = ("", "key", "key,model", "model", "provider,model", "key,status")


async def test_percentiles_read_as_the_records_histograms(store_url: str) -> None:
    batch = _records()
    async with _opened(store_url) as store:
        assert await store.insert(batch[:600]) == 600
        assert await store.insert(batch[400:]) == 300  # overlapping: rolled up once
        for start, end in RANGES:
            for group_by in GROUPS:
                dims = group_by.split(",") if group_by else []
                q = SummaryQuery(group_by=group_by, start=start, end=end)
                got = await store.summary(q)
                want = _expected(batch, dims, None, start, end)
                assert _got(got, dims) == want, (start, end, group_by)
                # paged: each page's rows read their own histograms
                pages, cursor = [], None
                while True:
                    page, cursor = await store.summary_page(
                        q.model_copy(update={"limit": 2, "cursor": cursor})
                    )
                    pages += page
                    if cursor is None:
                        break
                assert pages == got


@pytest.mark.parametrize("interval", ["hour", "day", "month"])
async def test_percentiles_per_period_read_as_the_records_histograms(
    store_url: str, interval: str
) -> None:
    batch = _records(400)
    async with _opened(store_url) as store:
        await store.insert(batch)
        start, end = MONTH0 + timedelta(days=25), MONTH0 + timedelta(days=60)
        for group_by in GROUPS:
            dims = group_by.split(",") if group_by else []
            q = SummaryQuery(group_by=group_by, interval=interval, start=start, end=end)
            got = await store.summary(q)
            assert _got(got, dims) == _expected(batch, dims, interval, start, end)
            first, cursor = await store.summary_page(q.model_copy(update={"limit": 7}))
            second = []
            if cursor is not None:
                second, _ = await store.summary_page(
                    q.model_copy(update={"limit": 7, "cursor": cursor})
                )
            assert [*first, *second] == got[:14]


def test_percentiles_by_key_over_months_read_the_monthly_sketches() -> None:
    """90 days of p50/p95 by key (or key and model) read whole months from the monthly sketch
    table by key and model; the counters come from the counter rollups, which hold no
    histogram; by key and status per day, from the hourly sketches by every dimension."""
    window = {"start": MONTH0 + timedelta(days=25), "end": MONTH0 + timedelta(days=115)}
    for group_by in ("key", "key,model"):
        q = SummaryQuery(group_by=group_by, **window)
        assert "usage_sketch_month_key_model" in str(sketch_statement("sqlite", q)[0])
    q = SummaryQuery(group_by="key,status", interval="day", **window)
    assert "usage_sketch_hour " in str(sketch_statement("sqlite", q)[0])
    for table in COUNTER_ROLLUPS:
        assert ROLLUPS[table].added == TOTALS and "lat_0" not in table.c
    for table in SKETCHES:
        assert ROLLUPS[table].added == SKETCH


def _old_layout(conn: Connection, batch: list[dict[str, Any]]) -> None:
    """The layout before the sketch tables: the histograms in the counter rollups that had
    them (all but those by key alone, by key and model, and the monthly ones), filled with the
    reference's rollups of `batch`; no sketch table."""
    lean = {hourly_key, daily_key, daily_key_model, monthly_key, monthly_key_model}
    lean.add(monthly_all_keys)
    for table in SKETCHES:
        table.drop(conn)
    for table in COUNTER_ROLLUPS:
        if table in lean:
            continue
        shape = ROLLUPS[table]
        table.drop(conn)
        old = Table(
            table.name,
            MetaData(),
            *(c._copy() for c in table.columns),
            *(Column(c, Integer, nullable=False, default=0) for c in SKETCH),
            **table.dialect_kwargs,
        )
        old.create(conn)
        names = ("bucket", *shape.dims, *TOTALS, *SKETCH)
        made = rollups(batch, shape.bucket_s, shape.dims, TOTALS + SKETCH)
        conn.execute(insert(old), [dict(zip(names, row, strict=True)) for row in made])
    conn.exec_driver_sql("DELETE FROM usage_schema WHERE version = 9")


async def test_a_store_with_histograms_in_its_rollups_gets_them_moved(store_url: str) -> None:
    """Opening a store whose counter rollups hold the histograms (its schema before version
    9) moves them into the sketch tables and rebuilds the rollups without them: every rollup
    and sketch table then holds the reference's rollups of the records, and every summary
    reads as before."""
    batch = _records(500)
    queries = [
        SummaryQuery(group_by=g, interval=i, start=s, end=e)
        for g in GROUPS
        for i in (None, "day")
        for s, e in RANGES[:3]
    ]
    async with _opened(store_url) as store:
        await store.insert(batch)
        before = [await store.summary(q) for q in queries]
        async with store.writer.begin() as conn:
            await conn.run_sync(_old_layout, batch)
    async with _opened(store_url) as store:
        async with store.writer.connect() as conn:
            for table, shape in ROLLUPS.items():
                read = select(*(table.c[c] for c in ("bucket", *shape.dims, *shape.added)))
                got = sorted(list(row) for row in await conn.execute(read))
                want = rollups(batch, shape.bucket_s, shape.dims, shape.added)
                assert got == [pytest.approx(r) for r in want], table.name
        after = [await store.summary(q) for q in queries]
        assert after == before
        assert await store.insert(batch[:10]) == 0
        assert await store.insert(_records(510)[500:]) == 10
