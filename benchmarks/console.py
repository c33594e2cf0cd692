"""The admin console's figures: every page's server time over `--records` synthetic records in
the usage store (target < 50 ms at 10 million), and the bytes of a full page load (HTML, CSS,
scripts and the first plot's data, which the page embeds; target < 300 KB).

    .venv/bin/python benchmarks/console.py [--records 1000000] [--keys 50] [--db PATH]
        [--backend sqlite|postgresql] [--pg-url URL]

Records spread evenly over the last 90 days up to now, over 1,000 key ids (the first `--keys`
of them real keys in the key store, so the Keys page finds their budgets and last use) and
20 models (benchmarks/usage_load.py's generator and bulk loader). A gateway (the real app, the
SQLite store or PostgreSQL's: a private server unless `--pg-url`,
the shared Redis at 127.0.0.1:6379 under a unique prefix, the mock upstream; its heap settled
after start as `python -m gateway` does) serves the console (raw records kept 400 days, so
none of the 90 are purged); after one untimed request to two other pages (the process's first
use), each page is requested once (its summaries computed) and 7 more times (the median,
within the console's shared summaries), measured at the client over loopback: the server's
time plus well under a millisecond. `--db` (or `--pg-url`) keeps the loaded store in PATH (that
database) and its keys in the key store, and a later run with the same `--db` (`--pg-url`)
reuses both when the store holds the records already.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import hashlib
import re
import statistics
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import aiohttp  # noqa: E402
from redis.asyncio import Redis  # noqa: E402

from benchmarks.usage_load import bulk_load  # noqa: E402
from gateway.keys.records import KeyCreate  # noqa: E402
from gateway.keys.store import KeyStore  # noqa: E402
from gateway.server.serve import settle_heap  # noqa: E402
from gateway.usage_store.store import UsageStore  # noqa: E402
from testkit.gateway_app import REDIS_URL, gateway_settings, start_gateway  # noqa: E402
from testkit.mock_upstream import MockUpstream  # noqa: E402
from testkit.postgres import PrivatePostgres  # noqa: E402

ADMIN = "bench-console-admin"
DAYS = 90
ASSET = re.compile(r'(?:href|src)="(/admin/ui/static/[^"]+)"')


async def load(url: str, n: int, real_keys: list[str]) -> None:
    """`n` records into the store at `url` by the bulk loader (unless it holds them already),
    the first keys' ids those of `real_keys`."""
    store = await UsageStore.open(url)
    try:
        have = await store.count()
        if have >= n:
            print(f"  (the store already holds {have:,} records)")
            return
        if have:
            sys.exit(f"the store holds {have:,} records, not {n:,}: give an empty one")
        now = datetime.fromtimestamp(time.time(), UTC)
        rate = await bulk_load(store, n, days=DAYS, now=now, key_ids=real_keys)
        print(f"  (loaded {n:,} records at {rate:,.0f}/s)")
        await store.run("ANALYZE")
    finally:
        await store.aclose()


async def median_ms(
    session: aiohttp.ClientSession, url: str, runs: int = 7
) -> tuple[float, float, int]:
    """(the first request's ms: its summaries computed; the median of `runs` more: within the
    console's few seconds of shared summaries; the body's bytes)."""
    began = time.perf_counter()
    async with session.get(url) as resp:
        assert resp.status == 200, (url, resp.status)
        await resp.read()
    first = (time.perf_counter() - began) * 1000
    times = []
    size = 0
    for _ in range(runs):
        began = time.perf_counter()
        async with session.get(url) as resp:
            body = await resp.read()
        times.append((time.perf_counter() - began) * 1000)
        size = len(body)
    return first, statistics.median(times), size


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=50)
    parser.add_argument("--db", type=Path, help="keep the store here (default: a temporary file)")
    parser.add_argument(
        "--backend",
        choices=("sqlite", "postgresql"),
        default="sqlite",
        help="postgresql: a private server (fsync on), or --pg-url",
    )
    parser.add_argument("--pg-url", help="postgresql+asyncpg://... of an empty database")
    args = parser.parse_args()
    # a kept store (--db, --pg-url) keeps its keys too: a later run finds their records
    kept = args.db is not None or args.pg_url is not None
    where = str(args.db.resolve()) if args.db is not None else str(args.pg_url)
    prefix = (
        f"bench-console-{hashlib.sha256(where.encode()).hexdigest()[:8]}:"
        if kept
        else f"bench-console-{uuid.uuid4().hex[:8]}:"
    )
    redis = Redis.from_url(REDIS_URL)
    keys = KeyStore(redis, prefix=prefix)
    real = [record.id for record in await keys.list()][: args.keys]
    for i in range(len(real), args.keys):
        budget = {"budget_tokens": 10**9, "budget_period": "month"} if i % 2 else {}
        _, record = await keys.create(
            KeyCreate.model_validate({"name": f"bench key {i}", **budget})
        )
        real.append(record.id)
    tmp = tempfile.TemporaryDirectory()
    pg = None
    if args.backend == "sqlite":
        db = args.db or Path(tmp.name) / "usage.db"
        url = f"sqlite+aiosqlite:///{db}"
    elif args.pg_url:
        url = args.pg_url
    else:
        pg = PrivatePostgres(durable=True)
        pg.start()
        url = pg.url()
    print(f"{args.records:,} records over {DAYS} days, {args.keys} real keys of 1,000 key ids")
    await load(url, args.records, real)
    mock = MockUpstream()
    await mock.start()
    settings = gateway_settings(
        mock,
        prefix,
        admin={"api_key": ADMIN},
        usage={"enabled": True, "url": url, "block_ms": 50, "retention_days": 400},
    )
    runner, root = await start_gateway(settings)
    settle_heap(settings.server.gc_young_threshold)  # as a served gateway does once started
    pages = [
        "overview?range=24h",
        "overview?range=7d",
        "overview?range=30d",
        "overview?range=90d",
        "overview?range=365d",
        f"overview?range=30d&key={real[1]}",
        "keys",
        f"keys/{real[1]}",
        "requests",
        f"requests?key={real[1]}",
        "requests?model=model-03&status=502",
        "usage?range=30d&group_by=key",
        "usage?range=90d&group_by=model",
        "usage?range=7d&group_by=provider&interval=hour",
        "usage.csv?range=30d&group_by=key",
        "live",
    ]
    try:
        jar = aiohttp.CookieJar(unsafe=True)
        async with aiohttp.ClientSession(cookie_jar=jar) as session:
            async with session.post(
                f"{root}/admin/ui/login", data={"admin_key": ADMIN}, allow_redirects=False
            ) as resp:
                assert resp.status == 303, resp.status
            # The process's own first use (templates compiled, the store's reader connections
            # opened) is no page's cost: Live and Requests (which share no summaries with the
            # pages below) are requested once first, untimed.
            for path in ("live", "requests"):
                async with session.get(f"{root}/admin/ui/{path}") as resp:
                    await resp.read()
            print("page server time: first request (computed) and median of 7 more (shared):")
            worst = 0.0
            for path in pages:
                first, ms, size = await median_ms(session, f"{root}/admin/ui/{path}")
                worst = max(worst, first)
                verdict = "ok" if first < 50 else "MISSED"
                print(
                    f"  {path:<48} {first:>8.1f} ms {ms:>8.1f} ms {size / 1024:>7.1f} KB  {verdict}"
                )
            print(f"  slowest first request: {worst:.1f} ms (target < 50 ms)")
            async with session.get(f"{root}/admin/ui/overview?range=30d") as resp:
                html = await resp.read()
            total, zipped = len(html), len(gzip.compress(html))
            for asset in sorted(set(ASSET.findall(html.decode()))):
                async with session.get(f"{root}{asset}") as resp:
                    body = await resp.read()
                total += len(body)
                zipped += len(gzip.compress(body))
            ok = "ok" if total < 300 * 1024 else "MISSED"
            print(
                f"full load of the Overview (HTML with its 5 plots' data, CSS, scripts): "
                f"{total / 1024:.1f} KB ({zipped / 1024:.1f} KB gzipped) target < 300 KB {ok}"
            )
    finally:
        await runner.cleanup()
        await mock.stop()
        stale = [k async for k in redis.scan_iter(match=f"{prefix}*", count=1000)]
        if stale and not kept:
            await redis.delete(*stale)
        await redis.aclose()
        tmp.cleanup()
        if pg is not None:
            pg.remove()


if __name__ == "__main__":
    asyncio.run(main())
