"""A summary's statements: its counters on the narrowest counter rollup that answers it
(`rollup_for`), and, only when it reads p50/p95, its histograms on the narrowest sketch table
that does, over the same periods and groups (for a page, the page's rows alone). For totals
over a range, each reads the fewest rows that add up to them (`_pieces`): the monthly table
(by key, by key and model, or every key together) for its whole months, the daily one for its
other whole days, the hourly one for the hours at its ends, and a part period of more than half
its period as the period less the rest of it, added up in the statement (a week up to now reads
6 days and the hours of one part day; a year by key about 12 months, not 365 days; 90 days'
p50/p95 by key three months and a day a key)."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from sqlalchemy import ColumnElement, Select, Table, false, func, literal, select, tuple_, union_all

from gateway.usage_store.buckets import DAY_S, HOUR_S, MONTH, bucket_start, next_month
from gateway.usage_store.queries import COLUMN, SummaryQuery
from gateway.usage_store.schema import (
    ROLLUPS,
    SKETCH,
    TOTALS,
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
    monthly_all_keys,
    monthly_key,
    monthly_key_model,
    sketch_day_all_keys,
    sketch_day_key_model,
    sketch_day_model_provider,
    sketch_day_total,
    sketch_hour,
    sketch_hour_all_keys,
    sketch_hour_model_provider,
    sketch_hour_total,
    sketch_month_key_model,
)

# The counter rollups and the sketch tables, fewest rows a period first (what the data makes of
# them, not their width: a period's total is one row, a day by model and provider a few dozen,
# by key and model one per key and model).
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
_SKETCHES_NARROWEST_FIRST = (
    sketch_hour_total,
    sketch_day_total,
    sketch_hour_model_provider,
    sketch_day_model_provider,
    sketch_hour_all_keys,
    sketch_day_all_keys,
    sketch_day_key_model,
    sketch_hour,
)


Only = Mapping[str, Collection[Any]]  # dimension (query name) -> the values it may take


def summary_statement(
    dialect: str, q: SummaryQuery, only: Only | None = None
) -> tuple[Select[Any], dict[str, int]]:
    """The statement of the summary's counters and sums (`TOTALS`) and, for each, its position
    in a result row (the period, with an interval, and the dimensions come first, and order
    the rows). `only`: the groups of these values alone (a plot's top groups). With the
    query's `limit`, one row more than it (which tells that there is a next page), after the
    query's `cursor`."""
    return _statement(dialect, q, only or {}, None, None)


def sketch_statement(
    dialect: str, q: SummaryQuery, only: Only | None = None, through: list[Any] | None = None
) -> tuple[Select[Any], dict[str, int]]:
    """The statement of the summary's latency histograms (`SKETCH`, from the sketch tables):
    one row per period and group (those first, as in `summary_statement`) after the query's
    `cursor` and up to `through` (the last row of a page: its period and groups; None: to the
    end), over the same buckets and groups as the counters."""
    return _statement(dialect, q, only or {}, SKETCH, through)


def _statement(
    dialect: str,
    q: SummaryQuery,
    only: Only,
    sketch: tuple[str, ...] | None,
    through: list[Any] | None,
) -> tuple[Select[Any], dict[str, int]]:
    start = None if q.start is None else int(q.start.timestamp())
    end = None if q.end is None else int(q.end.timestamp())
    day_aligned = all(t is None or t % DAY_S == 0 for t in (start, end))
    dims = q.dimensions()
    used = {COLUMN[d] for d in dims} | set(q.equalities()) | {COLUMN[d] for d in only}
    added = TOTALS if sketch is None else sketch
    paged = sketch is None  # (the sketches of a page are bounded by `through` instead)
    pieces = _pieces(used, q, start, end, sketch is not None) if q.interval is None else []
    if len(pieces) <= 1:
        if pieces:
            table, low, end, _ = pieces[0]
        else:
            table = rollup_for(used, q, day_aligned, sketch is not None)
            low = None if start is None else bucket_start(start, ROLLUPS[table].bucket_s)
        hourly_table = ROLLUPS[table].bucket_s == HOUR_S
        days_of_hours = q.interval == "day" and day_aligned and hourly_table
        ordered = _period(dialect, table, q.interval, days_of_hours)
        ordered += [table.c[COLUMN[d]] for d in dims]
        columns = [c.label(name) for c, name in zip(ordered, q.order(), strict=True)]
        bounds = [*_after(ordered, q), *_through(ordered, through)]
        stmt = (
            select(*columns, *(func.sum(table.c[c]).label(c) for c in added))
            .where(*_within(table, q, only, low, end), *bounds)
            .group_by(*columns)
        )
        if paged:
            stmt = _paged(stmt.order_by(*columns), q)
        return stmt, {name: len(columns) + i for i, name in enumerate(added)}
    parts = [_part(*piece, q, only, dims, added, through) for piece in pieces]
    both = union_all(*parts).subquery()
    groups = [both.c[d] for d in dims]
    stmt = select(*groups, *(func.sum(both.c[c]).label(c) for c in added)).group_by(*groups)
    if paged:
        # a day less all its requests: none in range
        stmt = _paged(stmt.having(func.sum(both.c.requests) != 0).order_by(*groups), q)
    return stmt, {name: len(groups) + i for i, name in enumerate(added)}


def _after(ordered: list[ColumnElement[Any]], q: SummaryQuery) -> list[ColumnElement[bool]]:
    """The rows after the query's cursor in the order of `ordered` (a row-value comparison,
    which reads an index on those columns from that point)."""
    after = q.after()
    if after is None:
        return []
    if not ordered:  # the one row of a summary without period or groups was read
        return [false()]
    if len(ordered) == 1:
        return [ordered[0] > after[0]]
    # (the first column's bound too: what an index range is read by)
    return [ordered[0] >= after[0], tuple_(*ordered) > tuple_(*after)]


def _through(ordered: list[ColumnElement[Any]], through: list[Any] | None) -> list[Any]:
    """The rows up to and including `through` in the order of `ordered`."""
    if through is None or not ordered:
        return []
    if len(ordered) == 1:
        return [ordered[0] <= through[0]]
    return [ordered[0] <= through[0], tuple_(*ordered) <= tuple_(*through)]


def _paged(stmt: Select[Any], q: SummaryQuery) -> Select[Any]:
    return stmt if q.limit is None else stmt.limit(q.limit + 1)


Piece = tuple[Table, int | None, int | None, int]  # a rollup, its buckets in [low, high), +1/-1


def _pieces(
    used: set[str], q: SummaryQuery, start: int | None, end: int | None, sketch: bool
) -> list[Piece]:
    """Totals over [start, end) as the fewest rows that add up to them: the whole days in it
    (`_whole`: by month where there is a monthly rollup), and each part day at its ends from the
    hourly rollup: its hours, or when those are more than half the day, the day less the hours
    outside the range (which, for a range that ends now, hold nothing yet). Rollups count whole
    hours: the hours holding the range's ends. One piece: a single table."""
    low = None if start is None else start - start % HOUR_S
    first = None if low is None else -(-low // DAY_S) * DAY_S  # the first midnight in it
    last = None if end is None else end // DAY_S * DAY_S  # the last one
    if first is not None and last is not None and first > last:
        return []  # inside one day: its hours
    hours, days = rollup_for(used, q, False, sketch), rollup_for(used, q, True, sketch)
    pieces: list[Piece] = []
    if low is not None and first is not None and low != first:
        pieces += _part_of(hours, days, first - DAY_S, first, low, first)
    if first is None or last is None or first < last:
        pieces += _whole(days, first, last)
    if end is not None and last is not None and end != last:
        pieces += _part_of(hours, days, last, last + DAY_S, last, -(-end // HOUR_S) * HOUR_S)
    return pieces


def _part_of(fine: Table, coarse: Table, start: int, end: int, low: int, high: int) -> list[Piece]:
    """[low, high) inside the period [start, end) of the `coarse` rollup: from the `fine` one,
    or when that is more than half the period, the period less the rest of it."""
    if high - low <= (end - start) // 2:
        return [(fine, low, high, 1)]
    outside = [(fine, start, low, -1)] if low > start else []
    if high < end:
        outside.append((fine, high, end, -1))
    return [(coarse, start, end, 1), *outside]


def _whole(days: Table, first: int | None, last: int | None) -> list[Piece]:
    """The whole days [first, last) (None: unbounded). Where the daily rollup has a monthly one:
    its whole months from that, and each part month at its ends as its days, or the month less
    its other days (`_part_of`)."""
    months = _MONTHLY.get(days)
    if months is None:
        return [(days, first, last, 1)]
    pieces: list[Piece] = []
    low = first
    if first is not None and bucket_start(first, MONTH) != first:  # a part month first
        month = bucket_start(first, MONTH)
        after = next_month(month)
        high = after if last is None or last >= after else last
        pieces += _part_of(days, months, month, after, first, high)
        if last is not None and high >= last:
            return pieces
        low = high
    month_last = None if last is None else bucket_start(last, MONTH)
    if low is None or month_last is None or low < month_last:
        pieces.append((months, low, month_last, 1))
    if last is not None and month_last is not None and month_last != last:
        pieces += _part_of(days, months, month_last, next_month(month_last), month_last, last)
    return pieces


# The daily rollups that have monthly ones (the same dimensions and columns, by UTC month).
_MONTHLY = {
    daily_key: monthly_key,
    daily_key_model: monthly_key_model,
    daily_all_keys: monthly_all_keys,
    sketch_day_key_model: sketch_month_key_model,
}


def rollup_for(
    columns: set[str], q: SummaryQuery, day_aligned: bool, sketch: bool = False
) -> Table:
    """The narrowest counter rollup (with `sketch`, sketch table) that answers a summary over
    `columns` (grouped or filtered): of its grain (hourly for an hourly interval or a range not
    in whole days), holding those columns; for a page of a summary per period, one stored in
    period order (whose first page is read from the range's start, not sorted out of all of
    its rows)."""
    bucket_s = HOUR_S if q.interval == "hour" or not day_aligned else DAY_S
    by_period = q.interval is not None and q.limit is not None
    # (no daily sketch table holds the key with a dimension but the model: the hourly one's
    # days are read, `_period`)
    for grain in (bucket_s, HOUR_S) if sketch else (bucket_s,):
        for table in _SKETCHES_NARROWEST_FIRST if sketch else _NARROWEST_FIRST:
            shape = ROLLUPS[table]
            if (
                shape.bucket_s == grain
                and columns <= set(shape.dims)
                and not (by_period and table.primary_key.columns.values()[0].name != "bucket")
            ):
                return table
    raise AssertionError("the keyed rollups hold every dimension")


def _part(
    table: Table, low: int | None, high: int | None, sign: int, q: SummaryQuery, only: Only,
    dims: list[str], added: tuple[str, ...], through: list[Any] | None,
) -> Select[Any]:  # fmt: skip
    columns = [table.c[COLUMN[d]].label(d) for d in dims]
    sums = [(table.c[c] if sign > 0 else -table.c[c]).label(c) for c in added]
    grouped: list[ColumnElement[Any]] = [table.c[COLUMN[d]] for d in dims]  # (rows' order)
    bounds = [*_after(grouped, q), *_through(grouped, through)]
    return select(*columns, *sums).where(*_within(table, q, only, low, high), *bounds)


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


def _period(
    dialect: str, table: Table, interval: str | None, days_of_hours: bool = False
) -> list[ColumnElement[Any]]:
    if interval is None:
        return []
    if days_of_hours:  # (a summary per day of whole days, read from an hourly table)
        return [(table.c.bucket - table.c.bucket % DAY_S).label("period")]
    if interval != "month":
        return [table.c.bucket.label("period")]
    if dialect == "sqlite":
        return [func.strftime("%Y-%m", table.c.bucket, literal("unixepoch")).label("period")]
    stamp = func.to_timestamp(table.c.bucket).op("AT TIME ZONE")(literal("UTC"))
    return [func.to_char(stamp, literal("YYYY-MM")).label("period")]
