"""The usage store's tables and their versioned migrations, applied at start.

`usage_records`: one row per settled request (metadata only, never prompt or answer text),
unique by its Redis stream entry id, so storing a record twice stores it once, and stored in
(key, time) order, so one key's records over a range are read together.
`usage_hour` and `usage_day`: rollups by bucket start (epoch seconds, UTC) and the dimensions
key, model, provider, route (local/upstream), thinking, status and error code; counters add,
and the latency histograms (`sketch.py`) add column by column.
`usage_hour_all_keys` and `usage_day_all_keys`: the same with every key together (all the
dimensions but the key): what a summary that neither groups nor filters by key reads, its size
growing with models and periods, not with keys.
`usage_day_key_model`: per day, key and model, the counters and sums without the histograms,
keyed (key, model, day) so that totals per key or per key and model over a range are read in
key order: what a summary by key and model without percentiles reads.
`usage_hour_model_provider` and `usage_day_model_provider`: the same by model and provider only
(a few dozen rows a period): what a summary over every key by model and/or provider, or by
nothing but the period, reads (a console's plots).
`usage_hour_key` and `usage_day_key`: per key alone, the counters and sums without the
histograms (one row per active key a period): what a summary by key without percentiles reads
(a console's top keys, a key's budget use).
`usage_hour_total` and `usage_day_total`: every request of a period together, with the
histograms (one row a period): what a summary by nothing but the period reads (a console's
time series).
`usage_month_key`, `usage_month_key_model` and `usage_month_all_keys`: per UTC calendar month,
the counters and sums by key alone, by key and model, and by every dimension but the key: totals
over a range without percentiles read its whole months here, its other whole days from the
daily rollups and its part days from the hourly ones (a year by key: about 12 rows a key, not
365).
`usage_schema`: the versions applied.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import (
    BigInteger,
    Column,
    Connection,
    Float,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    func,
    insert,
    select,
)
from sqlalchemy.sql.schema import SchemaItem

from gateway.usage_store.buckets import DAY_S, HOUR_S, MONTH
from gateway.usage_store.sketch import BUCKETS
from plumbing.record import record

metadata = MetaData()

schema_versions = Table(
    "usage_schema",
    metadata,
    Column("version", Integer, primary_key=True),
    Column("applied_ms", BigInteger, nullable=False),
)

_RECORD_COLUMNS = (
    Column("record_id", String(40), nullable=False),  # the stream entry id
    Column("ts_ms", BigInteger, nullable=False),  # settlement time, epoch ms
    Column("request_id", String(128), nullable=False),
    Column("key_id", String(64), nullable=False),
    Column("model", String(200), nullable=False),
    Column("provider", String(100), nullable=False),
    Column("route_model", String(200), nullable=False),
    Column("route", String(16), nullable=False),  # local, upstream, or "" (never routed)
    Column("thinking", String(4), nullable=False),  # on, off, or ""
    Column("route_reason", String(100), nullable=False),
    Column("status", Integer, nullable=False),
    Column("error_code", String(100), nullable=False),
    Column("prompt_tokens", BigInteger, nullable=False),
    Column("cached_tokens", BigInteger, nullable=False),
    Column("completion_tokens", BigInteger, nullable=False),
    Column("reasoning_tokens", BigInteger, nullable=False),
    Column("max_tokens", BigInteger, nullable=False),
    Column("reserved_tokens", BigInteger, nullable=False),
    Column("charged_tokens", BigInteger, nullable=False),
    Column("cost", Float, nullable=False),
    Column("latency_ms", Float, nullable=False),
    Column("ttft_ms", Float, nullable=True),
)


def _records_table(name: str, meta: MetaData) -> Table:
    """The records table: keyed (key, time, id), without a rowid on SQLite, so that a key's
    records over a range lie together (one key's month is a range of pages, not a page per
    record); unique by record id (what makes a second insert store nothing) and indexed by time
    (the listings and exports over every key)."""
    return Table(
        name,
        meta,
        *(column._copy() for column in _RECORD_COLUMNS),
        PrimaryKeyConstraint("key_id", "ts_ms", "record_id", name=f"{name}_pkey"),
        sqlite_with_rowid=False,
    )


records = _records_table("usage_records", metadata)
# Requests that did not answer 200 (refused, failed: a few in a hundred) by status and time:
# a listing of one status reads its records newest first without passing over the others
# (`UsageStore.records` adds the index's condition to a query of such a status).
_NOT_OK = records.c.status != 200
_RECORD_INDEXES = (
    Index("usage_records_id", records.c.record_id, unique=True),
    Index("usage_records_ts", records.c.ts_ms),
    Index(
        "usage_records_not_ok",
        records.c.status,
        records.c.ts_ms,
        sqlite_where=_NOT_OK,
        postgresql_where=_NOT_OK,
    ),
)
# Columns a record listing and the CSV export show (all of a record's metadata).
RECORD_COLUMNS = tuple(c.name for c in records.columns)

DIMENSIONS = ("key_id", "model", "provider", "route", "thinking", "status", "error_code")
ALL_KEYS = DIMENSIONS[1:]  # the dimensions of the all-keys rollups
COUNTERS = (
    "requests",
    "errors",
    "prompt_tokens",
    "cached_tokens",
    "completion_tokens",
    "reasoning_tokens",
    "ttft_count",
)
SUMS = ("cost", "latency_sum_ms", "ttft_sum_ms")
LATENCY = tuple(f"lat_{i}" for i in range(BUCKETS))
TTFT = tuple(f"ttft_{i}" for i in range(BUCKETS))
ADDED = COUNTERS + SUMS + LATENCY + TTFT  # every rollup column that merges by addition


_DIMENSION_TYPES: dict[str, Any] = {
    "key_id": String(64),
    "model": String(200),
    "provider": String(100),
    "route": String(16),
    "thinking": String(4),
    "status": Integer,
    "error_code": String(100),
}


TOTALS = COUNTERS + SUMS  # the rollup columns without the histograms (a prefix of ADDED)


# PostgreSQL: room left on each page of a rollup, so that a row's update (a new version of it)
# stays on its page, where the indexes need no new entry (a HOT update): a batch updates
# thousands of rows, which halves its write-ahead log records.
_PG_ROLLUP_STORAGE = {"fillfactor": 70}


def _rollup(
    name: str,
    dims: tuple[str, ...],
    added: tuple[str, ...] = ADDED,
    key_first: bool = False,
    clustered: bool = False,
) -> Table:
    """A rollup table: primary key (bucket, *dims), or with `key_first` (*dims, bucket); the
    `added` columns. `key_first` and `clustered` tables have no rowid on SQLite: their rows are
    stored in primary-key order, so a range of it is read without a lookup per row (for narrow
    rows; wide ones keep the rowid)."""
    keyed: list[SchemaItem] = [Column(d, _DIMENSION_TYPES[d], primary_key=True) for d in dims]
    columns: list[SchemaItem] = [
        Column(c, BigInteger, nullable=False, default=0)
        if c in COUNTERS
        else Column(c, Float, nullable=False, default=0.0)
        if c in SUMS
        else Column(c, Integer, nullable=False, default=0)
        for c in added
    ]
    bucket = Column("bucket", BigInteger, primary_key=True)
    if key_first:
        key = PrimaryKeyConstraint(*dims, "bucket")
        return Table(
            name,
            metadata,
            *keyed,
            bucket,
            *columns,
            key,
            sqlite_with_rowid=False,
            postgresql_with=_PG_ROLLUP_STORAGE,
        )
    indexes = [Index(f"{name}_key_bucket", "key_id", "bucket")] if "key_id" in dims else []
    return Table(
        name,
        metadata,
        bucket,
        *keyed,
        *columns,
        *indexes,
        sqlite_with_rowid=not clustered,
        postgresql_with=_PG_ROLLUP_STORAGE,
    )


@record
class Rollup:
    bucket_s: int  # seconds, or buckets.MONTH
    dims: tuple[str, ...]
    added: tuple[str, ...]


KEY_MODEL = ("key_id", "model")
MODEL_PROVIDER = ("model", "provider")
KEY_ONLY = ("key_id",)
hourly = _rollup("usage_hour", DIMENSIONS)
daily = _rollup("usage_day", DIMENSIONS)
hourly_all_keys = _rollup("usage_hour_all_keys", ALL_KEYS)
daily_all_keys = _rollup("usage_day_all_keys", ALL_KEYS)
daily_key_model = _rollup("usage_day_key_model", KEY_MODEL, TOTALS, key_first=True)
hourly_model_provider = _rollup("usage_hour_model_provider", MODEL_PROVIDER)
daily_model_provider = _rollup("usage_day_model_provider", MODEL_PROVIDER)
hourly_key = _rollup("usage_hour_key", KEY_ONLY, TOTALS, clustered=True)
daily_key = _rollup("usage_day_key", KEY_ONLY, TOTALS, clustered=True)
hourly_total = _rollup("usage_hour_total", ())
daily_total = _rollup("usage_day_total", ())
monthly_key = _rollup("usage_month_key", KEY_ONLY, TOTALS, clustered=True)
monthly_key_model = _rollup("usage_month_key_model", KEY_MODEL, TOTALS, key_first=True)
monthly_all_keys = _rollup("usage_month_all_keys", ALL_KEYS, TOTALS)
ROLLUPS = {
    hourly: Rollup(HOUR_S, DIMENSIONS, ADDED),
    daily: Rollup(DAY_S, DIMENSIONS, ADDED),
    hourly_all_keys: Rollup(HOUR_S, ALL_KEYS, ADDED),
    daily_all_keys: Rollup(DAY_S, ALL_KEYS, ADDED),
    daily_key_model: Rollup(DAY_S, KEY_MODEL, TOTALS),
    hourly_model_provider: Rollup(HOUR_S, MODEL_PROVIDER, ADDED),
    daily_model_provider: Rollup(DAY_S, MODEL_PROVIDER, ADDED),
    hourly_key: Rollup(HOUR_S, KEY_ONLY, TOTALS),
    daily_key: Rollup(DAY_S, KEY_ONLY, TOTALS),
    hourly_total: Rollup(HOUR_S, (), ADDED),
    daily_total: Rollup(DAY_S, (), ADDED),
    monthly_key: Rollup(MONTH, KEY_ONLY, TOTALS),
    monthly_key_model: Rollup(MONTH, KEY_MODEL, TOTALS),
    monthly_all_keys: Rollup(MONTH, ALL_KEYS, TOTALS),
}
# How an insert makes each rollup's increments (`rollup_sql.py`): these grouped from the batch's
# records; every other one folded from the increments of the rollup it names (finer, holding
# its dimensions), in this order. Folding reads a batch's hourly groups, fewer than its records
# where traffic repeats a key, model and status within the hour.
FROM_RECORDS = (hourly,)
FOLDED_FROM = {
    hourly_all_keys: hourly,
    daily: hourly,
    daily_key_model: hourly,
    hourly_key: hourly,
    daily_all_keys: hourly_all_keys,
    monthly_all_keys: daily_all_keys,
    hourly_model_provider: hourly_all_keys,
    daily_model_provider: hourly_model_provider,
    hourly_total: hourly_model_provider,
    daily_total: hourly_total,
    daily_key: hourly_key,
    monthly_key: daily_key,
    monthly_key_model: daily_key_model,
}


def _v1(conn: Connection) -> None:
    for table in (records, hourly, daily):
        table.create(conn, checkfirst=True)


def _fill(conn: Connection, pairs: tuple[tuple[Table, Table], ...]) -> None:
    """Create each table and fill it with its source rollup summed over the dimensions it
    lacks."""
    for table, source in pairs:
        table.create(conn, checkfirst=True)
        shape = ROLLUPS[table]
        groups = [source.c.bucket, *(source.c[d] for d in shape.dims)]
        sums = [func.sum(source.c[c]).label(c) for c in shape.added]
        conn.execute(
            insert(table).from_select(
                ["bucket", *shape.dims, *shape.added], select(*groups, *sums).group_by(*groups)
            )
        )


def _v2(conn: Connection) -> None:
    """The all-keys rollups and the key x model totals, filled from the keyed rollups."""
    _fill(conn, ((hourly_all_keys, hourly), (daily_all_keys, daily), (daily_key_model, daily)))


def _v3(conn: Connection) -> None:
    """The rollups by model and provider and the totals by key alone, filled from the all-keys
    and the keyed ones."""
    _fill(
        conn,
        (
            (hourly_model_provider, hourly_all_keys),
            (daily_model_provider, daily_all_keys),
            (hourly_key, hourly),
            (daily_key, daily),
        ),
    )


def _v4(conn: Connection) -> None:
    """The totals of every request a period, filled from the rollups by model and provider."""
    _fill(conn, ((hourly_total, hourly_model_provider), (daily_total, daily_model_provider)))


def _v5(conn: Connection) -> None:
    """The monthly totals by key and of every key together, filled from the daily rollups."""
    _fill_months(conn, ((monthly_key, daily_key), (monthly_all_keys, daily_all_keys)))


def _v6(conn: Connection) -> None:
    """The monthly totals by key and model, filled from the daily ones."""
    _fill_months(conn, ((monthly_key_model, daily_key_model),))


def _fill_months(conn: Connection, pairs: tuple[tuple[Table, Table], ...]) -> None:
    """Create each monthly table and fill it from its daily one (folded here: month arithmetic
    the same on every database)."""
    from gateway.usage_store.rows import coarser  # rows builds on this module

    for table, source in pairs:
        table.create(conn, checkfirst=True)
        shape = ROLLUPS[table]
        read = select(source.c.bucket, *source.c[shape.dims], *source.c[shape.added])
        months = coarser(map(list, conn.execute(read)), MONTH, shape.dims, shape.dims)
        names = ("bucket", *shape.dims, *shape.added)
        rows = [dict(zip(names, month, strict=True)) for month in months]
        for start in range(0, len(rows), 1000):
            conn.execute(insert(table), rows[start : start + 1000])


def _v7(conn: Connection) -> None:
    """The records keyed by (key, time, id) (`_records_table`): copied, in that order, into the
    new table, which then takes the old one's name. Runs once, at the first start after an
    upgrade, and takes a while on a large store (`docs/performance.md`)."""
    rebuilt = _records_table("usage_records_v7", MetaData())
    rebuilt.create(conn)
    order = (records.c.key_id, records.c.ts_ms, records.c.record_id)
    conn.execute(insert(rebuilt).from_select(RECORD_COLUMNS, select(records).order_by(*order)))
    records.drop(conn)  # and its indexes
    conn.exec_driver_sql("ALTER TABLE usage_records_v7 RENAME TO usage_records")
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql(
            "ALTER TABLE usage_records RENAME CONSTRAINT usage_records_v7_pkey "
            "TO usage_records_pkey"
        )
    for index in _RECORD_INDEXES:
        index.create(conn)


def _v8(conn: Connection) -> None:
    """PostgreSQL: the rollups' pages keep room for their rows' updates (`_PG_ROLLUP_STORAGE`;
    pages written from now on)."""
    if conn.dialect.name != "postgresql":
        return
    storage = ", ".join(f"{name} = {value}" for name, value in _PG_ROLLUP_STORAGE.items())
    for table in ROLLUPS:
        conn.exec_driver_sql(f"ALTER TABLE {table.name} SET ({storage})")


def _v9(conn: Connection) -> None:
    """The index of the requests that did not answer 200 (`usage_records_not_ok`)."""
    for index in _RECORD_INDEXES:
        index.create(conn, checkfirst=True)


# Versioned migrations, in order; each runs once, in the transaction that records it.
MIGRATIONS: tuple[tuple[int, Callable[[Connection], None]], ...] = (
    (1, _v1),
    (2, _v2),
    (3, _v3),
    (4, _v4),
    (5, _v5),
    (6, _v6),
    (7, _v7),
    (8, _v8),
    (9, _v9),
)


def migrate(conn: Connection, now_ms: int) -> list[int]:
    """Apply the migrations `conn`'s database lacks (the caller holds the migration lock);
    returns the versions applied."""
    schema_versions.create(conn, checkfirst=True)
    have = set(conn.execute(select(schema_versions.c.version)).scalars())
    applied = []
    for version, step in MIGRATIONS:
        if version in have:
            continue
        step(conn)
        conn.execute(insert(schema_versions).values(version=version, applied_ms=now_ms))
        applied.append(version)
    return applied
