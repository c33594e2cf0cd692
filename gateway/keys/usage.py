"""Usage accounting: what one settled request adds to Redis, and the admin's queries over it.

Settlement (one Lua script, see `limiter.py`) adds per request:
  - counters in the hash `usage:{YYYY-MM-DD}` (UTC day), field `{key_id}|{metric}|{model}`,
    and the day to the set `usage-days`;
  - one entry in the capped stream `usage-log` (`UsageEntry.record`).
"""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime
from typing import Any

from redis.asyncio import Redis

from gateway.access.contract import Grant, Outcome
from gateway.keys.records import UsageQuery
from gateway.keys.store import KeySpace, text
from plumbing.record import record

METRICS = (
    "requests",
    "prompt_tokens",
    "completion_tokens",
    "reasoning_tokens",
    "cached_tokens",
    "errors",
)


# The usage stream entry's fields after `charged_tokens`, in the order settle.lua writes them:
# settlement sends their values only.
RECORD_FIELDS = (
    "ts",
    "request_id",
    "key_id",
    "model",
    "provider",
    "route_model",
    "thinking",
    "route_reason",
    "route",
    "prompt_tokens",
    "completion_tokens",
    "reasoning_tokens",
    "cached_tokens",
    "max_tokens",
    "reserved_tokens",
    "latency_ms",
    "ttft_ms",
    "status",
    "error_code",
    "cost",
)


def day_of(moment: datetime) -> str:
    return moment.astimezone(UTC).date().isoformat()


@record
class UsageEntry:
    """What one settled request adds: counter increments for its UTC day and a stream record."""

    day: str
    counters: dict[str, int]  # hash field -> increment
    record: dict[str, str]  # stream entry


def usage_entry(grant: Grant, outcome: Outcome, now: float, cost: float = 0.0) -> UsageEntry:
    """`cost`: what the request cost, in `usage.currency` (see gateway/usage_store/pricing.py)."""
    ticket, usage = grant.ticket, outcome.usage
    moment = datetime.fromtimestamp(now, UTC)
    failed = outcome.status >= 400 or outcome.error_code is not None
    tokens = (
        usage.prompt_tokens,
        usage.completion_tokens,
        usage.reasoning_tokens,
        usage.cached_prompt_tokens,
    )
    values = (1, *tokens, int(failed))  # in the order of METRICS
    key_id, model = ticket.principal.key_id, ticket.counted_model
    counters = {f"{key_id}|{name}|{model}": v for name, v in zip(METRICS, values, strict=True) if v}
    prompt, completion, reasoning, cached = (str(n) for n in tokens)
    ts = moment.isoformat()
    record = {
        "ts": ts,
        "request_id": ticket.request_id,
        "key_id": ticket.principal.key_id,
        "model": ticket.model,
        "provider": outcome.provider,
        "route_model": outcome.route_model,
        "thinking": _THINKING[outcome.thinking],
        "route_reason": outcome.route_reason,
        "route": outcome.route,
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "reasoning_tokens": reasoning,
        "cached_tokens": cached,
        "max_tokens": str(grant.max_tokens),
        "reserved_tokens": str(grant.reserved_tokens),
        "latency_ms": f"{outcome.latency_ms:.1f}",
        "ttft_ms": "" if outcome.ttft_ms is None else f"{outcome.ttft_ms:.1f}",
        "status": str(outcome.status),
        "error_code": outcome.error_code or "",
        "cost": f"{cost:.9g}",
    }
    return UsageEntry(day=ts[:10], counters=counters, record=record)


_THINKING = {None: "", True: "on", False: "off"}


class UsageReader:
    """Totals over the daily counters, optionally filtered and grouped."""

    def __init__(self, redis: Redis, *, prefix: str) -> None:
        self._redis = redis
        self.space = KeySpace(prefix)

    async def query(self, q: UsageQuery) -> dict[str, Any]:
        start = None if q.start is None else day_of(q.start)
        end = None if q.end is None else day_of(q.end)
        known = await self._redis.smembers(self.space.usage_days())
        days = sorted(
            day
            for day in (text(raw) for raw in known)
            if (start is None or day >= start) and (end is None or day <= end)
        )
        async with self._redis.pipeline(transaction=False) as pipe:
            for day in days:
                pipe.hgetall(self.space.usage_day(day))
            hashes = await pipe.execute()
        totals: dict[str, int] = dict.fromkeys(METRICS, 0)
        groups: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(METRICS, 0))
        for day, counters in zip(days, hashes, strict=True):
            for raw_field, raw_value in counters.items():
                key_id, metric, model = text(raw_field).split("|", 2)
                if (q.key_id is not None and key_id != q.key_id) or (
                    q.model is not None and model != q.model
                ):
                    continue
                value = int(raw_value)
                totals[metric] += value
                if q.group_by is not None:
                    group = {"day": day, "model": model, "key": key_id}[q.group_by]
                    groups[group][metric] += value
        label = {"day": "day", "model": "model", "key": "key_id", None: ""}[q.group_by]
        return {
            "object": "usage",
            "start": start,
            "end": end,
            "key_id": q.key_id,
            "model": q.model,
            "group_by": q.group_by,
            "totals": totals,
            "data": [{label: group, **groups[group]} for group in sorted(groups)],
        }
