"""The console's view filters, read from the URL (so a view can be shared): a range ending now,
an interval, and equality filters; turned into the usage store's own queries.

Day and month intervals align the range to whole UTC days, so their plots read the daily
rollup; an hour interval reads the hourly one. Every plot is one `UsageStore.summary` query."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from multidict import MultiMapping
from pydantic import ValidationError

from gateway.usage_store.queries import Dimension, Interval, RecordsQuery, SummaryQuery
from gateway.usage_store.query_errors import query_error

RANGES: dict[str, timedelta] = {
    "24h": timedelta(hours=24),
    "7d": timedelta(days=7),
    "30d": timedelta(days=30),
    "90d": timedelta(days=90),
    "365d": timedelta(days=365),
}
DEFAULT_INTERVAL: dict[str, Interval] = {
    "24h": "hour",
    "7d": "hour",
    "30d": "day",
    "90d": "day",
    "365d": "month",
}
INTERVALS: tuple[Interval, ...] = ("hour", "day", "month")
FILTERS = ("key", "model", "provider", "route", "status")
GROUPS: tuple[Dimension, ...] = (
    "key",
    "model",
    "provider",
    "route",
    "thinking",
    "status",
    "error_code",
)
HOUR = timedelta(hours=1)
DAY = timedelta(days=1)


class ViewError(ValueError):
    pass


@dataclass(frozen=True)
class View:
    range: str
    interval: Interval
    start: datetime
    end: datetime
    filters: dict[str, str] = field(default_factory=dict)
    group_by: Dimension = "model"

    def query(self, **extra: Any) -> dict[str, str]:
        """The URL query of this view (plus `extra`), for links that keep the filters."""
        params = {"range": self.range, "interval": self.interval, **self.filters}
        params.update({k: str(v) for k, v in extra.items() if v is not None})
        return params

    def summary(self, *, interval: bool, group_by: str = "", latency: bool = False) -> SummaryQuery:
        return _validated(
            SummaryQuery,
            {
                **self.filters,
                "start": self.start,
                "end": self.end,
                "interval": self.interval if interval else None,
                "group_by": group_by,
                "latency": latency,
            },
        )

    def periods(self) -> list[int]:
        """The start (epoch s) of every period of the range, for plots without gaps."""
        out: list[int] = []
        moment = self.start
        while moment < self.end:
            out.append(int(moment.timestamp()))
            if self.interval == "hour":
                moment += HOUR
            elif self.interval == "day":
                moment += DAY
            else:
                moment = (moment.replace(day=1) + timedelta(days=32)).replace(day=1)
        return out


def _validated(model: Any, params: dict[str, Any]) -> Any:
    try:
        return model.model_validate({k: v for k, v in params.items() if v is not None})
    except ValidationError as exc:
        raise ViewError(query_error(model, exc).message) from None


def read_view(query: MultiMapping[str], now_s: float | None = None) -> View:
    """The view of a URL's query (unknown values are a ViewError)."""
    name = query.get("range") or "7d"
    if name not in RANGES:
        raise ViewError(f"Unknown range '{name}' (one of {', '.join(RANGES)}).")
    interval = query.get("interval") or DEFAULT_INTERVAL[name]
    if interval not in INTERVALS:
        raise ViewError(f"Unknown interval '{interval}' (hour, day or month).")
    group = query.get("group_by") or "model"
    if group not in GROUPS:
        raise ViewError(f"Unknown grouping '{group}' (one of {', '.join(GROUPS)}).")
    now = datetime.fromtimestamp(time.time() if now_s is None else now_s, UTC)
    if interval == "hour":
        end = now.replace(minute=0, second=0, microsecond=0) + HOUR
    else:
        end = now.replace(hour=0, minute=0, second=0, microsecond=0) + DAY
    start = end - RANGES[name]
    if interval == "month":
        start = start.replace(day=1)
    filters = {f: v for f in FILTERS if (v := query.get(f, "").strip())}
    view = View(name, interval, start, end, filters, group)
    view.summary(interval=True)  # the filters are valid
    return view


def records_query(query: MultiMapping[str], limit: int = 50) -> RecordsQuery:
    """The Requests page's query: the equality filters, a time range (`start`, `end`; UTC
    without an offset) and a cursor, newest first."""
    names = (*FILTERS, "start", "end")
    params: dict[str, Any] = {f: v for f in names if (v := query.get(f, "").strip())}
    if cursor := query.get("cursor"):
        params["cursor"] = cursor
    params["limit"] = limit
    result: RecordsQuery = _validated(RecordsQuery, params)
    return result
