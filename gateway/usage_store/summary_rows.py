"""A summary's result rows as the admin API returns them (totals, cache hit rate, cost, p50/p95
read off the summed histograms)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any

from gateway.usage_store.queries import SummaryQuery
from gateway.usage_store.schema import LATENCY, TTFT
from gateway.usage_store.sketch import quantiles


@lru_cache(maxsize=4096)  # a summary's rows share a few hundred periods at most
def _period(value: Any, interval: str | None) -> str | None:
    if interval is None:
        return None
    if interval == "month":
        return f"{value}-01T00:00:00+00:00"
    return datetime.fromtimestamp(int(value), UTC).isoformat()


def _latency(hist: Sequence[Any], count: int, total: float) -> dict[str, Any]:
    p50, p95 = quantiles(hist, 0.5, 0.95)
    return {"avg": round(total / count, 1) if count else None, "p50": p50, "p95": p95}


def summary_row(
    row: Sequence[Any],
    at: dict[str, int],
    q: SummaryQuery,
    dims: list[str],
    sketch: Sequence[Any] = (),
) -> dict[str, Any]:
    """One summary row from a result row: `at` maps each sum's name to its position; the
    period (with an interval) and the dimensions come first. `sketch`: the row's histograms
    (`SKETCH` order), read when the summary asks for p50/p95."""
    out: dict[str, Any] = {}
    first = 0
    if q.interval is not None:
        out["period"] = _period(row[0], q.interval)
        first = 1
    for i, d in enumerate(dims, first):
        out[d] = row[i]
    requests = int(row[at["requests"]] or 0)
    prompt = int(row[at["prompt_tokens"]] or 0)
    cached = int(row[at["cached_tokens"]] or 0)
    out.update(
        requests=requests,
        errors=int(row[at["errors"]] or 0),
        prompt_tokens=prompt,
        cached_tokens=cached,
        completion_tokens=int(row[at["completion_tokens"]] or 0),
        reasoning_tokens=int(row[at["reasoning_tokens"]] or 0),
        cache_hit_rate=round(cached / prompt, 4) if prompt else None,
        cost=round(float(row[at["cost"]] or 0.0), 6),
    )
    if q.latency:
        n = len(LATENCY)
        total = float(row[at["latency_sum_ms"]] or 0)
        out["latency_ms"] = _latency(sketch[:n], requests, total)
        ttft = int(row[at["ttft_count"]] or 0)
        ttft_total = float(row[at["ttft_sum_ms"]] or 0)
        out["ttft_ms"] = _latency(sketch[n : n + len(TTFT)], ttft, ttft_total)
    return out
