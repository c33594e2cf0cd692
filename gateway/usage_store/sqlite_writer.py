"""`SqliteWriter`: the insert path on SQLite, each batch in one call to a thread of its own.

A batch's records, with their histogram buckets, go into a temporary staging table by a few
multi-row INSERTs (the driver binds a statement's values in one go); then, still in the same
call and transaction, the records already stored are dropped from the stage, the rest go into
`usage_records`, and every rollup adds them (`rollup_sql.py`). All of it runs in the thread
without the event loop, and SQLite's own work without the GIL, beside the consumer reading the
next batch.

The writer's connection is its own, made and used only in its thread; the store's other
statements (migrations, retention) use their own connections, and SQLite's write lock
(BEGIN IMMEDIATE, `busy_timeout`) takes them in turn.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from itertools import chain
from typing import Any

from gateway.usage_store.bulk_sql import create_indexes, drop_indexes
from gateway.usage_store.rollup_sql import (
    FOLD_SOURCES,
    STAGED_COLUMNS,
    rollup_statements,
    stage,
    staged,
    staged_columns,
)
from gateway.usage_store.schema import RECORD_COLUMNS, ROLLUPS, records

# Every connection's: cache_size: up to 64 MiB, taken as used: the pages a batch writes into
# (each key's latest records, each rollup's current hour and day) stay cached.
PRAGMAS = ("journal_mode=WAL", "synchronous=NORMAL", "busy_timeout=30000", "cache_size=-65536")
# A bulk load's (`begin_bulk`): the file to itself, its rollback journal in memory, no syncs,
# a page cache of up to 1 GiB.
BULK_PRAGMAS = (
    "locking_mode=EXCLUSIVE",
    "journal_mode=MEMORY",
    "synchronous=OFF",
    "cache_size=-1048576",
)


class SqliteWriter:
    def __init__(self, path: str) -> None:
        self._path = path
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="usage-sqlite")
        self._conn: sqlite3.Connection | None = None  # made and used in the thread only
        self._closed = False
        self._per_statement = 0  # staged rows per INSERT (SQLite's limit on parameters)
        self._values: dict[int, str] = {}  # rows -> the staging INSERT of that many rows
        names = ", ".join(RECORD_COLUMNS)
        into = stage(records)
        self._stored = (
            f"DELETE FROM {into} WHERE EXISTS "
            f"(SELECT 1 FROM {records.name} r WHERE r.record_id = {into}.record_id)"
        )
        self._records = f"INSERT INTO {records.name} ({names}) SELECT {names} FROM {into}"
        self._rollups = rollup_statements("sqlite")
        self._clear = [f"DELETE FROM {stage(t)}" for t in (records, *FOLD_SOURCES)]
        self._bulk = False  # in a bulk load's transaction (`begin_bulk`)

    async def insert(self, rows: Sequence[Mapping[str, Any]]) -> int:
        """Store `rows` (unique by record id) not stored yet, and roll them up; how many were
        new."""
        values = list(chain.from_iterable(map(staged, rows)))
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._thread, self._insert, values, len(rows))

    async def insert_staged(self, rows: Sequence[Sequence[Any]]) -> int:
        """`insert` of rows staged already (`rollup_sql.staged`)."""
        values = list(chain.from_iterable(rows))
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._thread, self._insert, values, len(rows))

    async def aclose(self) -> None:
        """Close the connection (after the batch under way) and end the thread; again: a no-op."""
        if self._closed:
            return
        self._closed = True
        await asyncio.get_running_loop().run_in_executor(self._thread, self._close)
        self._thread.shutdown(wait=False)

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
        for pragma in (*PRAGMAS, "temp_store=MEMORY"):
            conn.execute(f"PRAGMA {pragma}")
        conn.execute(f"CREATE TEMP TABLE {stage(records)} ({', '.join(STAGED_COLUMNS)})")
        for table in FOLD_SOURCES:  # keyed as their rollups: folds add to them by upsert
            key = ", ".join(("bucket", *ROLLUPS[table].dims))
            conn.execute(
                f"CREATE TEMP TABLE {stage(table)} ({', '.join(staged_columns(table))}, "
                f"PRIMARY KEY ({key}))"
            )
        self._per_statement = conn.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER) // len(
            STAGED_COLUMNS
        )
        self._conn = conn
        return conn

    def _staging_insert(self, rows: int) -> str:
        sql = self._values.get(rows)
        if sql is None:
            row = "(" + ", ".join("?" * len(STAGED_COLUMNS)) + ")"
            sql = self._values[rows] = f"INSERT INTO {stage(records)} VALUES " + ", ".join(
                [row] * rows
            )
        return sql

    async def begin_bulk(self) -> None:
        """Begin a bulk load into an empty store (`bulk_sql`): every batch from now to
        `end_bulk` in one transaction, with the file's rollback journal in memory and no syncs
        (a crash leaves it to be loaded again), and a larger page cache (`BULK_PRAGMAS`)."""
        await asyncio.get_running_loop().run_in_executor(self._thread, self._begin_bulk)

    async def end_bulk(self, commit: bool) -> None:
        """Commit (or roll back) the bulk load's transaction; the usual settings again."""
        await asyncio.get_running_loop().run_in_executor(self._thread, self._end_bulk, commit)

    def _begin_bulk(self) -> None:
        conn = self._conn or self._connect()
        # (leaving WAL needs the file to itself; where another connection holds it, the
        # load runs in WAL mode)
        for pragma in BULK_PRAGMAS:
            conn.execute(f"PRAGMA {pragma}")
        conn.execute("BEGIN IMMEDIATE")
        for statement in drop_indexes():
            conn.execute(statement)
        self._bulk = True

    def _end_bulk(self, commit: bool) -> None:
        conn = self._conn or self._connect()
        self._bulk = False
        try:
            if commit:
                for statement in create_indexes("sqlite"):
                    conn.execute(statement)
                conn.execute("COMMIT")
        finally:
            if conn.in_transaction:  # (not committed: an error, or refused above)
                conn.execute("ROLLBACK")
        conn.execute("PRAGMA locking_mode=NORMAL")
        conn.execute("SELECT count(*) FROM sqlite_schema").fetchall()  # (drops the file lock)
        for pragma in PRAGMAS:
            conn.execute(f"PRAGMA {pragma}")

    def _insert(self, values: list[Any], rows: int) -> int:
        conn = self._conn or self._connect()
        width, per = len(STAGED_COLUMNS), self._per_statement
        if self._bulk:
            return self._add(conn, values, rows, width, per)
        conn.execute("BEGIN IMMEDIATE")
        try:
            fresh = self._add(conn, values, rows, width, per)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        return fresh

    def _add(
        self, conn: sqlite3.Connection, values: list[Any], rows: int, width: int, per: int
    ) -> int:
        """A batch's statements, in the transaction under way."""
        for start in range(0, rows, per):
            part = min(per, rows - start)
            conn.execute(self._staging_insert(part), values[start * width : (start + part) * width])
        if not self._bulk:  # (a bulk load's store was empty: `bulk_sql`)
            conn.execute(self._stored)
        fresh = conn.execute(self._records).rowcount
        for statement in self._rollups:
            conn.execute(statement)
        for statement in self._clear:
            conn.execute(statement)
        return fresh

    def _close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
