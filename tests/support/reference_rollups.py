"""The rollups of usage rows, worked out in plain Python: the reference the store's rollups
(made by the database, `gateway/usage_store/rollup_sql.py`) are checked against."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gateway.usage_store.buckets import bucket_start
from gateway.usage_store.schema import ADDED, DIMENSIONS, LATENCY, TTFT
from gateway.usage_store.sketch import bucket_of


def rollups(
    rows: Iterable[Mapping[str, Any]],
    bucket_s: int,
    dims: tuple[str, ...] = DIMENSIONS,
    added: tuple[str, ...] = ADDED,
) -> list[list[Any]]:
    """Each group's values in the order of `bucket`, `dims`, `added`, sorted: the rows in
    buckets of `bucket_s` seconds (or buckets.MONTH) by the dimensions `dims`."""
    groups: dict[tuple[Any, ...], dict[str, Any]] = {}
    for row in rows:
        pk = (bucket_start(row["ts_ms"] // 1000, bucket_s), *(row[d] for d in dims))
        group = groups.setdefault(pk, {**dict.fromkeys(ADDED, 0), "cost": 0.0})
        group["requests"] += 1
        group["errors"] += row["status"] >= 400 or bool(row["error_code"])
        for name in ("prompt_tokens", "cached_tokens", "completion_tokens", "reasoning_tokens"):
            group[name] += row[name]
        group["cost"] += row["cost"]
        group["latency_sum_ms"] += row["latency_ms"]
        group[LATENCY[bucket_of(row["latency_ms"])]] += 1
        if row["ttft_ms"] is not None:
            group["ttft_count"] += 1
            group["ttft_sum_ms"] += row["ttft_ms"]
            group[TTFT[bucket_of(row["ttft_ms"])]] += 1
    return [[*pk, *(groups[pk][c] for c in added)] for pk in sorted(groups)]
