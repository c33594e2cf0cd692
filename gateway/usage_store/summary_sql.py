"""A summary's one statement: on the narrowest rollup that answers it (`rollup_for`), and for
totals over a range that is not whole days, on the daily rollup for the whole days in it and
the hourly rollup for the hours at its ends only, added up in the statement (a week up to now
reads 6 days and 24 hours, not 168 hours)."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from sqlalchemy import ColumnElement, Select, Table, func, literal, select, union_all

from gateway.usage_store.queries import COLUMN, SummaryQuery
from gateway.usage_store.rows import DAY_S, HOUR_S
from gateway.usage_store.schema import (
    COUNTERS,
    LATENCY,
    ROLLUPS,
    SUMS,
    TTFT,
    daily,
    daily_all_keys,
    daily_key,
    daily_key_model,
    daily_model_provider,
    daily_total,
    hourly,
    hourly_all_keys,
    hourly_key,
    hourly_model_provider,
    hourly_total,
)

# The rollups, fewest rows a period first (what the data makes of them, not their width: a
# period's total is one row, a day by model and provider a few dozen, by key and model one per
# key and model).
_NARROWEST_FIRST = (
    hourly_total,
    daily_total,
    hourly_model_provider,
    daily_model_provider,
    hourly_key,
    daily_key,
    hourly_all_keys,
    daily_all_keys,
    daily_key_model,
    hourly,
    daily,
)


Only = Mapping[str, Collection[Any]]  # dimension (query name) -> the values it may take


def summary_statement(
    dialect: str, q: SummaryQuery, only: Only | None = None
) -> tuple[Select[Any], dict[str, int]]:
    """The statement and, for each sum, its position in a result row (the period, with an
    interval, and the dimensions come first). `only`: the groups of these values alone (a
    plot's top groups)."""
    only = only or {}
    start = None if q.start is None else int(q.start.timestamp())
    end = None if q.end is None else int(q.end.timestamp())
    day_aligned = all(t is None or t % DAY_S == 0 for t in (start, end))
    dims = q.dimensions()
    used = {COLUMN[d] for d in dims} | set(q.equalities()) | {COLUMN[d] for d in only}
    added = COUNTERS + SUMS + ((LATENCY + TTFT) if q.latency else ())
    whole = None if day_aligned or q.interval is not None else _whole_days(start, end)
    if whole is None:
        table = rollup_for(used, q, day_aligned)
        low = None if start is None else start - start % ROLLUPS[table].bucket_s  # its bucket
        columns = _period(dialect, table, q.interval) + [table.c[COLUMN[d]].label(d) for d in dims]
        stmt = (
            select(*columns, *(func.sum(table.c[c]).label(c) for c in added))
            .where(*_within(table, q, only, low, end))
            .group_by(*columns)
            .order_by(*columns)
        )
        return stmt, {name: len(columns) + i for i, name in enumerate(added)}
    first, last = whole
    hours, days = rollup_for(used, q, False), rollup_for(used, q, True)
    parts = []
    if start is not None and start != first:
        parts.append(_part(hours, q, only, dims, added, start - start % HOUR_S, first))
    parts.append(_part(days, q, only, dims, added, first, last))
    if end is not None and end != last:
        parts.append(_part(hours, q, only, dims, added, last, end))
    both = union_all(*parts).subquery()
    groups = [both.c[d] for d in dims]
    stmt = (
        select(*groups, *(func.sum(both.c[c]).label(c) for c in added))
        .group_by(*groups)
        .order_by(*groups)
    )
    return stmt, {name: len(groups) + i for i, name in enumerate(added)}


def rollup_for(columns: set[str], q: SummaryQuery, day_aligned: bool) -> Table:
    """The narrowest rollup that answers a summary over `columns` (grouped or filtered): of its
    grain (hourly for an hourly interval or a range not in whole days), holding those columns,
    and the latency histograms when the summary reads p50/p95."""
    bucket_s = HOUR_S if q.interval == "hour" or not day_aligned else DAY_S
    for table in _NARROWEST_FIRST:
        shape = ROLLUPS[table]
        if (
            shape.bucket_s == bucket_s
            and columns <= set(shape.dims)
            and (not q.latency or LATENCY[0] in shape.added)
        ):
            return table
    raise AssertionError("the keyed rollups hold every dimension")


def _whole_days(start: int | None, end: int | None) -> tuple[int | None, int | None] | None:
    """The whole UTC days [first, last) inside [start, end) (None: unbounded on that side), or
    None when there is no whole day in it."""
    first = None if start is None else -(-start // DAY_S) * DAY_S
    last = None if end is None else end // DAY_S * DAY_S
    if first is not None and last is not None and first >= last:
        return None
    return first, last


def _part(
    table: Table, q: SummaryQuery, only: Only, dims: list[str], added: tuple[str, ...],
    low: int | None, high: int | None,
) -> Select[Any]:  # fmt: skip
    columns = [table.c[COLUMN[d]].label(d) for d in dims]
    return select(*columns, *(table.c[c].label(c) for c in added)).where(
        *_within(table, q, only, low, high)
    )


def _within(
    table: Table, q: SummaryQuery, only: Only, low: int | None, high: int | None
) -> list[ColumnElement[bool]]:
    """The query's equalities, `only`'s value sets, and buckets in [low, high) (None:
    unbounded)."""
    conditions: list[ColumnElement[bool]] = [
        table.c[column] == value for column, value in q.equalities().items()
    ]
    conditions.extend(table.c[COLUMN[d]].in_(list(values)) for d, values in only.items())
    if low is not None:
        conditions.append(table.c.bucket >= low)
    if high is not None:
        conditions.append(table.c.bucket < high)
    return conditions


def _period(dialect: str, table: Table, interval: str | None) -> list[ColumnElement[Any]]:
    if interval is None:
        return []
    if interval != "month":
        return [table.c.bucket.label("period")]
    if dialect == "sqlite":
        return [func.strftime("%Y-%m", table.c.bucket, literal("unixepoch")).label("period")]
    stamp = func.to_timestamp(table.c.bucket).op("AT TIME ZONE")(literal("UTC"))
    return [func.to_char(stamp, literal("YYYY-MM")).label("period")]
