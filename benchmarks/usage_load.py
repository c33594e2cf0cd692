"""Synthetic usage records, and their bulk load into a usage store: the rows the consumer makes
of settlement's stream entries, generated in bulk (numpy, a batch of a day's records at a
time) and stored through the store's own insert path in its bulk mode (`UsageStore.bulk`: one
transaction, the backend's bulk settings; the same records and the same rollup statements as
the consumer's), without Redis; each batch is generated while the store writes the one before
(SQLite writes in a thread of its own, PostgreSQL in its server).

Records are spread evenly over `DAYS` days up to `NOW`, in settlement order, with ids that are
valid stream entry ids (`{ms}-{seq}`, rising), so that the same records can be XADDed with their
ids and drained by the consumer. What they hold, like an operator's traffic: 1,000 keys, a few
of them busy (a key's share falls with its number: key 0 about 3% of the records, the last
0.05%), 20 models (each key uses two or three of them), three providers (one of them the local
engine), thinking on for 30% of the answers, 40% of the answers not streamed (no TTFT); 2% of
the requests refused at admission (429 for rate or budget: no tokens, no route), 3% failed
(400, 502, 503, 504, each with its error code).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import numpy as np

from gateway.usage_store.schema import RECORD_COLUMNS
from gateway.usage_store.sketch import BUCKETS, bucket_of
from gateway.usage_store.store import UsageStore

KEYS, MODELS, DAYS = 1000, 20, 90
NOW = datetime(2026, 12, 1, tzinfo=UTC)  # the synthetic range ends here
PROVIDERS = ("deepseek", "taotoken", "local")
LOCAL = frozenset({"local"})  # the local engine's provider: its records' route is "local"
# (status, error code, share of the requests): refusals first, then failures; the rest 200
REFUSALS = ((429, "rate_limit_exceeded", 0.012), (429, "insufficient_quota", 0.008))
FAILURES = (
    (400, "upstream_bad_request", 0.005),
    (502, "upstream_error", 0.015),
    (503, "service_unavailable", 0.004),
    (504, "upstream_timeout", 0.006),
)
_OUTCOMES = ((200, "", 0.0), *REFUSALS, *FAILURES)
_EDGES = np.cumsum([share for _, _, share in _OUTCOMES[1:]])  # outcome i+1 below edge i
_KEY_NAMES = [f"key{k:04d}" for k in range(KEYS)]
_MODEL_NAMES = [f"model-{m:02d}" for m in range(MODELS)]
_ROUTE_MODELS = [f"m{m}" for m in range(MODELS)]
# by provider number (3: none, a request refused before routing)
_PROVIDER_NAMES = (*PROVIDERS, "")
_ROUTES = (*("local" if p in LOCAL else "upstream" for p in PROVIDERS), "")
_REASONS = ("route", "route", "route", "")


def spread(n: int, days: int = DAYS, now: datetime = NOW) -> Callable[[int], int]:
    """Record i's settlement time (epoch ms) of `n` records spread evenly over `days` days up
    to `now`."""
    first_ms = int((now.timestamp() - days * 86_400) * 1000)
    step_ms = days * 86_400_000 / n
    return lambda i: first_ms + int(i * step_ms)


def staged_batch(
    start: int,
    stop: int,
    at: Callable[[int], int],
    seed: int,
    key_ids: Sequence[str] = (),
    by_key: bool = False,
) -> list[tuple[Any, ...]]:
    """Records `start` to `stop`, each staged (`rollup_sql.staged`: a `usage_records` row as
    `rows.row_of` makes it, then its latency and TTFT buckets), settled at `at(i)`; drawn from a
    generator seeded by (`seed`, `start`); `key_ids`: the ids of the first keys, in place of
    their synthetic ids. In settlement order, or `by_key` in the records table's (key, time):
    each key's records go in after its last ones, not a page each."""
    n = stop - start
    rng = np.random.default_rng([seed, start])
    key = (KEYS * rng.random(n) ** 2).astype(np.int64)  # busy keys first
    model = (key + 7 * rng.choice(3, n, p=(0.6, 0.3, 0.1))) % MODELS
    outcome = np.searchsorted(_EDGES, rng.random(n), side="right") + 1
    outcome[outcome == len(_OUTCOMES)] = 0  # past the last edge: answered
    refused = (outcome >= 1) & (outcome <= len(REFUSALS))
    # provider: 0-2, PROVIDERS' (3: none, refused before routing)
    provider = np.where(refused, 3, (key + model) % 3)
    prompt = np.where(refused, 0, rng.integers(50, 4000, n))
    completion = np.where(outcome == 0, rng.integers(10, 1500, n), 0)
    thinking = np.where(refused, 2, (rng.random(n) < 0.3).astype(np.int64))
    reasoning = np.where(thinking == 1, completion // 3, 0)
    latency = np.where(refused, rng.random(n) * 2, rng.lognormal(6.5, 0.6, n))
    streamed = ~refused & (rng.random(n) < 0.6)
    ttft = latency / 4
    numbers = np.arange(start, stop)
    ts = np.array([at(i) for i in range(start, stop)], dtype=np.int64)
    reserved = np.where(refused, 0, prompt + 2000)
    names = list(_KEY_NAMES)
    names[: len(key_ids)] = key_ids
    if by_key:
        rank = np.argsort(np.argsort(np.array(names, dtype=object)))  # each key's name's rank
        order = np.lexsort((numbers, ts, rank[key]))
        key, model, outcome, provider, prompt, completion, thinking = (
            a[order] for a in (key, model, outcome, provider, prompt, completion, thinking)
        )
        reasoning, latency, streamed, ttft, numbers, ts, reserved = (
            a[order] for a in (reasoning, latency, streamed, ttft, numbers, ts, reserved)
        )
    status = [s for s, _, _ in _OUTCOMES]
    code = [c for _, c, _ in _OUTCOMES]
    routed = [not 1 <= o <= len(REFUSALS) for o in range(len(_OUTCOMES))]
    outcomes = outcome.tolist()
    prompts = prompt.tolist()
    completions = completion.tolist()
    models = model.tolist()
    providers = provider.tolist()
    ts_list = ts.tolist()
    numbers_list = numbers.tolist()
    ttfts: list[float | None] = ttft.tolist()
    for i in np.flatnonzero(~streamed).tolist():
        ttfts[i] = None
    ttft_b = _buckets(ttft)
    ttft_b[~streamed] = -1
    columns = (
        [f"{t}-{j}" for t, j in zip(ts_list, numbers_list, strict=True)],
        ts_list,
        [f"req_{j:012x}" for j in numbers_list],
        [names[k] for k in key.tolist()],
        [_MODEL_NAMES[m] for m in models],
        [_PROVIDER_NAMES[p] for p in providers],
        [_ROUTE_MODELS[m] if routed[o] else "" for m, o in zip(models, outcomes, strict=True)],
        [_ROUTES[p] for p in providers],
        [("off", "on", "")[t] for t in thinking.tolist()],
        [_REASONS[p] for p in providers],
        [status[o] for o in outcomes],
        [code[o] for o in outcomes],
        prompts,
        (prompt // 2).tolist(),
        completions,
        reasoning.tolist(),
        [2000] * n,
        reserved.tolist(),
        (prompt + completion).tolist(),
        (prompt * 2e-7 + completion * 8e-7).tolist(),
        latency.tolist(),
        ttfts,
        _buckets(latency).tolist(),
        ttft_b.tolist(),
    )
    return list(zip(*columns, strict=True))


def _buckets(ms: np.ndarray) -> np.ndarray:
    """`sketch.bucket_of` of each value: computed in bulk, and again one by one where a value
    lies so close to a bucket's edge that the two logarithms could differ."""
    with np.errstate(divide="ignore", invalid="ignore"):
        scaled = 2 * np.log2(ms)
    found = np.where(ms >= 1.0, np.minimum(np.floor(scaled).astype(np.int64) + 1, BUCKETS - 1), 0)
    near = np.flatnonzero((ms >= 1.0) & (np.abs(scaled - np.round(scaled)) < 1e-9))
    for i in near.tolist():
        found[i] = bucket_of(float(ms[i]))
    return found


def generate(
    start: int, stop: int, at: Callable[[int], int], seed: int, key_ids: Sequence[str] = ()
) -> list[dict[str, Any]]:
    """Records `start` to `stop` as `usage_records` rows (`staged_batch`'s, without their
    buckets), in settlement order."""
    return [
        dict(zip(RECORD_COLUMNS, row, strict=False))
        for row in staged_batch(start, stop, at, seed, key_ids)
    ]


def stream_fields(row: Mapping[str, Any]) -> dict[str, str]:
    """A record's usage stream entry, as settlement writes it (its id: `record_id`; no TTFT
    field for an answer without one)."""
    ts = datetime.fromtimestamp(row["ts_ms"] / 1000, UTC).isoformat()
    skip = ("record_id", "ts_ms", "route")
    return {
        "ts": ts,
        **{k: str(v) for k, v in row.items() if k not in skip and v is not None},
    }


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
    at = spread(n, days, now)
    for start in range(0, n, batch):
        yield generate(start, min(n, start + batch), at, seed, key_ids)


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
    """Store `n` synthetic records (with their rollups) into an empty store through its bulk
    mode (`UsageStore.bulk`), a batch (by default a day's records, at least 25,000) at a time,
    each in the records table's order, the next generated while the store writes the one
    before (`batches` for the other arguments). Returns records/s."""
    if await store.count():
        raise RuntimeError("the bulk load needs an empty store")
    size = batch or max(25_000, -(-n // days))
    began = time.perf_counter()
    at = spread(n, days, now)
    made = (
        staged_batch(start, min(n, start + size), at, seed, key_ids, by_key=True)
        for start in range(0, n, size)
    )
    done = 0
    async with store.bulk():
        writing: asyncio.Task[int] | None = None
        # (generated in a thread: the event loop drives the write meanwhile)
        while rows := await asyncio.to_thread(next, made, None):
            if writing is not None:
                done += await writing
                if progress is not None:
                    progress(done)
            writing = asyncio.create_task(store.insert_staged(rows))
        if writing is not None:
            done += await writing
    if done != n:
        raise RuntimeError(f"stored {done:,} of {n:,} records")
    return n / (time.perf_counter() - began)
