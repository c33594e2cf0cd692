"""The usage store's tables (`migrations.py` creates and migrates them at start).

`usage_records`: one row per settled request (metadata only, never prompt or answer text),
unique by its Redis stream entry id, so storing a record twice stores it once, and stored in
(key, time) order, so one key's records over a range are read together.
`usage_hour` and `usage_day`: rollups by bucket start (epoch seconds, UTC) and the dimensions
key, model, provider, route (local/upstream), thinking, status and error code: the counters
and sums, which add. No counter rollup holds a latency histogram: those are the sketch tables'
(below), read only by a summary that asks for p50/p95.
`usage_hour_all_keys` and `usage_day_all_keys`: the same with every key together (all the
dimensions but the key): what a summary that neither groups nor filters by key reads, its size
growing with models and periods, not with keys.
`usage_day_key_model`: per day, key and model, the counters and sums, keyed (key, model,
day) so that totals per key or per key and model over a range are read in key order: what a
summary by key and model reads.
`usage_hour_model_provider` and `usage_day_model_provider`: the same by model and provider only
(a few dozen rows a period): what a summary over every key by model and/or provider, or by
nothing but the period, reads (a console's plots).
`usage_hour_key` and `usage_day_key`: per key alone, the counters and sums (one row per
active key a period): what a summary by key reads (a console's top keys, a key's budget use).
`usage_hour_total` and `usage_day_total`: every request of a period together (one row a
period): what a summary by nothing but the period reads (a console's time series).
`usage_month_key`, `usage_month_key_model` and `usage_month_all_keys`: per UTC calendar month,
the counters and sums by key alone, by key and model, and by every dimension but the key: totals
over a range without percentiles read its whole months here, its other whole days from the
daily rollups and its part days from the hourly ones (a year by key: about 12 rows a key, not
365).
`usage_sketch_*`: the latency and TTFT histograms (`sketch.py`: 40 log buckets each, a count
per bucket, which add column by column), apart from the counters, written in the same
transaction: by every dimension per hour (`usage_sketch_hour`: what any summary with p50/p95
can read, a day as its hours); by every dimension but the key (`_all_keys`), by model and
provider, and of every request (`_total`), per hour and per day; and by key and model per day
and per UTC month (`_day_key_model`, `_month_key_model`: what p50/p95 by key, or by key and
model, read over whole days: 90 days about three months and a day a key and model). A summary
with p50/p95 reads its counters from the counter rollups and its histograms from the
narrowest sketch table that answers it, for the same periods and groups (`summary_sql.py`).
Fewer sketch tables than counter rollups, each a row per group as narrow as it can be: the
histograms are most of a rollup row's width, so they are written where they are read.
`usage_schema`: the versions applied.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    BigInteger,
    Column,
    Float,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
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


def records_table(name: str, meta: MetaData) -> Table:
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


records = records_table("usage_records", metadata)
# Requests that did not answer 200 (refused, failed: a few in a hundred) by status and time:
# a listing of one status reads its records newest first without passing over the others
# (`UsageStore.records` adds the index's condition to a query of such a status).
_NOT_OK = records.c.status != 200
RECORD_INDEXES = (
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
SKETCH = LATENCY + TTFT  # a sketch table's columns: the histograms' counts
ADDED = COUNTERS + SUMS + SKETCH  # every rollup column that merges by addition


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
PG_ROLLUP_STORAGE = {"fillfactor": 70}


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
            postgresql_with=PG_ROLLUP_STORAGE,
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
        postgresql_with=PG_ROLLUP_STORAGE,
    )


@record
class Rollup:
    bucket_s: int  # seconds, or buckets.MONTH
    dims: tuple[str, ...]
    added: tuple[str, ...]


KEY_MODEL = ("key_id", "model")
MODEL_PROVIDER = ("model", "provider")
KEY_ONLY = ("key_id",)
# The counter rollups: the counters and sums (`TOTALS`).
hourly = _rollup("usage_hour", DIMENSIONS, TOTALS)
daily = _rollup("usage_day", DIMENSIONS, TOTALS)
hourly_all_keys = _rollup("usage_hour_all_keys", ALL_KEYS, TOTALS)
daily_all_keys = _rollup("usage_day_all_keys", ALL_KEYS, TOTALS)
daily_key_model = _rollup("usage_day_key_model", KEY_MODEL, TOTALS, key_first=True)
hourly_model_provider = _rollup("usage_hour_model_provider", MODEL_PROVIDER, TOTALS)
daily_model_provider = _rollup("usage_day_model_provider", MODEL_PROVIDER, TOTALS)
hourly_key = _rollup("usage_hour_key", KEY_ONLY, TOTALS, clustered=True)
daily_key = _rollup("usage_day_key", KEY_ONLY, TOTALS, clustered=True)
hourly_total = _rollup("usage_hour_total", (), TOTALS)
daily_total = _rollup("usage_day_total", (), TOTALS)
monthly_key = _rollup("usage_month_key", KEY_ONLY, TOTALS, clustered=True)
monthly_key_model = _rollup("usage_month_key_model", KEY_MODEL, TOTALS, key_first=True)
monthly_all_keys = _rollup("usage_month_all_keys", ALL_KEYS, TOTALS)
# The sketch tables: the histograms (`SKETCH`), stored in period order (a page of a summary
# per period reads its rows' histograms as one range).
sketch_hour = _rollup("usage_sketch_hour", DIMENSIONS, SKETCH, clustered=True)
sketch_hour_all_keys = _rollup("usage_sketch_hour_all_keys", ALL_KEYS, SKETCH)
sketch_day_all_keys = _rollup("usage_sketch_day_all_keys", ALL_KEYS, SKETCH)
sketch_hour_model_provider = _rollup("usage_sketch_hour_model_provider", MODEL_PROVIDER, SKETCH)
sketch_day_model_provider = _rollup("usage_sketch_day_model_provider", MODEL_PROVIDER, SKETCH)
sketch_hour_total = _rollup("usage_sketch_hour_total", (), SKETCH)
sketch_day_total = _rollup("usage_sketch_day_total", (), SKETCH)
sketch_day_key_model = _rollup("usage_sketch_day_key_model", KEY_MODEL, SKETCH, clustered=True)
sketch_month_key_model = _rollup("usage_sketch_month_key_model", KEY_MODEL, SKETCH, clustered=True)
COUNTER_ROLLUPS = (
    hourly,
    daily,
    hourly_all_keys,
    daily_all_keys,
    daily_key_model,
    hourly_model_provider,
    daily_model_provider,
    hourly_key,
    daily_key,
    hourly_total,
    daily_total,
    monthly_key,
    monthly_key_model,
    monthly_all_keys,
)
SKETCHES = (
    sketch_hour,
    sketch_hour_all_keys,
    sketch_day_all_keys,
    sketch_hour_model_provider,
    sketch_day_model_provider,
    sketch_hour_total,
    sketch_day_total,
    sketch_day_key_model,
    sketch_month_key_model,
)
_GRAIN = {"hour": HOUR_S, "day": DAY_S, "month": MONTH}
_DIMS = {"all_keys": ALL_KEYS, "model_provider": MODEL_PROVIDER, "total": (), "key": KEY_ONLY}
_DIMS["key_model"] = KEY_MODEL


def _shape(table: Table) -> Rollup:
    """A rollup's shape, read off its name (`usage[_sketch]_{grain}[_{dimensions}]`)."""
    parts = table.name.removeprefix("usage_").removeprefix("sketch_").split("_", 1)
    dims = DIMENSIONS if len(parts) == 1 else _DIMS[parts[1]]
    return Rollup(_GRAIN[parts[0]], dims, SKETCH if table in SKETCHES else TOTALS)


ROLLUPS = {table: _shape(table) for table in (*COUNTER_ROLLUPS, *SKETCHES)}
# How an insert makes each rollup's increments (`rollup_sql.py`): these grouped from the batch's
# records; every other one folded from the increments of the rollup it names (finer, holding
# its dimensions and columns), in this order. Folding reads a batch's hourly groups, fewer than
# its records where traffic repeats a key, model and status within the hour.
FROM_RECORDS = (hourly,)


# What a rollup's staged increments hold: its own columns; the hourly rollup's, grouped from
# the records, the histograms too (`ADDED`: the records are grouped once), which the hourly
# sketch table takes as they are and the other sketch tables fold from.
def staged_added(table: Table) -> tuple[str, ...]:
    return ADDED if table in FROM_RECORDS else ROLLUPS[table].added


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
    sketch_hour: hourly,
    sketch_hour_all_keys: hourly,
    sketch_day_key_model: hourly,
    sketch_month_key_model: sketch_day_key_model,
    sketch_day_all_keys: sketch_hour_all_keys,
    sketch_hour_model_provider: sketch_hour_all_keys,
    sketch_day_model_provider: sketch_hour_model_provider,
    sketch_hour_total: sketch_hour_model_provider,
    sketch_day_total: sketch_hour_total,
}
