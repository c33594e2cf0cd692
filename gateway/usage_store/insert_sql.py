"""The insert path on PostgreSQL: a batch's records, with their histogram buckets, are copied
(binary COPY) into a temporary staging table; one script then moves the records not stored
yet into `usage_records` (ON CONFLICT on the record id), drops the others from the stage, and
adds the rest to every rollup (`rollup_sql.py`): one round trip for all of the server's work,
which runs while the consumer reads the next batch. The staging tables are the session's own,
emptied at commit."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from gateway.usage_store.bulk_sql import create_indexes, drop_indexes, insert_records
from gateway.usage_store.rollup_sql import (
    FOLD_SOURCES,
    STAGED_COLUMNS,
    rollup_statements,
    stage,
    staged,
)
from gateway.usage_store.schema import RECORD_COLUMNS, ROLLUPS, records, staged_added

# A bulk load's transaction's settings (`begin_bulk`).
BULK_SETTINGS = (
    "synchronous_commit = off",
    "work_mem = '256MB'",
    "maintenance_work_mem = '512MB'",
)


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
        # a bulk load's batches share one transaction: each batch empties the stages itself
        self._empty = f"TRUNCATE {', '.join(stage(t) for t in (records, *FOLD_SOURCES))}"
        self._bulk: AsyncConnection | None = None  # the bulk load's (`begin_bulk`)
        self._bulk_script = "; ".join((insert_records(into), *rollup_statements("postgresql")))

    async def insert(self, rows: Sequence[Mapping[str, Any]]) -> int:
        """Store `rows` (unique by record id) not stored yet, and roll them up; how many were
        new."""
        return await self.insert_staged(map(staged, rows))

    async def insert_staged(self, rows: Iterable[Sequence[Any]]) -> int:
        """`insert` of rows staged already (`rollup_sql.staged`)."""
        if self._bulk is not None:
            fresh = await self._add(self._bulk, rows, self._bulk_script)
            await self._bulk.exec_driver_sql(self._empty)
            return fresh
        async with self._engine.begin() as conn:
            return await self._add(conn, rows, self._script)

    async def _add(self, conn: AsyncConnection, rows: Iterable[Sequence[Any]], script: str) -> int:
        """A batch's statements, in `conn`'s transaction."""
        found = await conn.exec_driver_sql(self._made)  # (which begins the transaction)
        driver: Any = (await conn.get_raw_connection()).driver_connection
        if not found.scalar():
            await driver.execute(self._staging)
        await driver.copy_records_to_table(stage(records), records=rows, columns=STAGED_COLUMNS)
        await driver.execute(script)
        return int(await driver.fetchval(self._fresh))

    async def begin_bulk(self) -> None:
        """Begin a bulk load into an empty store (`bulk_sql`): every batch from now to
        `end_bulk` in one transaction of one connection, its commit not waiting for the disk,
        with memory to group a large batch and to build the indexes (`BULK_SETTINGS`)."""
        conn = await self._engine.connect()
        try:
            await conn.begin()
            for statement in (*(f"SET LOCAL {s}" for s in BULK_SETTINGS), *drop_indexes()):
                await conn.exec_driver_sql(statement)
        except BaseException:
            await conn.close()
            raise
        self._bulk = conn

    async def end_bulk(self, commit: bool) -> None:
        """Commit (or roll back) the bulk load's transaction."""
        conn, self._bulk = self._bulk, None
        if conn is None:
            return
        try:
            if commit:
                for statement in create_indexes("postgresql"):
                    await conn.exec_driver_sql(statement)
                await conn.commit()
            else:
                await conn.rollback()
        finally:
            await conn.close()

    async def aclose(self) -> None:
        """Nothing of its own to close (the store disposes of the engine)."""
