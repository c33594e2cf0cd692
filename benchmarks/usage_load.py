"""Synthetic usage records, and their bulk load into a usage store: the rows the consumer makes
of settlement's stream entries, generated in batches of a day's records and stored through the
store's own insert path (`UsageStore.insert`: the same records and the same rollups the
consumer writes), without Redis; each batch is generated while the store writes the one
before (SQLite writes in a thread of its own, PostgreSQL in its server).

Records are spread evenly over `DAYS` days up to `NOW` (1,000 keys, 20 models; each key uses
two of them), in settlement order, with ids that are valid stream entry ids (`{ms}-{seq}`,
rising), so that the same records can be XADDed with their ids and drained by the consumer.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from gateway.usage_store.store import UsageStore

KEYS, MODELS, DAYS = 1000, 20, 90
NOW = datetime(2026, 12, 1, tzinfo=UTC)  # the synthetic range ends here
PROVIDERS = ("deepseek", "taotoken", "local")
LOCAL = frozenset({"local"})  # the local engine's provider: its records' route is "local"


def synthetic(i: int, rng: random.Random, ts_ms: int) -> dict[str, Any]:
    """Record `i`: one `usage_records` row (as `rows.row_of` makes it), settled at `ts_ms`."""
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
        "route": "local" if provider in LOCAL else "upstream",
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


def stream_fields(row: Mapping[str, Any]) -> dict[str, str]:
    """A record's usage stream entry, as settlement writes it (its id: `record_id`)."""
    ts = datetime.fromtimestamp(row["ts_ms"] / 1000, UTC).isoformat()
    skip = ("record_id", "ts_ms", "route")
    return {"ts": ts, **{k: str(v) for k, v in row.items() if k not in skip}}


def spread(n: int, days: int = DAYS, now: datetime = NOW) -> Callable[[int], int]:
    """Record i's settlement time (epoch ms) of `n` records spread evenly over `days` days up
    to `now`."""
    first_ms = int((now.timestamp() - days * 86_400) * 1000)
    step_ms = days * 86_400_000 / n
    return lambda i: first_ms + int(i * step_ms)


def batches(
    n: int,
    batch: int,
    seed: int = 7,
    days: int = DAYS,
    now: datetime = NOW,
    key_ids: Sequence[str] = (),
) -> Iterator[list[dict[str, Any]]]:
    """The `n` records in settlement order, `batch` at a time (the same records for the same
    arguments); `key_ids`: the ids of the first keys (real keys of a key store), in place of
    their synthetic ids."""
    rng = random.Random(seed)
    at = spread(n, days, now)
    renamed = {f"key{i:04d}": key_id for i, key_id in enumerate(key_ids)}
    for start in range(0, n, batch):
        rows = [synthetic(i, rng, at(i)) for i in range(start, min(n, start + batch))]
        if renamed:
            for row in rows:
                row["key_id"] = renamed.get(row["key_id"], row["key_id"])
        yield rows


async def bulk_load(
    store: UsageStore,
    n: int,
    batch: int | None = None,
    seed: int = 7,
    days: int = DAYS,
    now: datetime = NOW,
    key_ids: Sequence[str] = (),
    progress: Callable[[int], None] | None = None,
) -> float:
    """Store `n` synthetic records (with their rollups) through `store.insert`, a batch (by
    default a day's records, at least 25,000) at a time, the next generated while the store
    writes the one before (`batches` for the other arguments). Returns records/s."""
    size = batch or max(25_000, -(-n // days))
    began = time.perf_counter()
    made = batches(n, size, seed, days, now, key_ids)
    writing: asyncio.Task[int] | None = None
    done = 0
    # (generated in a thread: the event loop drives the write meanwhile)
    while rows := await asyncio.to_thread(next, made, None):
        if writing is not None:
            done += await writing
            if progress is not None:
                progress(done)
        writing = asyncio.create_task(store.insert(rows))
    if writing is not None:
        done += await writing
    if done != n:
        raise RuntimeError(f"stored {done:,} of {n:,} records: the store was not empty")
    return n / (time.perf_counter() - began)
