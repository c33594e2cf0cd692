"""The usage store's answers read the way they were read before (a benchmark's baselines, run
beside the current paths by `usage_store.py`): the bare cost of a summary's rows from sqlite3,
p50/p95 by key from a daily rollup with the histograms beside its counters, and SQLite's export
by the index by time."""

from __future__ import annotations

import contextlib
import sqlite3
import statistics
import time
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import text

from gateway.usage_store.export_sql import export_sql
from gateway.usage_store.queries import ExportQuery, SummaryQuery
from gateway.usage_store.schema import (
    COUNTERS,
    DIMENSIONS,
    SKETCH,
    SUMS,
    daily,
    daily_key_model,
    sketch_hour,
)
from gateway.usage_store.store import UsageStore
from gateway.usage_store.summary_rows import summary_row


def raw_daily_rows(path: str, start: datetime, end: datetime) -> int:
    """The 90-day daily summary by key and model's rows, without percentiles (the columns that
    summary reads), as Python tuples straight from sqlite3 (no grouping, no rows made): what
    any query path here must at least spend on that answer."""
    columns = ", ".join(("bucket", "key_id", "model", *COUNTERS, *SUMS))
    with contextlib.closing(sqlite3.connect(path)) as conn:
        found = conn.execute(
            f"SELECT {columns} FROM {daily_key_model.name} WHERE bucket >= ? AND bucket < ?",
            (int(start.timestamp()), int(end.timestamp())),
        ).fetchall()
    return len(found)


async def timed(coro_factory: Any, runs: int = 5) -> float:
    """Median ms of `runs` runs (after one warm-up)."""
    await coro_factory()
    times = []
    for _ in range(runs):
        began = time.perf_counter()
        await coro_factory()
        times.append((time.perf_counter() - began) * 1000)
    return statistics.median(times)


async def layout_before(store: UsageStore, q: SummaryQuery) -> float:
    """Median ms of `q` (p50/p95 by key over whole days) read as the layout before the sketch
    tables read it: one statement summing the counters and the histograms of the daily rollup
    by every dimension (here a copy of `usage_day` with the days of `usage_sketch_hour`'s
    histograms beside its counters, made for this and dropped after), and the same rows made
    of it."""
    assert q.start is not None and q.end is not None and q.interval is None
    dims = ", ".join(DIMENSIONS)
    added = (*COUNTERS, *SUMS, *SKETCH)
    both = ", ".join([*(f"d.{c}" for c in ("bucket", *DIMENSIONS, *COUNTERS, *SUMS))])
    both += ", " + ", ".join(f"s.{c}" for c in SKETCH)
    days = ", ".join(f"CAST(sum({c}) AS integer) AS {c}" for c in SKETCH)
    await store.run(
        f"CREATE TABLE bench_day_before AS SELECT {both} FROM {daily.name} d JOIN "
        f"(SELECT bucket - bucket % 86400 AS bucket, {dims}, {days} FROM {sketch_hour.name} "
        f"GROUP BY 1, {dims}) s USING (bucket, {dims})"
    )
    try:
        await store.run("ANALYZE bench_day_before")
        sums = ", ".join(f"sum({c})" for c in added)
        read = text(
            f"SELECT key_id, {sums} FROM bench_day_before WHERE bucket >= :low AND bucket < :high "
            "GROUP BY key_id ORDER BY key_id"
        )
        bounds = {"low": int(q.start.timestamp()), "high": int(q.end.timestamp())}
        at = {name: 1 + i for i, name in enumerate(added)}
        first = at[SKETCH[0]]

        async def before() -> list[dict[str, Any]]:
            async with store.writer.connect() as conn:
                found = (await conn.execute(read, bounds)).all()
            return [summary_row(row, at, q, ["key"], row[first:]) for row in found]

        assert await before() == await store.summary(q)  # the same answer
        return await timed(before)
    finally:
        await store.run("DROP TABLE bench_day_before")


def by_time_index(path: str, end: datetime) -> float:
    """Rows/s of every key's month before `end` as SQLite's export read it before its windows
    (`export_sql`: one statement, by the index by time, each record looked up)."""
    q = ExportQuery(start=end - timedelta(days=30), end=end)
    sql, params = export_sql("sqlite", q, lines=True)
    began = time.perf_counter()
    rows = 0
    with contextlib.closing(sqlite3.connect(path)) as conn:
        cursor = conn.execute(sql, params)
        while part := cursor.fetchmany(5000):
            rows += ("\n".join([row[0] for row in part]) + "\n").encode().count(b"\n")
    return rows / (time.perf_counter() - began)
