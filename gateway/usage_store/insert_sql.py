"""The insert path on PostgreSQL: a batch's records, with their histogram buckets, are copied
(binary COPY) into a temporary staging table; one script then moves the records not stored
yet into `usage_records` (ON CONFLICT on the record id), drops the others from the stage, and
adds the rest to every rollup (`rollup_sql.py`): one round trip for all of the server's work,
which runs while the consumer reads the next batch. The staging tables are the session's own,
emptied at commit."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from operator import itemgetter
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from gateway.usage_store.rollup_sql import FOLD_SOURCES, STAGED_COLUMNS, rollup_statements, stage
from gateway.usage_store.schema import RECORD_COLUMNS, records
from gateway.usage_store.sketch import bucket_of

_record_values = itemgetter(*RECORD_COLUMNS)  # a row's values in the order of RECORD_COLUMNS


def staged(row: Mapping[str, Any]) -> tuple[Any, ...]:
    """A row's values in the order of `STAGED_COLUMNS`."""
    ttft = row["ttft_ms"]
    return (
        *_record_values(row),
        bucket_of(row["latency_ms"]),
        -1 if ttft is None else bucket_of(ttft),
    )


class PostgresInsert:
    """A batch's records and rollups, stored in the caller's transaction."""

    def __init__(self) -> None:
        names = ", ".join(RECORD_COLUMNS)
        into = stage(records)
        self._script = "; ".join(
            (
                f"WITH fresh AS (INSERT INTO {records.name} ({names}) SELECT {names} FROM {into} "
                "ON CONFLICT (record_id) DO NOTHING RETURNING record_id) "
                f"DELETE FROM {into} WHERE record_id NOT IN (SELECT record_id FROM fresh)",
                *rollup_statements("postgresql"),
            )
        )
        self._fresh = f"SELECT count(*) FROM {into}"
        # the session's staging tables, made by its first batch (and again after a rollback)
        self._staging = "; ".join(
            (
                f"CREATE TEMP TABLE IF NOT EXISTS {into} "
                f"(LIKE {records.name}, lat_b integer, ttft_b integer) ON COMMIT DELETE ROWS",
                *(
                    f"CREATE TEMP TABLE IF NOT EXISTS {stage(t)} (LIKE {t.name}) "
                    "ON COMMIT DELETE ROWS"
                    for t in FOLD_SOURCES
                ),
            )
        )
        self._made = f"SELECT to_regclass('pg_temp.{into}') IS NOT NULL"

    async def insert(self, conn: AsyncConnection, rows: Sequence[Mapping[str, Any]]) -> int:
        """Store `rows` (unique by record id) not stored yet, and roll them up; how many were
        new."""
        found = await conn.exec_driver_sql(self._made)  # (which begins the transaction)
        driver: Any = (await conn.get_raw_connection()).driver_connection
        if not found.scalar():
            await driver.execute(self._staging)
        await driver.copy_records_to_table(
            stage(records), records=map(staged, rows), columns=STAGED_COLUMNS
        )
        await driver.execute(self._script)
        return int(await driver.fetchval(self._fresh))
