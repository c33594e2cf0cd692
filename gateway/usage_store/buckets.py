"""Rollup buckets: fixed spans of seconds (an hour, a day) and UTC calendar months, each named
by its start in epoch seconds."""

from __future__ import annotations

from datetime import UTC, datetime

HOUR_S, DAY_S = 3600, 86_400
MONTH = 0  # a rollup's bucket size that means a UTC calendar month


def bucket_start(second: int, bucket_s: int) -> int:
    """The start of the bucket of `bucket_s` seconds (or of the MONTH) that holds `second`."""
    if bucket_s != MONTH:
        return second // bucket_s * bucket_s
    day = datetime.fromtimestamp(second, UTC)
    return int(datetime(day.year, day.month, 1, tzinfo=UTC).timestamp())


def next_month(month_s: int) -> int:
    """The start of the month after the one that starts at `month_s`."""
    return bucket_start(month_s + 32 * DAY_S, MONTH)
