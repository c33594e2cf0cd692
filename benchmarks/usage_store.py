"""The usage store's figures, measured against their targets, on SQLite and PostgreSQL.

  - ingest: records/s from the Redis usage stream into the store through the consumer
    (XADDed first, then drained: read, insert with rollups, ack, trim), target >= 20,000/s;
  - queries over `--records` synthetic records (90 days, 1,000 keys, 20 models; each key
    uses two models): a 90-day daily summary by key and model (< 100 ms), a 24-hour hourly
    summary by model (< 50 ms), one key's month as CSV (> 100,000 rows/s); and, against the
    same 100 ms, two 90-day reports over all keys (daily totals; p95 by provider and model);
  - the store's size per million records.

    .venv/bin/python benchmarks/usage_store.py [--records 1000000] [--ingest 100000]
        [--batch-size 25000] [--backends sqlite,postgresql] [--pg-url URL] [--sqlite-file FILE]

`--sqlite-file` keeps the loaded SQLite store, so that a second run times the queries alone
(`--ingest 0` skips the ingest figure); so does a `--pg-url` database that holds `--records`
records already. A store loaded by `console.py` (its records up to the moment of its load) is
reused as well: the ranges then end at the next UTC midnight after its last record.

The targets are for 10 million records (`--records 10000000`, which takes long to load); the
summaries read the rollups, whose size grows with keys x models x days, not with records, so
their times at 1 million are close to those at 10 million. Without `--pg-url` a private
PostgreSQL server is started (initdb in a temporary directory; as the tests do). Needs the
shared Redis (127.0.0.1:6379) for the ingest figure (a stream under a unique key).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from redis.asyncio import Redis  # noqa: E402
from sqlalchemy import func, select  # noqa: E402
from sqlalchemy.engine import make_url  # noqa: E402

from benchmarks.usage_baselines import (  # noqa: E402
    by_time_index,
    layout_before,
    raw_daily_rows,
    timed,
)
from benchmarks.usage_load import (  # noqa: E402
    DAYS,
    KEYS,
    LOCAL,
    MODELS,
    NOW,
    bulk_load,
    generate,
    stream_fields,
)
from gateway.config.usage import UsageSettings  # noqa: E402
from gateway.usage_store.consumer import UsageConsumer  # noqa: E402
from gateway.usage_store.queries import ExportQuery, SummaryQuery  # noqa: E402
from gateway.usage_store.schema import records as records_table  # noqa: E402
from gateway.usage_store.store import UsageStore  # noqa: E402


def line(name: str, value: float, unit: str, target: str, ok: bool) -> None:
    print(f"  {name:<44} {value:>12,.1f} {unit:<10} target {target:<12} {'ok' if ok else 'MISSED'}")


async def ingest(store: UsageStore, n: int, batch_size: int) -> float:
    """Records/s through the consumer: `n` records XADDed, then drained into the store in
    batches of up to `batch_size`."""
    redis = Redis.from_url("redis://127.0.0.1:6379/0")
    stream = f"bench-usage-{uuid.uuid4().hex[:8]}:usage-log"
    now_ms = int(time.time() * 1000)
    try:
        for start in range(0, n, 10_000):
            # live traffic: settled moments ago, in order
            made = generate(start, min(n, start + 10_000), lambda i: now_ms - n + i, seed=1)
            async with redis.pipeline(transaction=False) as pipe:
                for row in made:
                    pipe.xadd(stream, stream_fields(row))  # type: ignore[arg-type]
                await pipe.execute()
        settings = UsageSettings(enabled=True, block_ms=10, batch_size=batch_size)
        consumer = UsageConsumer(
            redis, store, stream=stream, settings=settings, local_providers=LOCAL
        )
        await consumer.ensure_group()
        began = time.perf_counter()
        while await consumer.step(block_ms=10):
            pass
        elapsed = time.perf_counter() - began
        assert consumer.stored == n and await redis.xlen(stream) == 0
        return n / elapsed
    finally:
        await redis.delete(stream)
        await redis.aclose()


def _progress(done: int, _shown: list[int] = [0]) -> None:  # noqa: B006 (the last million shown)
    if done // 1_000_000 > _shown[0]:
        _shown[0] = done // 1_000_000
        print(f"    loaded {done:,}", flush=True)


async def export_rate(
    store: UsageStore, key: str | None, end: datetime, cursor: bool = False
) -> tuple[float, int]:
    """CSV rows/s of the 30 days' records before `end` (of one key, or all); `cursor`: read as
    the lines the database writes one by one, 5,000 a fetch, joined here (PostgreSQL's export
    before its COPY)."""
    start = end - timedelta(days=30)
    q = ExportQuery(key=key, start=start, end=end)
    began = time.perf_counter()
    rows = 0
    if cursor:
        async for part in store.export(q, 5000, lines=True):
            rows += ("\n".join([row[0] for row in part]) + "\n").encode().count(b"\n")
    else:
        async for chunk in store.export_csv(q):
            rows += chunk.count(b"\n")
    return rows / (time.perf_counter() - began), rows


async def bench(
    name: str,
    url: str,
    records: int,
    ingest_n: int,
    batch_size: int,
    reuse: bool = False,
    full: bool = False,
    compare_layout: bool = False,
) -> None:
    """`reuse`: the store holds the `records` synthetic records already (loaded by an earlier
    run, or by `console.py`); only the queries run. `full`: time the per-day summary by key
    and model unpaged too (seconds at a million records). `compare_layout`: time p50/p95 by
    key as the layout before the sketch tables read it, too (`layout_before`)."""
    print(f"{name}:")
    store = await UsageStore.open(url)
    sqlite_file = make_url(url).database if store.dialect == "sqlite" else None
    try:
        if reuse:
            print(f"  (reusing the {records:,} records loaded before)")
        else:
            if ingest_n:
                rate = await ingest(store, ingest_n, batch_size)
                line(
                    f"ingest via the consumer ({ingest_n:,})",
                    rate,
                    "records/s",
                    ">= 20,000",
                    rate >= 20_000,
                )
                await store.purge(NOW.timestamp() + 400 * 86_400, 1, 1)  # empty again
            loaded = await bulk_load(store, records, progress=_progress)
            print(f"  (loaded {records:,} synthetic records at {loaded:,.0f} records/s)")
            await store.run("ANALYZE")
        # the range's end: the synthetic one, or a reused store's (its last record's next day)
        end = NOW
        if reuse:
            async with store.writer.connect() as conn:
                last = select(func.max(records_table.c.ts_ms))
                last_ms = int((await conn.execute(last)).scalar_one())
            end = datetime.fromtimestamp(last_ms // 86_400_000 * 86_400 + 86_400, UTC)
            print(f"  (its range ends {end:%Y-%m-%d %H:%M} UTC)")
        start = end - timedelta(days=DAYS)
        daily = SummaryQuery(group_by="key,model", interval="day", start=start, end=end)
        for latency in (True, False):
            first = daily.model_copy(update={"limit": 1000, "latency": latency})
            ms = await timed(lambda q=first: store.summary_page(q))
            with_ = "with p50/p95" if latency else "without p50/p95"
            line(f"90-day per-day by key and model, 1st page {with_}", ms, "ms", "< 100", ms < 100)
            _, cursor = await store.summary_page(first)
            later = first.model_copy(update={"cursor": cursor})
            ms = await timed(lambda q=later: store.summary_page(q))
            line("  its second page", ms, "ms", "< 100", ms < 100)
        if full:
            ms = await timed(lambda: store.summary(daily), runs=1)
            line("  all 180,000 rows at once (reported)", ms, "ms", "", True)
            lean = daily.model_copy(update={"latency": False})
            ms = await timed(lambda: store.summary(lean), runs=1)
            line("  the same without p50/p95", ms, "ms", "", True)
        by_key = SummaryQuery(group_by="key", start=start, end=end)
        ms = await timed(lambda: store.summary(by_key))
        line("90-day p50/p95 by key (1,000 rows)", ms, "ms", "< 100", ms < 100)
        if compare_layout:
            old_ms = await layout_before(store, by_key)
            print(
                f"    (the layout before, histograms in the keyed daily rollup: {old_ms:,.1f} ms,"
            )
            print(f"     x{old_ms / ms:,.1f} the time of the sketch tables')")
        if sqlite_file is not None:
            ms = await timed(lambda: asyncio.to_thread(raw_daily_rows, sqlite_file, start, end))
            print(f"    (its rows read raw from the SQLite file, the floor: {ms:,.1f} ms)")
        total = SummaryQuery(group_by="key,model", start=start, end=end)
        ms = await timed(lambda: store.summary(total))
        line("90-day summary by key and model (totals)", ms, "ms", "< 100", ms < 100)
        plain = total.model_copy(update={"latency": False})
        ms = await timed(lambda: store.summary(plain))
        line("  the same without p50/p95", ms, "ms", "< 100", ms < 100)
        hourly = SummaryQuery(
            group_by="model", interval="hour", start=end - timedelta(days=1), end=end
        )
        ms = await timed(lambda: store.summary(hourly))
        line("24-hour hourly summary by model", ms, "ms", "< 50", ms < 50)
        # every key together (the all-keys rollups): the reports over all keys
        overview = SummaryQuery(interval="day", start=start, end=end)
        ms = await timed(lambda: store.summary(overview))
        line("90-day daily summary of all keys", ms, "ms", "< 100", ms < 100)
        by_provider = SummaryQuery(group_by="provider,model", start=start, end=end)
        ms = await timed(lambda: store.summary(by_provider))
        line("90-day p95 TTFT by provider and model", ms, "ms", "< 100", ms < 100)
        # one export takes milliseconds: the median over five keys, each exported once
        one_key = [await export_rate(store, f"key{k:04d}", end) for k in (142, 242, 342, 542, 942)]
        rate = statistics.median(r for r, _ in one_key)
        rows = round(statistics.median(n for _, n in one_key))
        line(
            f"CSV export of one key's month ({rows:,} rows, median of 5 keys)",
            rate,
            "rows/s",
            "> 100,000",
            rate > 100_000,
        )
        rate, rows = await export_rate(store, None, end)
        line(
            f"CSV export of every key's month ({rows:,} rows)",
            rate,
            "rows/s",
            "> 100,000",
            rate > 100_000,
        )
        if sqlite_file is not None:  # the export's path before its windows, for comparison
            old = await asyncio.to_thread(by_time_index, sqlite_file, end)
            print(f"    (every key's month read by the index by time: {old:,.0f} rows/s)")
        if store.dialect == "postgresql":  # the export's path before COPY, for comparison
            before = [
                await export_rate(store, f"key{k:04d}", end, cursor=True)
                for k in (142, 242, 342, 542, 942)
            ]
            old = statistics.median(r for r, _ in before)
            print(f"    (one key's month read through a cursor: {old:,.0f} rows/s)")
            old, _ = await export_rate(store, None, end, cursor=True)
            print(f"    (every key's month read through a cursor: {old:,.0f} rows/s)")
        size = await store.size_bytes() or 0
        per_million = size / 2**20 / records * 1e6
        print(f"  store size: {size / 2**20:,.1f} MiB, {per_million:,.1f} MiB per million records")
    finally:
        await store.aclose()


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--ingest", type=int, default=100_000)
    parser.add_argument("--backends", default="sqlite,postgresql")
    parser.add_argument(
        "--batch-size",
        type=int,
        default=UsageSettings().batch_size,
        help="the consumer's batch size for the ingest figure (default: the setting's default)",
    )
    parser.add_argument(
        "--full", action="store_true", help="time the unpaged per-day summary by key and model too"
    )
    parser.add_argument(
        "--compare-layout",
        action="store_true",
        help="time p50/p95 by key as the layout before the sketch tables read it, too",
    )
    parser.add_argument("--pg-url", help="postgresql+asyncpg://... (default: a private server)")
    parser.add_argument(
        "--sqlite-file",
        help="keep the SQLite store in this file; when it exists (a run before loaded it), "
        "only the queries run",
    )
    args = parser.parse_args()
    print(f"{args.records:,} records over {DAYS} days, {KEYS} keys, {MODELS} models")
    backends = args.backends.split(",")
    if "sqlite" in backends and args.sqlite_file:
        # kept: a second run with the same file and --records times the queries alone
        path = Path(args.sqlite_file)
        reuse = await asyncio.to_thread(path.exists)
        if reuse:
            store = await UsageStore.open(f"sqlite+aiosqlite:///{path}")
            found = await store.count()
            await store.aclose()
            if found != args.records:
                sys.exit(f"{path} holds {found:,} records, not --records {args.records:,}")
        await bench(
            "SQLite",
            f"sqlite+aiosqlite:///{path}",
            args.records,
            args.ingest,
            args.batch_size,
            reuse,
            args.full,
            args.compare_layout,
        )
    elif "sqlite" in backends:
        with tempfile.TemporaryDirectory() as tmp:
            url = f"sqlite+aiosqlite:///{tmp}/usage.db"
            await bench(
                "SQLite",
                url,
                args.records,
                args.ingest,
                args.batch_size,
                full=args.full,
                compare_layout=args.compare_layout,
            )
    if "postgresql" in backends:
        if args.pg_url:
            store = await UsageStore.open(args.pg_url)
            found = await store.count()
            await store.aclose()
            if found not in (0, args.records):
                sys.exit(f"{args.pg_url} holds {found:,} records, not --records {args.records:,}")
            await bench(
                "PostgreSQL",
                args.pg_url,
                args.records,
                args.ingest,
                args.batch_size,
                reuse=found == args.records,
                full=args.full,
                compare_layout=args.compare_layout,
            )
        else:
            from testkit.postgres import PrivatePostgres

            pg = PrivatePostgres(durable=True)
            pg.start()
            try:
                await bench(
                    "PostgreSQL (private server, fsync on)",
                    pg.url(),
                    args.records,
                    args.ingest,
                    args.batch_size,
                    full=args.full,
                    compare_layout=args.compare_layout,
                )
            finally:
                pg.remove()


if __name__ == "__main__":
    asyncio.run(main())
