"""A summary's rollup table (the narrowest that answers it) and its result rows as the admin
API returns them (totals, cache hit rate, cost, p50/p95 read off the summed histograms)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Table

from gateway.usage_store.queries import SummaryQuery
from gateway.usage_store.schema import (
    KEY_MODEL,
    KEY_ONLY,
    LATENCY,
    MODEL_PROVIDER,
    TTFT,
    daily,
    daily_all_keys,
    daily_key,
    daily_key_model,
    daily_model_provider,
    hourly,
    hourly_all_keys,
    hourly_key,
    hourly_model_provider,
)
from gateway.usage_store.sketch import quantiles


def rollup_for(columns: set[str], q: SummaryQuery, day_aligned: bool) -> Table:
    """The narrowest rollup that answers a summary over `columns` (grouped or filtered)."""
    if q.interval == "hour" or not day_aligned:
        if columns <= set(MODEL_PROVIDER):
            return hourly_model_provider
        if columns <= set(KEY_ONLY) and not q.latency:
            return hourly_key
        return hourly if "key_id" in columns else hourly_all_keys
    if columns <= set(MODEL_PROVIDER):
        return daily_model_provider
    if columns <= set(KEY_ONLY) and not q.latency:
        return daily_key
    if "key_id" not in columns:
        return daily_all_keys
    if columns <= set(KEY_MODEL) and not q.latency:
        return daily_key_model
    return daily


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
    row: Sequence[Any], at: dict[str, int], q: SummaryQuery, dims: list[str]
) -> dict[str, Any]:
    """One summary row from a result row: `at` maps each sum's name to its position; the
    period (with an interval) and the dimensions come first."""
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
        lat, ttft_at, n = at[LATENCY[0]], at[TTFT[0]], len(LATENCY)
        total = float(row[at["latency_sum_ms"]] or 0)
        out["latency_ms"] = _latency(row[lat : lat + n], requests, total)
        ttft = int(row[at["ttft_count"]] or 0)
        ttft_total = float(row[at["ttft_sum_ms"]] or 0)
        out["ttft_ms"] = _latency(row[ttft_at : ttft_at + n], ttft, ttft_total)
    return out
