"""The insert path's statements, written for each driver (SQLAlchemy's per-row parameter
handling cost more than the database's work): the records, and the rollup increments added to
what each rollup table holds."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from operator import itemgetter
from typing import Any

from sqlalchemy import BigInteger, Float, Integer, String, Table
from sqlalchemy.ext.asyncio import AsyncConnection

from gateway.usage_store.schema import RECORD_COLUMNS, ROLLUPS, records

_record_values = itemgetter(*RECORD_COLUMNS)  # a row's values in the order of RECORD_COLUMNS
_SQLITE_PARAMS = 32_000  # SQLite's limit on parameters per statement
_PG_TYPES = ((BigInteger, "bigint"), (Integer, "integer"), (Float, "float8"), (String, "text"))


def _pg_type(table: Table, column: str) -> str:
    kind = table.c[column].type
    return next(name for cls, name in _PG_TYPES if isinstance(kind, cls))


class InsertSQL:
    """The insert path's statements, written for each driver: SQLAlchemy's per-row parameter
    handling cost more than the database's work. PostgreSQL gets one statement per batch
    (column arrays, `unnest`); SQLite multi-row VALUES and the driver's executemany."""

    def __init__(self, dialect: str) -> None:
        self.dialect = dialect
        conflict = "ON CONFLICT (record_id) DO NOTHING RETURNING record_id"
        names = ", ".join(RECORD_COLUMNS)
        if dialect == "postgresql":
            arrays = ", ".join(
                f"${i}::{_pg_type(records, c)}[]" for i, c in enumerate(RECORD_COLUMNS, 1)
            )
            self._records = (
                f"INSERT INTO usage_records ({names}) SELECT * FROM unnest({arrays}) {conflict}"
            )
        else:
            marks = ", ".join("?" * len(RECORD_COLUMNS))
            self._records = f"INSERT INTO usage_records ({names}) VALUES ({marks})"
        self._rollups = {}
        for table, shape in ROLLUPS.items():
            columns = ("bucket", *shape.dims, *shape.added)
            cols = ", ".join(columns)
            keys = ", ".join(("bucket", *shape.dims))
            sets = ", ".join(f"{c} = {table.name}.{c} + excluded.{c}" for c in shape.added)
            if dialect == "postgresql":
                arrays = ", ".join(
                    f"${i}::{_pg_type(table, c)}[]" for i, c in enumerate(columns, 1)
                )
                source = f"SELECT * FROM unnest({arrays})"
            else:
                source = "VALUES (" + ", ".join("?" * len(columns)) + ")"
            self._rollups[table.name] = (
                f"INSERT INTO {table.name} ({cols}) {source} "
                f"ON CONFLICT ({keys}) DO UPDATE SET {sets}"
            )

    async def insert_records(
        self, conn: AsyncConnection, rows: Sequence[Mapping[str, Any]]
    ) -> set[str]:
        """Insert rows not stored yet; the ids of those inserted."""
        if self.dialect == "postgresql":
            columns = tuple(map(list, zip(*map(_record_values, rows), strict=True)))
            result = await conn.exec_driver_sql(self._records, columns)
            return {row[0] for row in result}
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
            columns = tuple(list(column) for column in zip(*increments, strict=True))
            await conn.exec_driver_sql(sql, columns)
        else:
            await conn.exec_driver_sql(sql, [tuple(row) for row in increments])
