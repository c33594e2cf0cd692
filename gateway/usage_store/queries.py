"""The admin API's usage queries (query-string parameters), validated."""

from __future__ import annotations

import base64
import binascii
import json
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

Dimension = Literal["key", "model", "provider", "route", "thinking", "status", "error_code"]
Interval = Literal["hour", "day", "month"]

# Query name -> column name.
COLUMN = {
    "key": "key_id",
    "model": "model",
    "provider": "provider",
    "route": "route",
    "thinking": "thinking",
    "status": "status",
    "error_code": "error_code",
}


def _utc(value: datetime | None) -> datetime | None:
    if value is None:
        return None
    try:
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    except OverflowError:  # 0001-01-01T00:00+01:00, say: no such UTC time
        raise ValueError("the time is out of range in UTC") from None


class Filters(BaseModel):
    """Equality filters and a time range [start, end) (UTC when no offset is given)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    key: str | None = None
    model: str | None = None
    provider: str | None = None
    route: Literal["local", "upstream", ""] | None = None
    thinking: Literal["on", "off", ""] | None = None
    status: int | None = Field(default=None, ge=0, le=999)
    error_code: str | None = None
    start: datetime | None = None
    end: datetime | None = None

    @field_validator("key", "model", "provider", "error_code")
    @classmethod
    def _storable(cls, value: str | None) -> str | None:
        if value is not None and ("\x00" in value or len(value) > 200):
            raise ValueError("must be at most 200 characters, without NUL")
        return value

    @field_validator("start", "end")
    @classmethod
    def _as_utc(cls, value: datetime | None) -> datetime | None:
        return _utc(value)

    @model_validator(mode="after")
    def _ordered(self) -> Filters:
        if self.start is not None and self.end is not None and self.start >= self.end:
            raise PydanticCustomError(
                "start_after_end",
                "'start' ({start}) must be before 'end' ({end}).",
                {"start": self.start.isoformat(), "end": self.end.isoformat()},
            )
        return self

    def equalities(self) -> dict[str, str | int]:
        return {
            COLUMN[name]: value for name in COLUMN if (value := getattr(self, name)) is not None
        }


_CURSOR_HELP = "pass the `next_cursor` of the page before, unchanged"


def encode_cursor(values: list[Any]) -> str:
    """A summary page's `next_cursor`: the last row's period and groups (`SummaryQuery`)."""
    text = json.dumps(values, separators=(",", ":"))
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def _decode_cursor(cursor: str) -> list[str | int]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        values = json.loads(raw)
    except (binascii.Error, ValueError):
        raise ValueError(_CURSOR_HELP) from None
    if not isinstance(values, list) or not all(
        isinstance(v, str | int) and not isinstance(v, bool) for v in values
    ):
        raise ValueError(_CURSOR_HELP)
    return values


class SummaryQuery(Filters):
    """`GET /admin/usage/summary`: rollup totals per group and period. `group_by`: comma-
    separated dimensions; `interval`: one row per period (none: the whole range); `latency`:
    include p50/p95 of TTFT and total latency. Rows come ordered by the period, then the
    groups; `limit`: at most this many (none: all), and the page's `next_cursor` passed back
    as `cursor` reads the rows after it."""

    group_by: str = ""
    interval: Interval | None = None
    latency: bool = True
    limit: int | None = Field(default=None, ge=1, le=1000)
    cursor: str | None = Field(default=None, max_length=2000)

    @field_validator("cursor")
    @classmethod
    def _readable(cls, value: str | None, info: ValidationInfo) -> str | None:
        """A cursor of this summary's rows: a period (with an interval) and each group."""
        if value is not None:
            group_by = info.data.get("group_by", "")
            names = {part.strip() for part in group_by.split(",") if part.strip()}
            width = len(names) + (info.data.get("interval") is not None)
            if len(_decode_cursor(value)) != width:
                raise ValueError(f"not a cursor of this summary's rows: {_CURSOR_HELP}")
        return value

    def order(self) -> list[str]:
        """What the rows are ordered by: the period (with an interval), then the groups."""
        return (["period"] if self.interval is not None else []) + self.dimensions()

    def after(self) -> list[str | int] | None:
        """The cursor's values (the last row before this page's, in `order`), or None."""
        return None if self.cursor is None else _decode_cursor(self.cursor)

    @field_validator("group_by")
    @classmethod
    def _known(cls, value: str) -> str:
        for name in (part.strip() for part in value.split(",") if part.strip()):
            if name not in COLUMN:
                raise PydanticCustomError(
                    "unknown_dimension",
                    "Unknown dimension '{name}' in 'group_by' (allowed: {allowed}; several "
                    "separated by commas).",
                    {"name": name, "allowed": ", ".join(COLUMN)},
                )
        return value

    def dimensions(self) -> list[str]:
        names = [part.strip() for part in self.group_by.split(",") if part.strip()]
        return list(dict.fromkeys(names))


class RecordsQuery(Filters):
    """`GET /admin/usage/records`: newest first; `cursor`: the previous page's `next_cursor`."""

    limit: int = Field(default=100, ge=1, le=1000)
    cursor: str | None = Field(default=None, pattern=r"^\d{1,16}:\d{1,20}-\d{1,20}$")


class ExportQuery(Filters):
    """`GET /admin/usage/export`: every record in the range as CSV, oldest first."""
