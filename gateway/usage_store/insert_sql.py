"""The insert path's statements, written for each driver (SQLAlchemy's per-row parameter
handling cost more than the database's work): the records, and the rollup increments added to
what each rollup table holds.

PostgreSQL: each batch is copied (binary COPY) into a temporary staging table of the same
shape, then moved by one INSERT ... SELECT (ON CONFLICT: the records' ids, the rollups' keys).
That costs the server a third to half of what one INSERT over `unnest` of one array per column
costs. The staging tables are the session's own, emptied at commit."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from operator import itemgetter
from typing import Any

from sqlalchemy import Table
from sqlalchemy.ext.asyncio import AsyncConnection

from gateway.usage_store.schema import RECORD_COLUMNS, ROLLUPS, records

_record_values = itemgetter(*RECORD_COLUMNS)  # a row's values in the order of RECORD_COLUMNS
_SQLITE_PARAMS = 32_000  # SQLite's limit on parameters per statement


def _stage(table: Table) -> str:
    return f"usage_stage_{table.name.removeprefix('usage_')}"


class InsertSQL:
    """The insert path's statements, written for each driver: SQLAlchemy's per-row parameter
    handling cost more than the database's work. PostgreSQL copies each batch into a staging
    table and moves it with one statement; SQLite gets the driver's executemany."""

    def __init__(self, dialect: str) -> None:
        self.dialect = dialect
        names = ", ".join(RECORD_COLUMNS)
        if dialect == "postgresql":
            self._records = (
                f"INSERT INTO usage_records ({names}) SELECT {names} FROM {_stage(records)} "
                "ON CONFLICT (record_id) DO NOTHING RETURNING record_id"
            )
        else:
            marks = ", ".join("?" * len(RECORD_COLUMNS))
            self._records = f"INSERT INTO usage_records ({names}) VALUES ({marks})"
        self._rollups = {}
        self._columns: dict[str, tuple[str, ...]] = {}  # each rollup's, in its statement's order
        for table, shape in ROLLUPS.items():
            columns = self._columns[table.name] = ("bucket", *shape.dims, *shape.added)
            cols = ", ".join(columns)
            keys = ", ".join(("bucket", *shape.dims))
            sets = ", ".join(f"{c} = {table.name}.{c} + excluded.{c}" for c in shape.added)
            if dialect == "postgresql":
                # in key order, as the increments come: concurrent writers lock rows in one order
                source = f"SELECT {cols} FROM {_stage(table)} ORDER BY {keys}"
            else:
                source = "VALUES (" + ", ".join("?" * len(columns)) + ")"
            self._rollups[table.name] = (
                f"INSERT INTO {table.name} ({cols}) {source} "
                f"ON CONFLICT ({keys}) DO UPDATE SET {sets}"
            )
        # the session's staging tables, created by its first batch (and again after a rollback)
        self._staging = "; ".join(
            f"CREATE TEMP TABLE IF NOT EXISTS {_stage(t)} (LIKE {t.name}) ON COMMIT DELETE ROWS"
            for t in (records, *ROLLUPS)
        )

    async def _driver(self, conn: AsyncConnection) -> Any:
        """asyncpg's connection, inside the transaction: the staging tables made."""
        found = await conn.exec_driver_sql(  # (the first statement begins the transaction)
            f"SELECT to_regclass('pg_temp.{_stage(records)}') IS NOT NULL"
        )
        raw = await conn.get_raw_connection()
        driver: Any = raw.driver_connection
        if not found.scalar():
            await driver.execute(self._staging)
        return driver

    async def insert_records(
        self, conn: AsyncConnection, rows: Sequence[Mapping[str, Any]]
    ) -> set[str]:
        """Insert rows not stored yet; the ids of those inserted."""
        if self.dialect == "postgresql":
            driver = await self._driver(conn)
            await driver.copy_records_to_table(
                _stage(records), records=map(_record_values, rows), columns=RECORD_COLUMNS
            )
            return {row[0] for row in await driver.fetch(self._records)}
        # SQLite: the transaction holds the database's write lock, so the ids found stored are
        # all there are; the rest go in through one prepared statement (executemany).
        ids = [row["record_id"] for row in rows]
        stored: set[str] = set()
        for start in range(0, len(ids), _SQLITE_PARAMS):
            part = ids[start : start + _SQLITE_PARAMS]
            found = await conn.exec_driver_sql(
                "SELECT record_id FROM usage_records WHERE record_id IN "
                f"({', '.join('?' * len(part))})",
                tuple(part),
            )
            stored.update(row[0] for row in found)
        fresh = [_record_values(row) for row in rows if row["record_id"] not in stored]
        if fresh:
            await conn.exec_driver_sql(self._records, fresh)
        return set(ids) - stored

    async def add_rollups(
        self, conn: AsyncConnection, table: Table, increments: list[list[Any]]
    ) -> None:
        """Add increments (`rows.rollups`, `rows.coarser` at `table`'s dimensions) to `table`."""
        sql = self._rollups[table.name]
        if self.dialect == "postgresql":
            driver: Any = (await conn.get_raw_connection()).driver_connection
            await driver.copy_records_to_table(
                _stage(table), records=increments, columns=self._columns[table.name]
            )
            await driver.execute(sql)
        else:
            await conn.exec_driver_sql(sql, [tuple(row) for row in increments])
