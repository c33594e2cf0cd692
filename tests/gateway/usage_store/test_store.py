"""The usage store on SQLite and on a real PostgreSQL: idempotent inserts, rollups that match
the raw rows, the admin queries, retention and migrations."""

from __future__ import annotations

import contextlib
import csv
import io
import math
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select

from gateway.usage_store.queries import ExportQuery, RecordsQuery, SummaryQuery
from gateway.usage_store.rows import row_of
from gateway.usage_store.schema import RECORD_COLUMNS, ROLLUPS
from gateway.usage_store.sketch import ERROR_BOUND
from gateway.usage_store.store import UsageStore
from gateway.usage_store.summary_sql import summary_statement
from tests.support.reference_rollups import rollups
from tests.support.usage_records import stream_fields

DAY0 = datetime(2026, 3, 30, tzinfo=UTC).timestamp()  # 2026-03-30, two days before April


def rows(n: int, start_s: float = DAY0, step_s: float = 600.0) -> list[dict[str, object]]:
    return [
        row_of(f"{int((start_s + i * step_s) * 1000)}-{i}", stream_fields(i, start_s + i * step_s),
               frozenset())
        for i in range(n)
    ]  # fmt: skip


@contextlib.asynccontextmanager
async def _opened(store_url: str) -> AsyncIterator[UsageStore]:
    """The store at `store_url`, opened (which migrates it) and closed after."""
    store = await UsageStore.open(store_url)
    try:
        yield store
    finally:
        await store.aclose()


async def test_insert_is_idempotent_and_rollups_match_raw(store_url: str) -> None:
    store = await UsageStore.open(store_url)
    try:
        batch = rows(600)  # 600 records over ~4 days, 10 minutes apart
        assert await store.insert(batch[:400]) == 400
        assert await store.insert(batch[200:]) == 200  # 200 seen before: stored once
        assert await store.insert(batch) == 0
        assert await store.count() == 600
        for interval in ("hour", "day", "month", None):
            got = await store.summary(SummaryQuery(interval=interval))
            assert sum(r["requests"] for r in got) == 600
            assert sum(r["prompt_tokens"] for r in got) == 600 * 20
            assert sum(r["cached_tokens"] for r in got) == 600 * 5
            assert math.isclose(sum(r["cost"] for r in got), 0.6, rel_tol=1e-6)
        [total] = await store.summary(SummaryQuery())
        assert total["cache_hit_rate"] == 0.25
        exact = sorted(10 + i % 100 for i in range(600))
        for q, name in ((0.5, "p50"), (0.95, "p95")):
            truth = exact[math.ceil(q * 600) - 1]
            assert abs(total["latency_ms"][name] - truth) <= truth * ERROR_BOUND + 0.1
        assert total["latency_ms"]["avg"] == round(sum(exact) / 600, 1)
    finally:
        await store.aclose()


async def test_summary_groups_filters_and_periods(store_url: str) -> None:
    store = await UsageStore.open(store_url)
    try:
        batch = rows(300)
        failed = row_of("1-0", stream_fields(999, DAY0 + 30, status=502,
                                             error_code="upstream_error"), frozenset())  # fmt: skip
        await store.insert([*batch, failed])
        by_key = await store.summary(SummaryQuery(group_by="key,model"))
        assert {(r["key"], r["model"]) for r in by_key} == {
            (f"key{k}", f"model{m}") for k in range(3) for m in range(2)
        }
        assert sum(r["requests"] for r in by_key) == 301
        errors = await store.summary(SummaryQuery(group_by="status,error_code"))
        assert [(r["status"], r["error_code"], r["errors"]) for r in errors] == [
            (200, "", 0),
            (502, "upstream_error", 1),
        ]
        months = await store.summary(SummaryQuery(interval="month"))
        assert [r["period"] for r in months] == [
            "2026-03-01T00:00:00+00:00",
            "2026-04-01T00:00:00+00:00",
        ]
        start = datetime.fromtimestamp(DAY0, UTC) + timedelta(days=1)
        day = await store.summary(
            SummaryQuery(interval="hour", key="key1", start=start, end=start + timedelta(days=1))
        )
        assert len(day) == 24
        assert all(r["period"].startswith("2026-03-31T") for r in day)
        expected = sum(1 for i in range(300) if i % 3 == 1 and 86_400 <= i * 600 < 2 * 86_400)
        assert sum(r["requests"] for r in day) == expected
    finally:
        await store.aclose()


def _varied(n: int) -> list[dict[str, object]]:
    """Records over ~4 days across keys, models, providers, thinking and failures."""
    out = []
    for i in range(n):
        ts = DAY0 + i * 577.0
        fields = stream_fields(
            i,
            ts,
            model=f"model{i % 4}",
            provider=("mock", "engine")[i % 5 % 2],
            thinking=("on", "off")[i % 7 % 2],
            status=(200, 200, 200, 429, 502)[i % 5],
            error_code=("", "", "", "rate_limited", "upstream_error")[i % 5],
            latency_ms=f"{3 + (i * 37) % 900}.5",
            ttft_ms="" if i % 6 == 0 else f"{1 + (i * 11) % 90}.0",
        )
        out.append(row_of(f"{int(ts * 1000)}-{i}", fields, frozenset({"engine"})))
    return out


@pytest.mark.parametrize(
    ("group_by", "interval", "latency"),
    [
        ("key,model", "day", True),
        ("key,model", "day", False),
        ("model,status", "hour", True),
        ("provider", "month", False),
        ("key", None, False),
        ("model,thinking", None, True),
        ("", "day", True),
        ("", None, False),
    ],
)
async def test_summary_pages_read_as_the_whole_summary_in_order(
    store_url: str, group_by: str, interval: str | None, latency: bool
) -> None:
    """Page by page (`limit`, then each page's cursor), a summary reads as all of it at once,
    ordered by the period, then the groups; the last page has no cursor."""
    async with _opened(store_url) as store:
        await store.insert(_varied(700))
        # (a range that is not whole days: totals read whole days and part days together)
        window = {"start": datetime.fromtimestamp(DAY0 + 5400, UTC), "end": None}
        q = SummaryQuery(group_by=group_by, interval=interval, latency=latency, **window)
        whole = await store.summary(q)
        order = q.order()
        assert whole == sorted(whole, key=lambda r: [r[name] for name in order])
        for limit in (1, 3, len(whole), len(whole) + 1):
            pages, cursor = [], None
            while True:
                page, cursor = await store.summary_page(
                    q.model_copy(update={"limit": limit, "cursor": cursor})
                )
                assert len(page) <= limit and (cursor is None or len(page) == limit)
                pages.extend(page)
                if cursor is None:
                    break
            assert pages == whole


def _without_key(rows: list[dict[str, object]], dims: list[str]) -> dict[tuple[object, ...], dict]:
    """Summary rows grouped by `dims` plus the key, added up over the keys (counters only)."""
    out: dict[tuple[object, ...], dict] = {}
    for r in rows:
        group = tuple(r[d] for d in ["period", *dims] if d in r)
        total = out.setdefault(group, dict.fromkeys(("requests", "errors", "prompt_tokens"), 0))
        for name in total:
            total[name] += r[name]
    return out


async def test_summaries_without_the_key_read_what_the_keyed_rollups_add_up_to(
    store_url: str,
) -> None:
    """A summary that neither groups nor filters by key reads the all-keys rollups: the same
    totals as the keyed rollups summed over the keys, and the same p50/p95 (histograms add)."""
    store = await UsageStore.open(store_url)
    try:
        batch = _varied(700)
        await store.insert(batch[:450])
        await store.insert(batch[300:])  # overlapping: stored once, rolled up once
        start = datetime.fromtimestamp(DAY0, UTC)
        for interval, end in (("hour", timedelta(hours=30)), ("day", timedelta(days=3)),
                              ("month", timedelta(days=5)), (None, timedelta(days=5))):  # fmt: skip
            for dims in ([], ["model"], ["provider", "model"], ["provider", "route", "thinking"],
                         ["status", "error_code"]):  # fmt: skip
                window = {"interval": interval, "start": start, "end": start + end}
                plain = await store.summary(SummaryQuery(group_by=",".join(dims), **window))
                keyed = await store.summary(
                    SummaryQuery(group_by=",".join(["key", *dims]), **window)
                )
                assert _without_key(plain, dims) == _without_key(keyed, dims)
                assert sum(r["requests"] for r in plain) > 0
        [total] = await store.summary(SummaryQuery())
        assert total["requests"] == 700 and total["errors"] == 280
        exact = sorted(float(r["latency_ms"]) for r in batch)  # type: ignore[arg-type]
        ttft = sorted(float(r["ttft_ms"]) for r in batch if r["ttft_ms"] is not None)  # type: ignore[arg-type]
        for q, name in ((0.5, "p50"), (0.95, "p95")):
            truth = exact[math.ceil(q * len(exact)) - 1]
            assert abs(total["latency_ms"][name] - truth) <= truth * ERROR_BOUND + 0.1
            truth = ttft[math.ceil(q * len(ttft)) - 1]
            assert abs(total["ttft_ms"][name] - truth) <= truth * ERROR_BOUND + 0.1
        one_key = await store.summary(SummaryQuery(key="key1", group_by="model"))
        assert sum(r["requests"] for r in one_key) == sum(1 for i in range(700) if i % 3 == 1)
    finally:
        await store.aclose()


async def test_every_rollup_holds_what_its_rows_roll_up_to(store_url: str) -> None:
    """Each rollup, made by the database from batches that overlap (each row stored once),
    holds the reference's rollups of the rows at its grain (hours to months, across a month's
    end) and dimensions."""
    batch = _varied(700)
    async with _opened(store_url) as store:
        assert await store.insert(batch[:450]) == 450
        assert await store.insert(batch[300:]) == 250
        async with store.writer.connect() as conn:
            for table, shape in ROLLUPS.items():
                width = 1 + len(shape.dims)
                read = select(*(table.c[c] for c in ("bucket", *shape.dims, *shape.added)))
                got = sorted(list(row) for row in await conn.execute(read))
                want = rollups(batch, shape.bucket_s, shape.dims, shape.added)
                assert [r[:width] for r in got] == [r[:width] for r in want], table.name
                assert got == [pytest.approx(r) for r in want], table.name


async def test_summaries_by_key_and_model_without_percentiles_read_as_with_them(
    store_url: str,
) -> None:
    """A summary by key and/or model without percentiles reads the key x model totals: the same
    counters as the keyed rollups (read with percentiles), per day, month and range."""
    store = await UsageStore.open(store_url)
    try:
        batch = _varied(700)
        await store.insert(batch[:500])
        await store.insert(batch[250:])
        start = datetime.fromtimestamp(DAY0, UTC)
        counters = ("requests", "errors", "prompt_tokens", "cached_tokens", "completion_tokens",
                    "reasoning_tokens", "cache_hit_rate", "cost")  # fmt: skip
        for group_by, key in (("key,model", None), ("key", None), ("model", "key2"), ("", "key0")):
            for interval in ("day", "month", None):
                window = {"interval": interval, "start": start, "end": start + timedelta(days=4)}
                lean = await store.summary(
                    SummaryQuery(group_by=group_by, key=key, latency=False, **window)
                )
                full = await store.summary(SummaryQuery(group_by=group_by, key=key, **window))
                assert lean and len(lean) == len(full)
                for a, b in zip(lean, full, strict=True):
                    assert "latency_ms" not in a
                    assert {k: a[k] for k in counters} == pytest.approx({k: b[k] for k in counters})
                    assert [a.get(d) for d in ("period", "key", "model")] == [
                        b.get(d) for d in ("period", "key", "model")
                    ]
    finally:
        await store.aclose()


async def test_a_summary_of_only_some_groups_reads_as_those_rows_of_the_whole(
    store_url: str,
) -> None:
    """`only` (the console's plot of its top groups) keeps the groups whose dimensions take the
    given values: the same rows as the whole summary's, over periods, totals and part days."""
    store = await UsageStore.open(store_url)
    try:
        await store.insert(_varied(700))
        day0 = datetime.fromtimestamp(DAY0, UTC)
        cases = (
            ("key", {"key": ["key0", "key2"]}),
            ("model", {"model": ["model3"]}),
            ("status", {"status": [429, 200]}),
            ("key,model", {"key": ["key1"], "model": ["model0", "model2", "absent"]}),
            ("model", {"model": []}),
        )
        for group_by, only in cases:
            for interval in ("hour", "day", None):
                for start in (day0, day0 + timedelta(hours=5)):
                    q = SummaryQuery(group_by=group_by, interval=interval, start=start,
                                     end=day0 + timedelta(days=3, hours=2))  # fmt: skip
                    whole = await store.summary(q)
                    want = [r for r in whole if all(r[d] in v for d, v in only.items())]
                    got = await store.summary(q, only=only)
                    assert [{**r, "cost": pytest.approx(r["cost"])} for r in want] == got
                    assert got or not all(only.values())
    finally:
        await store.aclose()


async def test_totals_over_part_days_read_whole_days_and_the_hours_at_the_ends(
    store_url: str,
) -> None:
    """Totals over a range that is not whole days (whole days in it read from the daily
    rollups, the part days at its ends from the hourly ones, directly or as their day less its
    other hours) equal the hourly periods added up, for every table a summary may read; p50/p95
    stay within the histogram's bound; no group of the day that is not in the range shows."""
    store = await UsageStore.open(store_url)
    try:
        batch = _varied(700)  # ~4.7 days from DAY0
        await store.insert(batch)
        day0 = datetime.fromtimestamp(DAY0, UTC)
        counters = ("requests", "errors", "prompt_tokens", "cached_tokens", "completion_tokens",
                    "reasoning_tokens", "cost")  # fmt: skip
        for start, end in (
            (day0 + timedelta(hours=5, minutes=20), day0 + timedelta(days=3, hours=7)),
            (day0 + timedelta(hours=13), day0 + timedelta(days=2)),
            (day0 + timedelta(days=1), day0 + timedelta(days=3, minutes=1)),
            (None, day0 + timedelta(days=2, hours=1)),
            (day0 + timedelta(hours=23), None),
            # part days of more than half a day: the day less its other hours
            (day0 + timedelta(hours=2), day0 + timedelta(days=2, hours=20, minutes=5)),
            (day0 + timedelta(hours=10), day0 + timedelta(days=1, hours=15)),  # no whole day
            (day0 + timedelta(days=3, hours=1), day0 + timedelta(days=3, hours=23)),  # one day
            (day0 + timedelta(hours=3, minutes=59), day0 + timedelta(days=4, hours=23, seconds=1)),
        ):
            for group_by in ("", "key", "model", "key,model", "provider,status"):
                for latency in (True, False):
                    window = {"start": start, "end": end, "group_by": group_by, "latency": latency}
                    got = await store.summary(SummaryQuery(**window))
                    hours = await store.summary(SummaryQuery(interval="hour", **window))
                    dims = [d for d in group_by.split(",") if d]
                    expected: dict[tuple[object, ...], dict[str, float]] = {}
                    for r in hours:
                        total = expected.setdefault(
                            tuple(r[d] for d in dims), dict.fromkeys(counters, 0)
                        )
                        for name in counters:
                            total[name] += r[name]
                    assert {
                        tuple(r[d] for d in dims): {n: r[n] for n in counters} for r in got
                    } == {k: pytest.approx(v) for k, v in expected.items()}
                    # rollups count whole hours: the hours holding the range's ends
                    low = -math.inf if start is None else start.timestamp() // 3600 * 3600
                    high = math.inf if end is None else -(-end.timestamp() // 3600) * 3600
                    inside = [r for r in batch if low <= int(r["ts_ms"]) / 1000 < high]  # type: ignore[call-overload]
                    assert sum(r["requests"] for r in got) == len(inside) > 0
                    if latency and not dims:
                        [row] = got
                        exact = sorted(float(r["latency_ms"]) for r in inside)  # type: ignore[arg-type]
                        for q, name in ((0.5, "p50"), (0.95, "p95")):
                            truth = exact[math.ceil(q * len(exact)) - 1]
                            assert abs(row["latency_ms"][name] - truth) <= truth * ERROR_BOUND + 0.1
    finally:
        await store.aclose()


async def test_a_part_day_read_as_its_day_less_its_other_hours_keeps_only_what_is_inside(
    store_url: str,
) -> None:
    """From 03:00 to the next day's 01:00 the first part day is its day less its first three
    hours: a key whose only request came at 01:00 shows nowhere, the others exactly."""
    store = await UsageStore.open(store_url)
    try:
        day = datetime(2026, 6, 10, tzinfo=UTC)
        at = [(day + timedelta(hours=h)).timestamp() for h in (1, 10, 20, 24.5)]
        keys, latencies = ("early", "b", "b", "c"), (9, 40, 900, 5)
        batch = [
            row_of(f"{int(ts * 1000)}-{i}", stream_fields(i, ts, key_id=keys[i],
                   latency_ms=latencies[i]), frozenset())
            for i, ts in enumerate(at)
        ]  # fmt: skip
        await store.insert(batch)
        window = {"start": day + timedelta(hours=3), "end": day + timedelta(hours=25)}
        got = await store.summary(SummaryQuery(group_by="key", **window))
        assert [(r["key"], r["requests"]) for r in got] == [("b", 2), ("c", 1)]
        b = got[0]["latency_ms"]
        assert b["p50"] == pytest.approx(40, rel=ERROR_BOUND) and b["p95"] > 600
        [total] = await store.summary(SummaryQuery(**window))
        assert total["requests"] == 3 and total["cost"] == pytest.approx(0.003)
    finally:
        await store.aclose()


async def test_totals_by_key_read_whole_months_from_the_monthly_rollup(store_url: str) -> None:
    """Totals by key, or over every key by model or status, over ranges of several months
    (whole months from the monthly totals, the days and hours around them from the daily and
    hourly ones, a long part month as its month less its other days) equal the hourly periods
    added up, and so does a key's total over all time (the months alone)."""
    store = await UsageStore.open(store_url)
    try:
        first = datetime(2026, 1, 20, 3, 30, tzinfo=UTC).timestamp()
        batch = rows(500, start_s=first, step_s=5.3 * 3600)  # to 2026-05-10, every 5.3 hours
        await store.insert(batch[:300])
        await store.insert(batch[200:])
        counters = ("requests", "errors", "prompt_tokens", "completion_tokens", "cost")
        day = datetime(2026, 1, 1, tzinfo=UTC)
        for start, end in (
            (day + timedelta(days=25, hours=7), day + timedelta(days=100, hours=3)),
            (day + timedelta(days=31), day + timedelta(days=90)),  # February and March whole
            (day + timedelta(days=31), day + timedelta(days=59, hours=1)),  # one month
            (day + timedelta(days=40), day + timedelta(days=70)),  # no whole month
            (day + timedelta(days=40), day + timedelta(days=50)),  # ten days of one month
            # part months of more than half a month: the month less its other days
            (day + timedelta(days=4), day + timedelta(days=84)),
            (day + timedelta(days=33), day + timedelta(days=55, hours=6)),
            (None, day + timedelta(days=61, hours=5)),
            (day + timedelta(days=33, minutes=10), None),
            (None, None),
        ):
            for group, key in (
                ("key", None),
                ("key", "key1"),
                ("model", "key1"),  # by key and model
                ("model", None),
                ("status", None),
            ):
                window = {"start": start, "end": end, "key": key, "latency": False}
                got = await store.summary(SummaryQuery(group_by=group, **window))
                hours = await store.summary(SummaryQuery(group_by=group, interval="hour", **window))
                expected: dict[object, dict[str, float]] = {}
                for r in hours:
                    total = expected.setdefault(r[group], dict.fromkeys(counters, 0))
                    for name in counters:
                        total[name] += r[name]
                assert {r[group]: {n: r[n] for n in counters} for r in got} == {
                    k: pytest.approx(v) for k, v in expected.items()
                }
                assert sum(r["requests"] for r in got) > 0
        [everything] = await store.summary(SummaryQuery(group_by="key", key="key2", latency=False))
        assert everything["requests"] == sum(1 for r in batch if r["key_id"] == "key2")
    finally:
        await store.aclose()


def test_only_ranges_over_whole_months_read_the_monthly_rollup() -> None:
    def tables(group_by: str = "key", latency: bool = False, **window: object) -> str:
        q = SummaryQuery(group_by=group_by, latency=latency, **window)
        return str(summary_statement("sqlite", q)[0])

    day = datetime(2026, 1, 1, tzinfo=UTC)
    assert "usage_month_key" in tables(start=day + timedelta(days=25), end=day + timedelta(days=90))
    assert "usage_month_key" in tables()
    # February 10 to March 12: February less its first 9 days; February 10 to 20: days
    assert "usage_month_key" in tables(start=day + timedelta(days=40), end=day + timedelta(days=70))
    assert "usage_month_key" not in tables(
        start=day + timedelta(days=40), end=day + timedelta(days=50)
    )
    assert "usage_month_key" not in tables(start=day, end=day + timedelta(days=90), interval="day")
    by_key_model = {"group_by": "key,model", "start": day, "end": day + timedelta(days=90)}
    assert "usage_month_key_model" in tables(**by_key_model)
    # (with p50/p95 too: the histograms are read apart, from the sketch tables)
    assert "usage_month_key_model" in tables(**by_key_model, latency=True)
    by_model = {"group_by": "model,thinking,route", "start": day, "end": day + timedelta(days=90)}
    assert "usage_month_all_keys" in tables(**by_model)
    assert "lat_0" not in tables(**by_model, latency=True)


async def test_a_store_from_before_the_narrow_rollups_gets_them_filled(
    store_url: str,
) -> None:
    """Opening a store written before the all-keys rollups, the key x model totals, the rollups
    by model and provider or by key and the periods' totals existed (its schema at version 1)
    creates them from the keyed rollups, so every summary reads as before."""
    async with _opened(store_url) as store:
        await store.insert(_varied(400))
        before = [
            await store.summary(SummaryQuery(group_by=g, interval=i, latency=p))
            for g in ("model", "key,model", "")
            for i in ("day", "hour", None)
            for p in (True, False)
        ]
        for statement in (
            "DROP TABLE usage_hour_all_keys",
            "DROP TABLE usage_day_all_keys",
            "DROP TABLE usage_day_key_model",
            "DROP TABLE usage_hour_model_provider",
            "DROP TABLE usage_day_model_provider",
            "DROP TABLE usage_hour_key",
            "DROP TABLE usage_day_key",
            "DROP TABLE usage_hour_total",
            "DROP TABLE usage_day_total",
            "DROP TABLE usage_month_key",
            "DROP TABLE usage_month_all_keys",
            "DROP TABLE usage_month_key_model",
            "DELETE FROM usage_schema WHERE version >= 2",
        ):
            await store.run(statement)
    async with _opened(store_url) as store:
        after = [
            await store.summary(SummaryQuery(group_by=g, interval=i, latency=p))
            for g in ("model", "key,model", "")
            for i in ("day", "hour", None)
            for p in (True, False)
        ]
        assert after == before


async def test_a_store_with_records_by_id_gets_them_keyed_by_key_and_time(
    store_url: str,
) -> None:
    """Opening a store whose records table is keyed by record id alone (its schema before
    version 7) rebuilds it keyed by (key, time, id): every record kept, listings and exports
    unchanged, a record stored again still stored once."""
    batch = rows(120)
    async with _opened(store_url) as store:
        await store.insert(batch[:100])
        listing, _ = await store.records(RecordsQuery(key="key1", limit=1000))
        exported = [row async for chunk in store.export(ExportQuery()) for row in chunk]
        for statement in (
            "CREATE TABLE usage_records_old AS SELECT * FROM usage_records",
            "DROP TABLE usage_records",
            "ALTER TABLE usage_records_old RENAME TO usage_records",
            "CREATE UNIQUE INDEX usage_records_old_id ON usage_records (record_id)",
            "CREATE INDEX usage_records_ts ON usage_records (ts_ms)",
            "CREATE INDEX usage_records_key_ts ON usage_records (key_id, ts_ms)",
            "DELETE FROM usage_schema WHERE version = 7",
        ):
            await store.run(statement)
    async with _opened(store_url) as store:
        async with store.writer.connect() as conn:
            if store.dialect == "sqlite":
                found = await conn.exec_driver_sql(
                    "SELECT sql FROM sqlite_master WHERE name = 'usage_records'"
                )
                assert "WITHOUT ROWID" in found.scalar_one()
            else:
                found = await conn.exec_driver_sql(
                    "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = "
                    "i.indrelid AND a.attnum = ANY(i.indkey) WHERE i.indisprimary AND "
                    "i.indrelid = 'usage_records'::regclass ORDER BY array_position(i.indkey, "
                    "a.attnum)"
                )
                assert list(found.scalars()) == ["key_id", "ts_ms", "record_id"]
        assert await store.count() == 100
        assert (await store.records(RecordsQuery(key="key1", limit=1000)))[0] == listing
        assert [row async for chunk in store.export(ExportQuery()) for row in chunk] == exported
        assert await store.insert(batch) == 20  # the first 100 stored before: once
        assert await store.count() == 120


async def test_postgresql_rollups_keep_room_on_their_pages_for_updates(store_url: str) -> None:
    """On PostgreSQL every rollup table is created, or migrated, with a fillfactor below 100,
    so that updating a row can keep it on its page (no new index entries)."""
    if not store_url.startswith("postgresql"):
        pytest.skip("a PostgreSQL storage parameter")

    async def fillfactors(store: UsageStore) -> dict[str, list[str] | None]:
        async with store.writer.connect() as conn:
            found = await conn.exec_driver_sql(
                "SELECT relname, reloptions FROM pg_class WHERE relkind = 'r' AND relname "
                "LIKE 'usage\\_%' AND relname NOT IN ('usage_records', 'usage_schema')"
            )
            return {name: options for name, options in found}

    async with _opened(store_url) as store:
        created = await fillfactors(store)
        assert len(created) == len(ROLLUPS)
        assert all(o == ["fillfactor=70"] for o in created.values())
        for statement in (
            "ALTER TABLE usage_hour RESET (fillfactor)",
            "DELETE FROM usage_schema WHERE version = 8",
        ):
            await store.run(statement)
    async with _opened(store_url) as store:
        assert await fillfactors(store) == created


async def test_last_use_is_each_keys_latest_record(store_url: str) -> None:
    store = await UsageStore.open(store_url)
    try:
        assert await store.last_use([]) == {}
        batch = rows(30)  # key{i % 3}, 10 minutes apart
        await store.insert(batch)
        latest = {f"key{k}": max(int(r["ts_ms"]) for r in batch if r["key_id"] == f"key{k}")
                  for k in range(2)}  # fmt: skip
        assert await store.last_use(["key0", "key1", "key0", "nobody"]) == latest
    finally:
        await store.aclose()


async def test_records_page_newest_first_and_export_everything(store_url: str) -> None:
    store = await UsageStore.open(store_url)
    try:
        await store.insert(rows(250))
        seen: list[str] = []
        cursor = None
        while True:
            page, cursor = await store.records(RecordsQuery(key="key0", limit=30, cursor=cursor))
            seen += [r["request_id"] for r in page]
            if cursor is None:
                break
        assert seen == [f"req-{i}" for i in reversed(range(250)) if i % 3 == 0]
        exported = [row async for chunk in store.export(ExportQuery(), chunk=64) for row in chunk]
        assert len(exported) == 250
        assert len({r[0] for r in exported}) == 250
        # filtered by key and time, oldest first, every column as the records listing shows it
        start = datetime.fromtimestamp(DAY0 + 600 * 90, UTC)
        end = datetime.fromtimestamp(DAY0 + 600 * 180, UTC)
        q = ExportQuery(key="key0", start=start, end=end)
        exported = [tuple(row) async for chunk in store.export(q, chunk=7) for row in chunk]
        page, _ = await store.records(RecordsQuery(key="key0", start=start, end=end, limit=1000))
        expected = [tuple(r[c] for c in RECORD_COLUMNS) for r in reversed(page)]
        assert exported == expected and len(expected) == 30
    finally:
        await store.aclose()


async def test_the_csv_export_quotes_text_and_reads_back_as_the_records(store_url: str) -> None:
    store = await UsageStore.open(store_url)
    try:
        odd = {"route_reason": 'a, "quoted"\nline', "ttft_ms": "", "cost": "0.000123456789"}
        batch = rows(10) + [
            row_of("1774900000123-0", stream_fields(10, DAY0 + 7200.123, **odd), frozenset())
        ]
        await store.insert(batch)
        text = b"".join([part async for part in store.export_csv(ExportQuery(), chunk=4)])
        lines = list(csv.reader(io.StringIO(text.decode())))
        exported = [tuple(row) async for part in store.export(ExportQuery()) for row in part]
        assert len(lines) == len(exported) == 11
        for line, record in zip(lines, exported, strict=True):
            moment = datetime.fromtimestamp(record[1] / 1000, UTC)
            assert line[0] == moment.isoformat(timespec="milliseconds")
            for value, column, field in zip(line[1:], RECORD_COLUMNS, record, strict=True):
                if field is None:
                    assert value == "", column
                elif isinstance(field, float):
                    assert float(value) == pytest.approx(field, rel=1e-14), column
                else:
                    assert value == str(field), column
        assert lines[-1][RECORD_COLUMNS.index("route_reason") + 1] == 'a, "quoted"\nline'
    finally:
        await store.aclose()


async def test_retention_deletes_only_what_is_past_it(store_url: str) -> None:
    store = await UsageStore.open(store_url)
    try:
        await store.insert(rows(144))  # 144 records, 10 minutes apart: one day
        now = DAY0 + 2 * 86_400  # two days after the first
        deleted = await store.purge(now, retention_days=1, rollup_days=400)
        assert deleted["usage_records"] == 144 and deleted["usage_day"] == 0
        assert await store.count() == 0
        [total] = await store.summary(SummaryQuery())
        assert total["requests"] == 144  # the rollups outlive the raw rows
        # Rollups go by whole months: a cutoff at 06:00 on March 30 keeps March in every
        # rollup, so March 30 from 10:00 (the day less its first 10 hours) reads whole.
        deleted = await store.purge(DAY0 + 6 * 3600 + 86_400, retention_days=1, rollup_days=1)
        assert not any(deleted[t] for t in deleted if t != "usage_records")
        [kept] = await store.summary(SummaryQuery(start=datetime(2026, 3, 30, 10, tzinfo=UTC)))
        assert kept["requests"] == 144 - 60
        await store.purge(now, retention_days=1, rollup_days=1)  # March 31: March stays
        [kept] = await store.summary(SummaryQuery())
        assert kept["requests"] == 144
        await store.purge(DAY0 + 40 * 86_400, retention_days=1, rollup_days=1)  # May 8
        assert await store.summary(SummaryQuery()) == []
    finally:
        await store.aclose()


async def test_migrations_apply_once(store_url: str) -> None:
    store = await UsageStore.open(store_url)
    await store.insert(rows(10))
    await store.aclose()
    again = await UsageStore.open(store_url)  # nothing left to migrate; the data stays
    try:
        assert await again.count() == 10
    finally:
        await again.aclose()


async def test_any_stream_entry_is_storable(store_url: str) -> None:
    """Odd text (NUL, overlong) or numbers in an entry never stop the consumer's batch."""
    store = await UsageStore.open(store_url)
    try:
        odd = stream_fields(1, DAY0, request_id="a\x00b" * 100, model="m" * 500,
                            status="oops", latency_ms="nan", ttft_ms="")  # fmt: skip
        assert await store.insert([row_of("5-0", odd, frozenset()), *rows(3)]) == 4
        page, _ = await store.records(RecordsQuery(limit=10))
        [row] = [r for r in page if r["record_id"] == "5-0"]
        assert row["request_id"] == ("ab" * 100)[:128] and row["status"] == 0
        assert row["ttft_ms"] is None and row["latency_ms"] == 0.0
    finally:
        await store.aclose()


@pytest.mark.parametrize("url", ["sqlite+aiosqlite:///:memory:", "sqlite+aiosqlite://"])
async def test_a_sqlite_store_without_a_file_is_refused(url: str) -> None:
    with pytest.raises(ValueError, match="needs a file"):
        await UsageStore.open(url)


async def test_a_store_closed_twice_closes_once(store_url: str) -> None:
    store = await UsageStore.open(store_url)
    await store.insert(rows(3))
    await store.aclose()
    await store.aclose()
