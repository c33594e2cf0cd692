"""From a usage stream entry to a `usage_records` row, and from rows to rollup increments."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from gateway.usage_store.schema import ADDED, DIMENSIONS
from gateway.usage_store.sketch import bucket_of

HOUR_S, DAY_S = 3600, 86_400


def _int(value: str | None) -> int:
    try:
        return int(value or 0)
    except ValueError:
        return 0


def _float(value: str | None) -> float | None:
    try:
        number = float(value) if value else None
    except ValueError:
        return None
    return number if number is not None and math.isfinite(number) else None


def _ts_ms(value: str | None, entry_id: str) -> int:
    """The record's settlement time; the stream entry id's milliseconds when it has none."""
    try:
        return int(datetime.fromisoformat(value or "").timestamp() * 1000)
    except ValueError:
        return int(entry_id.split("-", 1)[0])


def row_of(entry_id: str, fields: Mapping[str, str], local: frozenset[str]) -> dict[str, Any]:
    """The row for stream entry `entry_id` (its `fields` decoded); `local`: the names of the
    local engine's providers (their route is "local", any other provider's "upstream").
    Any entry makes a storable row (text cut to its column, NUL removed: PostgreSQL refuses
    it), so that no record can stop the consumer."""
    if any("\x00" in value for value in fields.values()):
        fields = {k: v.replace("\x00", "") for k, v in fields.items()}
    provider = fields.get("provider", "")
    route = "" if not provider else ("local" if provider in local else "upstream")
    return {
        "record_id": entry_id,
        "ts_ms": _ts_ms(fields.get("ts"), entry_id),
        "request_id": fields.get("request_id", "")[:128],
        "key_id": fields.get("key_id", "")[:64],
        "model": fields.get("model", "")[:200],
        "provider": provider[:100],
        "route_model": fields.get("route_model", "")[:200],
        "route": route,
        "thinking": fields.get("thinking", "")[:4],
        "route_reason": fields.get("route_reason", "")[:100],
        "status": _int(fields.get("status")),
        "error_code": fields.get("error_code", "")[:100],
        "prompt_tokens": _int(fields.get("prompt_tokens")),
        "cached_tokens": _int(fields.get("cached_tokens")),
        "completion_tokens": _int(fields.get("completion_tokens")),
        "reasoning_tokens": _int(fields.get("reasoning_tokens")),
        "max_tokens": _int(fields.get("max_tokens")),
        "reserved_tokens": _int(fields.get("reserved_tokens")),
        "charged_tokens": _int(fields.get("charged_tokens")),
        "cost": _float(fields.get("cost")) or 0.0,
        "latency_ms": _float(fields.get("latency_ms")) or 0.0,
        "ttft_ms": _float(fields.get("ttft_ms")),
    }


def failed(row: Mapping[str, Any]) -> bool:
    return bool(row["status"] >= 400 or row["error_code"])


def rollups(rows: Iterable[Mapping[str, Any]], bucket_s: int) -> list[dict[str, Any]]:
    """Rollup increments of `rows` in buckets of `bucket_s` seconds, sorted by primary key
    (so concurrent writers lock rows in one order)."""
    groups: dict[tuple[Any, ...], dict[str, Any]] = {}
    for row in rows:
        bucket = row["ts_ms"] // 1000 // bucket_s * bucket_s
        pk = (bucket, *(row[d] for d in DIMENSIONS))
        group = groups.get(pk)
        if group is None:
            group = groups[pk] = dict.fromkeys(ADDED, 0)
            group["bucket"] = bucket
            group.update({d: row[d] for d in DIMENSIONS})
            group["cost"] = group["latency_sum_ms"] = group["ttft_sum_ms"] = 0.0
        group["requests"] += 1
        group["errors"] += failed(row)
        for name in ("prompt_tokens", "cached_tokens", "completion_tokens", "reasoning_tokens"):
            group[name] += row[name]
        group["cost"] += row["cost"]
        group["latency_sum_ms"] += row["latency_ms"]
        group[f"lat_{bucket_of(row['latency_ms'])}"] += 1
        if row["ttft_ms"] is not None:
            group["ttft_count"] += 1
            group["ttft_sum_ms"] += row["ttft_ms"]
            group[f"ttft_{bucket_of(row['ttft_ms'])}"] += 1
    return [groups[pk] for pk in sorted(groups)]
