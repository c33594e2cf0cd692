"""The rollups, made by the database from a batch's staged records.

A batch's new records are staged (a temporary table of their columns and their latency and
TTFT histogram buckets, `STAGED_COLUMNS`). The increments of `schema.FROM_RECORDS` are grouped
from them (the hourly rollup's with the histograms: the records are grouped once), each other
rollup's and sketch table's folded from a finer one's staged increments (`schema.FOLDED_FROM`),
each into its own staging table; then each adds its staged increments in one upsert, in key
order (concurrent writers lock rows in one order).

The histogram buckets are read in Python (`sketch.bucket_of`, exact at the buckets' edges);
the rest is SQL the same on SQLite and PostgreSQL but for a month's start and PostgreSQL's
sums of bigints (numeric, cast back)."""

from __future__ import annotations

from collections.abc import Mapping
from operator import itemgetter
from typing import Any

from sqlalchemy import Table

from gateway.usage_store.buckets import MONTH
from gateway.usage_store.schema import (
    COUNTERS,
    FOLDED_FROM,
    FROM_RECORDS,
    LATENCY,
    RECORD_COLUMNS,
    ROLLUPS,
    TTFT,
    records,
    staged_added,
)
from gateway.usage_store.sketch import bucket_of

# A staged record's columns: the record's, then its latency and TTFT buckets (-1: no TTFT).
STAGED_COLUMNS = (*RECORD_COLUMNS, "lat_b", "ttft_b")
_record_values = itemgetter(*RECORD_COLUMNS)


def staged(row: Mapping[str, Any]) -> tuple[Any, ...]:
    """A row's values in the order of `STAGED_COLUMNS`."""
    ttft = row["ttft_ms"]
    return (
        *_record_values(row),
        bucket_of(row["latency_ms"]),
        -1 if ttft is None else bucket_of(ttft),
    )


def stage(table: Table) -> str:
    """The name of `table`'s staging table (temporary: the connection's own)."""
    return f"usage_stage_{table.name.removeprefix('usage_')}"


def columns(table: Table) -> tuple[str, ...]:
    """A rollup's columns, in its upsert's order (and its staging table's, which may hold more
    after them: `staged_columns`)."""
    shape = ROLLUPS[table]
    return ("bucket", *shape.dims, *shape.added)


def staged_columns(table: Table) -> tuple[str, ...]:
    """The columns of a rollup's staging table (`schema.staged_added`)."""
    return ("bucket", *ROLLUPS[table].dims, *staged_added(table))


def _bucket(dialect: str, seconds: str, bucket_s: int) -> str:
    """The start of the bucket of `bucket_s` seconds (or of the UTC month) that holds the
    epoch second `seconds` (an integer expression)."""
    if bucket_s != MONTH:
        return f"{seconds} / {bucket_s} * {bucket_s}"
    if dialect == "postgresql":
        return (
            f"CAST(extract(epoch FROM date_trunc('month', to_timestamp({seconds}), 'UTC'))"
            " AS bigint)"
        )
    return f"unixepoch({seconds}, 'unixepoch', 'start of month')"


def _sum(dialect: str, column: str) -> str:
    """The sum of `column`, as its type: PostgreSQL sums bigints as numeric, cast back (no
    batch comes near the range's end)."""
    total = f"sum({column})"
    return f"CAST({total} AS bigint)" if dialect == "postgresql" and column in COUNTERS else total


def from_records(dialect: str, table: Table) -> str:
    """A SELECT of `table`'s staged increments grouped from the staged records
    (`staged_columns` order)."""
    shape = ROLLUPS[table]
    made = {
        "requests": "count(*)",
        "errors": "count(*) FILTER (WHERE status >= 400 OR error_code <> '')",
        **{c: _sum(dialect, c) for c in COUNTERS if c.endswith("_tokens")},
        "ttft_count": "count(ttft_ms)",
        "cost": "sum(cost)",
        "latency_sum_ms": "sum(latency_ms)",
        "ttft_sum_ms": "coalesce(sum(ttft_ms), 0)",
        **{c: f"count(*) FILTER (WHERE lat_b = {i})" for i, c in enumerate(LATENCY)},
        **{c: f"count(*) FILTER (WHERE ttft_b = {i})" for i, c in enumerate(TTFT)},
    }
    keys = "".join(f", {d}" for d in shape.dims)
    values = ", ".join(made[c] for c in staged_added(table))
    bucket = _bucket(dialect, "ts_ms / 1000", shape.bucket_s)
    return f"SELECT {bucket} AS bucket{keys}, {values} FROM {stage(records)} GROUP BY 1{keys}"


def folded(dialect: str, table: Table) -> str:
    """A SELECT of `table`'s increments folded from its source's staged increments: grouped on
    PostgreSQL; on SQLite each source row as it is, its bucket and dimensions at `table`'s
    grain (SQLite's upsert adds up the rows that share a key, at a third of what its sum() of
    each column costs; PostgreSQL's upsert may not touch a row twice in one statement)."""
    shape, source = ROLLUPS[table], FOLDED_FROM[table]
    keys = "".join(f", {d}" for d in shape.dims)
    bucket = _bucket(dialect, "bucket", shape.bucket_s)
    same = (ROLLUPS[source].bucket_s, ROLLUPS[source].dims) == (shape.bucket_s, shape.dims)
    if dialect == "sqlite" or same:  # (the same grain: each source row is one of `table`'s)
        return f"SELECT {bucket} AS bucket{keys}, {', '.join(shape.added)} FROM {stage(source)}"
    sums = ", ".join(_sum(dialect, c) for c in shape.added)
    return f"SELECT {bucket} AS bucket{keys}, {sums} FROM {stage(source)} GROUP BY 1{keys}"


def upsert(dialect: str, table: Table, increments: str, into: str | None = None) -> str:
    """Add the increments (a SELECT in `columns` order) to `table` (or, in `staged_columns`
    order, to `into`, its staging table): on PostgreSQL in key order (concurrent writers lock
    rows in one order); SQLite has one writer at a time."""
    shape = ROLLUPS[table]
    added = shape.added if into is None else staged_added(table)
    into = into or table.name
    cols = ", ".join(("bucket", *shape.dims, *added))
    keys = ", ".join(("bucket", *shape.dims))
    sets = ", ".join(f"{c} = {into}.{c} + excluded.{c}" for c in added)
    # (SQLite: an upsert's SELECT ends in a WHERE, lest ON read as a join's)
    order = f"ORDER BY {keys}" if dialect == "postgresql" else "WHERE true"
    return (
        f"INSERT INTO {into} ({cols}) SELECT * FROM ({increments}) AS increments {order} "
        f"ON CONFLICT ({keys}) DO UPDATE SET {sets}"
    )


# The rollups others fold from: their increments are staged (the rest go straight in).
FOLD_SOURCES = tuple(dict.fromkeys(FOLDED_FROM.values()))


def rollup_statements(dialect: str) -> list[str]:
    """The statements that add the staged records to every rollup, in order: each fold's
    source staged before what folds from it (on SQLite by upsert: its staging tables are keyed
    as their rollups), then every rollup's upsert."""
    made = {t: from_records(dialect, t) for t in FROM_RECORDS}
    made |= {t: folded(dialect, t) for t in FOLDED_FROM}
    statements = []
    for table in (t for t in made if t in FOLD_SOURCES):
        if dialect == "sqlite":
            statements.append(upsert(dialect, table, made[table], into=stage(table)))
        else:
            statements.append(
                f"INSERT INTO {stage(table)} ({', '.join(staged_columns(table))}) {made[table]}"
            )
    for table, increments in made.items():
        if table in FOLD_SOURCES:  # (its own columns of its staging table)
            increments = f"SELECT {', '.join(columns(table))} FROM {stage(table)}"
        statements.append(upsert(dialect, table, increments))
    return statements
