"""The usage store's versioned migrations (`schema.py` holds the tables), applied at start in
order, each once, in the transaction that records it (`usage_schema`)."""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import (
    Connection,
    MetaData,
    PrimaryKeyConstraint,
    Table,
    column,
    func,
    insert,
    inspect,
    select,
)
from sqlalchemy import table as sql_table
from sqlalchemy.sql.expression import TableClause

from gateway.usage_store.buckets import MONTH
from gateway.usage_store.schema import (
    COUNTER_ROLLUPS,
    DIMENSIONS,
    LATENCY,
    PG_ROLLUP_STORAGE,
    RECORD_COLUMNS,
    RECORD_INDEXES,
    ROLLUPS,
    SKETCH,
    SKETCHES,
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
    records,
    records_table,
    schema_versions,
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


def _v1(conn: Connection) -> None:
    for table in (records, hourly, daily):
        table.create(conn, checkfirst=True)


def _fill(conn: Connection, pairs: tuple[tuple[Table, TableClause], ...]) -> None:
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
    """The records keyed by (key, time, id) (`records_table`): copied, in that order, into the
    new table, which then takes the old one's name. Runs once, at the first start after an
    upgrade, and takes a while on a large store (`docs/performance.md`)."""
    rebuilt = records_table("usage_records_v7", MetaData())
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
    for index in RECORD_INDEXES:
        index.create(conn)


def _v8(conn: Connection) -> None:
    """PostgreSQL: the rollups' pages keep room for their rows' updates (`PG_ROLLUP_STORAGE`;
    pages written from now on). (The sketch tables, newer, are created so.)"""
    if conn.dialect.name != "postgresql":
        return
    storage = ", ".join(f"{name} = {value}" for name, value in PG_ROLLUP_STORAGE.items())
    for table in COUNTER_ROLLUPS:
        conn.exec_driver_sql(f"ALTER TABLE {table.name} SET ({storage})")


def _v9(conn: Connection) -> None:
    """The latency histograms move out of the counter rollups into the sketch tables: those
    by every dimension copied from the keyed rollups' histogram columns, the others folded from
    them; then each counter rollup that held histograms is rebuilt without them (copied into a
    new table that takes its name). A store created at this version has none to move."""
    for table in SKETCHES:
        table.create(conn, checkfirst=True)
    held = {
        table
        for table in COUNTER_ROLLUPS
        if LATENCY[0] in {c["name"] for c in inspect(conn).get_columns(table.name)}
    }
    if hourly in held:
        names = ("bucket", *DIMENSIONS, *SKETCH)
        old_hourly = sql_table(hourly.name, *(column(name) for name in names))
        old_daily = sql_table(daily.name, *(column(name) for name in names))
        conn.execute(insert(sketch_hour).from_select(names, select(*old_hourly.c)))
        _fill(
            conn,
            (
                (sketch_hour_all_keys, sketch_hour),
                (sketch_day_all_keys, old_daily),
                (sketch_hour_model_provider, sketch_hour_all_keys),
                (sketch_day_model_provider, sketch_day_all_keys),
                (sketch_hour_total, sketch_hour_model_provider),
                (sketch_day_total, sketch_day_model_provider),
                (sketch_day_key_model, old_daily),
            ),
        )
        _fill_months(conn, ((sketch_month_key_model, sketch_day_key_model),))
    for table in COUNTER_ROLLUPS:
        if table in held:
            _rebuild(conn, table)


def _rebuild(conn: Connection, table: Table) -> None:
    """`table` copied into a new table of its definition (its columns, primary key, storage),
    which then takes its name and indexes."""
    key = [c.name for c in table.primary_key.columns]
    rebuilt = Table(
        f"{table.name}_v9",
        MetaData(),
        *(c._copy() for c in table.columns),
        PrimaryKeyConstraint(*key, name=f"{table.name}_v9_pkey"),
        **table.dialect_kwargs,
    )
    rebuilt.create(conn)
    names = [c.name for c in table.columns]
    old = sql_table(table.name, *(column(name) for name in names))
    conn.execute(insert(rebuilt).from_select(names, select(*old.c)))
    conn.exec_driver_sql(f"DROP TABLE {table.name}")  # and its indexes
    conn.exec_driver_sql(f"ALTER TABLE {rebuilt.name} RENAME TO {table.name}")
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql(
            f"ALTER TABLE {table.name} RENAME CONSTRAINT {rebuilt.name}_pkey TO {table.name}_pkey"
        )
    for index in table.indexes:
        index.create(conn)


def _v10(conn: Connection) -> None:
    """The index of the requests that did not answer 200 (`usage_records_not_ok`)."""
    for index in RECORD_INDEXES:
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
    (10, _v10),
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
