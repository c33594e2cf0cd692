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

`--sqlite-file` keeps the loaded SQLite store, so that a second run times the queries alone (a
10-million-record load takes long; `--ingest 0` skips the ingest figure).

The targets are for 10 million records (`--records 10000000`, which takes long to load); the
summaries read the rollups, whose size grows with keys x models x days, not with records, so
their times at 1 million are close to those at 10 million. Without `--pg-url` a private
PostgreSQL server is started (initdb in a temporary directory; as the tests do). Needs the
shared Redis (127.0.0.1:6379) for the ingest figure (a stream under a unique key).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from redis.asyncio import Redis  # noqa: E402
from sqlalchemy.engine import make_url  # noqa: E402

from gateway.config.usage import UsageSettings  # noqa: E402
from gateway.usage_store.consumer import UsageConsumer  # noqa: E402
from gateway.usage_store.queries import ExportQuery, SummaryQuery  # noqa: E402
from gateway.usage_store.schema import COUNTERS, SUMS, daily_key_model  # noqa: E402
from gateway.usage_store.store import UsageStore  # noqa: E402

KEYS, MODELS, DAYS = 1000, 20, 90
NOW = datetime(2026, 12, 1, tzinfo=UTC)  # the synthetic range ends here
PROVIDERS = ("deepseek", "taotoken", "local")


def synthetic(i: int, rng: random.Random, ts_ms: int) -> dict[str, Any]:
    """One synthetic `usage_records` row (as `rows.row_of` makes them), settled at `ts_ms`."""
    key = rng.randrange(KEYS)
    model = (key + 7 * rng.randrange(2)) % MODELS  # each key uses two models
    provider = PROVIDERS[(key + model) % 3]
    failed = rng.random() < 0.02
    prompt = rng.randrange(50, 4000)
    latency = rng.lognormvariate(6.5, 0.6)
    return {
        "record_id": f"{ts_ms}-{i}",
        "ts_ms": ts_ms,
        "request_id": f"req_{i:012x}",
        "key_id": f"key{key:04d}",
        "model": f"model-{model:02d}",
        "provider": provider,
        "route_model": f"m{model}",
        "route": "local" if provider == "local" else "upstream",
        "thinking": "on" if rng.random() < 0.3 else "off",
        "route_reason": "route",
        "status": 502 if failed else 200,
        "error_code": "upstream_error" if failed else "",
        "prompt_tokens": prompt,
        "cached_tokens": prompt // 2,
        "completion_tokens": rng.randrange(10, 1500),
        "reasoning_tokens": 0,
        "max_tokens": 2000,
        "reserved_tokens": prompt + 2000,
        "charged_tokens": prompt + 500,
        "cost": prompt * 2e-7,
        "latency_ms": latency,
        "ttft_ms": latency / 4,
    }


def stream_fields(row: dict[str, Any]) -> dict[str, str]:
    ts = datetime.fromtimestamp(row["ts_ms"] / 1000, UTC).isoformat()
    skip = ("record_id", "ts_ms", "route")
    return {"ts": ts, **{k: str(v) for k, v in row.items() if k not in skip}}


def line(name: str, value: float, unit: str, target: str, ok: bool) -> None:
    print(f"  {name:<44} {value:>12,.1f} {unit:<10} target {target:<12} {'ok' if ok else 'MISSED'}")


async def ingest(store: UsageStore, n: int, batch_size: int) -> float:
    """Records/s through the consumer: `n` records XADDed, then drained into the store in
    batches of up to `batch_size`."""
    redis = Redis.from_url("redis://127.0.0.1:6379/0")
    stream = f"bench-usage-{uuid.uuid4().hex[:8]}:usage-log"
    rng = random.Random(1)
    try:
        for start in range(0, n, 10_000):
            async with redis.pipeline(transaction=False) as pipe:
                for i in range(start, min(n, start + 10_000)):
                    # live traffic: settled moments ago, in order
                    ts_ms = int(time.time() * 1000) - n + i
                    row = synthetic(10**9 + i, rng, ts_ms)
                    pipe.xadd(stream, stream_fields(row))  # type: ignore[arg-type]
                await pipe.execute()
        settings = UsageSettings(enabled=True, block_ms=10, batch_size=batch_size)
        consumer = UsageConsumer(
            redis, store, stream=stream, settings=settings, local_providers=frozenset({"local"})
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


async def load(store: UsageStore, n: int) -> float:
    rng = random.Random(7)
    began = time.perf_counter()
    batch = 5000
    first_ms = int((NOW.timestamp() - DAYS * 86_400) * 1000)
    step_ms = DAYS * 86_400_000 // n
    for start in range(0, n, batch):
        # in settlement order, as the consumer stores them: evenly over the 90 days
        await store.insert(
            [synthetic(i, rng, first_ms + i * step_ms) for i in range(start, min(n, start + batch))]
        )
        if start and start % 500_000 == 0:
            print(f"    loaded {start:,}", flush=True)
    return n / (time.perf_counter() - began)


def raw_daily_rows(path: str, start: datetime) -> int:
    """The 90-day daily summary by key and model's rows, without percentiles (the columns that
    summary reads), as Python tuples straight from sqlite3 (no grouping, no rows made): what
    any query path here must at least spend on that answer."""
    columns = ", ".join(("bucket", "key_id", "model", *COUNTERS, *SUMS))
    with contextlib.closing(sqlite3.connect(path)) as conn:
        found = conn.execute(
            f"SELECT {columns} FROM {daily_key_model.name} WHERE bucket >= ? AND bucket < ?",
            (int(start.timestamp()), int(NOW.timestamp())),
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


async def export_rate(store: UsageStore, key: str | None) -> tuple[float, int]:
    """CSV rows/s of the last 30 days' records (of one key, or all)."""
    start = NOW - timedelta(days=30)
    q = ExportQuery(key=key, start=start, end=NOW)
    began = time.perf_counter()
    rows = 0
    async for chunk in store.export_csv(q):
        rows += chunk.count(b"\n")
    return rows / (time.perf_counter() - began), rows


async def bench(
    name: str, url: str, records: int, ingest_n: int, batch_size: int, reuse: bool = False
) -> None:
    """`reuse`: the store holds the `records` synthetic records already (loaded by an earlier
    run with `--sqlite-file`); only the queries run."""
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
            loaded = await load(store, records)
            print(f"  (loaded {records:,} synthetic records at {loaded:,.0f} records/s)")
            await store.run("ANALYZE")
        start = NOW - timedelta(days=DAYS)
        daily = SummaryQuery(group_by="key,model", interval="day", start=start, end=NOW)
        ms = await timed(lambda: store.summary(daily))
        line("90-day daily summary by key and model", ms, "ms", "< 100", ms < 100)
        lean = daily.model_copy(update={"latency": False})
        ms = await timed(lambda: store.summary(lean))
        line("  the same without p50/p95", ms, "ms", "< 100", ms < 100)
        if sqlite_file is not None:
            ms = await timed(lambda: asyncio.to_thread(raw_daily_rows, sqlite_file, start))
            print(f"    (its rows read raw from the SQLite file, the floor: {ms:,.1f} ms)")
        total = SummaryQuery(group_by="key,model", start=start, end=NOW)
        ms = await timed(lambda: store.summary(total))
        line("90-day summary by key and model (totals)", ms, "ms", "< 100", ms < 100)
        plain = total.model_copy(update={"latency": False})
        ms = await timed(lambda: store.summary(plain))
        line("  the same without p50/p95", ms, "ms", "< 100", ms < 100)
        hourly = SummaryQuery(
            group_by="model", interval="hour", start=NOW - timedelta(days=1), end=NOW
        )
        ms = await timed(lambda: store.summary(hourly))
        line("24-hour hourly summary by model", ms, "ms", "< 50", ms < 50)
        # every key together (the all-keys rollups): the reports over all keys
        overview = SummaryQuery(interval="day", start=start, end=NOW)
        ms = await timed(lambda: store.summary(overview))
        line("90-day daily summary of all keys", ms, "ms", "< 100", ms < 100)
        by_provider = SummaryQuery(group_by="provider,model", start=start, end=NOW)
        ms = await timed(lambda: store.summary(by_provider))
        line("90-day p95 TTFT by provider and model", ms, "ms", "< 100", ms < 100)
        # one export takes milliseconds: the median over five keys, each exported once
        one_key = [await export_rate(store, f"key{k:04d}") for k in (42, 142, 342, 542, 942)]
        rate = statistics.median(r for r, _ in one_key)
        rows = round(statistics.median(n for _, n in one_key))
        line(
            f"CSV export of one key's month ({rows:,} rows, median of 5 keys)",
            rate,
            "rows/s",
            "> 100,000",
            rate > 100_000,
        )
        rate, rows = await export_rate(store, None)
        line(
            f"CSV export of every key's month ({rows:,} rows)",
            rate,
            "rows/s",
            "> 100,000",
            rate > 100_000,
        )
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
        )
    elif "sqlite" in backends:
        with tempfile.TemporaryDirectory() as tmp:
            url = f"sqlite+aiosqlite:///{tmp}/usage.db"
            await bench("SQLite", url, args.records, args.ingest, args.batch_size)
    if "postgresql" in backends:
        if args.pg_url:
            await bench("PostgreSQL", args.pg_url, args.records, args.ingest, args.batch_size)
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
                )
            finally:
                pg.remove()


if __name__ == "__main__":
    asyncio.run(main())
