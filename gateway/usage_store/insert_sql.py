"""The insert path on PostgreSQL: a batch's records, with their histogram buckets, are copied
(binary COPY) into a temporary staging table; one script then moves the records not stored
yet into `usage_records` (ON CONFLICT on the record id), drops the others from the stage, and
adds the rest to every rollup (`rollup_sql.py`): one round trip for all of the server's work,
which runs while the consumer reads the next batch. The staging tables are the session's own,
emptied at commit."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.usage_store.rollup_sql import (
    FOLD_SOURCES,
    STAGED_COLUMNS,
    rollup_statements,
    stage,
    staged,
)
from gateway.usage_store.schema import RECORD_COLUMNS, ROLLUPS, records, staged_added


class PostgresWriter:
    """A batch's records and rollups, stored in one transaction of `engine`."""

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine
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
                    f"CREATE TEMP TABLE IF NOT EXISTS {stage(t)} (LIKE {t.name}"
                    + "".join(
                        f", {c} integer" for c in staged_added(t) if c not in ROLLUPS[t].added
                    )
                    + ") ON COMMIT DELETE ROWS"
                    for t in FOLD_SOURCES
                ),
            )
        )
        self._made = f"SELECT to_regclass('pg_temp.{into}') IS NOT NULL"

    async def insert(self, rows: Sequence[Mapping[str, Any]]) -> int:
        """Store `rows` (unique by record id) not stored yet, and roll them up; how many were
        new."""
        async with self._engine.begin() as conn:
            found = await conn.exec_driver_sql(self._made)  # (which begins the transaction)
            driver: Any = (await conn.get_raw_connection()).driver_connection
            if not found.scalar():
                await driver.execute(self._staging)
            await driver.copy_records_to_table(
                stage(records), records=map(staged, rows), columns=STAGED_COLUMNS
            )
            await driver.execute(self._script)
            return int(await driver.fetchval(self._fresh))

    async def aclose(self) -> None:
        """Nothing of its own to close (the store disposes of the engine)."""
