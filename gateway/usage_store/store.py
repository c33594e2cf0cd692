"""`UsageStore`: the SQL usage store (SQLite or PostgreSQL, by URL) behind one interface.

  - `insert(rows)`: stores rows idempotently by record id and, in the same transaction, adds
    the rows it had not stored before to the hourly and daily rollups (`schema.py`: keyed,
    all-keys, by model and provider, by key, key x model; made by the database,
    `rollup_sql.py`); returns how many were new. Safe to run from any number of processes at
    once. PostgreSQL's batches go through `insert_sql.py`, SQLite's through `sqlite_writer.py`
    (a file's store: not `:memory:`).
  - `summary`, `records`, `export`: the admin API's reads; a summary's counters are one
    statement on the narrowest counter rollups that answer it (`summary_sql.py`): by model and
    provider when the summary groups and filters by nothing else, by key alone, by key and
    model, all-keys when it neither groups nor filters by key, else keyed; totals over a range
    read its whole months, whole days and part days from the monthly, daily and hourly ones.
    A summary with p50/p95 reads its rows' histograms with a second statement, on the sketch
    tables of the same shapes (the same transaction, so the same snapshot).
  - `purge(now_s)`: retention (raw rows after `retention_days`, rollups by whole UTC months
    after `rollup_retention_days`).
The schema is migrated at `open` (under a lock: PostgreSQL's advisory lock, SQLite's write lock).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any

from sqlalchemy import (
    ColumnElement,
    String,
    and_,
    delete,
    event,
    func,
    literal,
    or_,
    select,
    text,
    union_all,
)
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from gateway.usage_store.buckets import DAY_S, MONTH, bucket_start
from gateway.usage_store.export_sql import (
    QUOTED,
    SQLITE_BOUNDS,
    SQLITE_KEYS,
    WINDOW_MS,
    copy_sql,
    export_sql,
    sqlite_window_sql,
)
from gateway.usage_store.insert_sql import PostgresWriter
from gateway.usage_store.migrations import migrate
from gateway.usage_store.queries import (
    ExportQuery,
    Filters,
    RecordsQuery,
    SummaryQuery,
    encode_cursor,
)
from gateway.usage_store.schema import ROLLUPS, SKETCH, records
from gateway.usage_store.sqlite_writer import PRAGMAS, SqliteWriter
from gateway.usage_store.summary_rows import summary_row
from gateway.usage_store.summary_sql import Only, sketch_statement, summary_statement

_MIGRATION_LOCK = 0x75736167  # PostgreSQL advisory lock id


def _sqlite_engines(url: str, path: str) -> tuple[AsyncEngine, AsyncEngine]:
    """A writer whose transactions take SQLite's write lock at BEGIN (a deferred one could
    fail to upgrade while another process writes), and a reader that never blocks writers;
    `path`: the URL's file."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)

    def build(begin: str) -> AsyncEngine:
        engine = create_async_engine(url)

        @event.listens_for(engine.sync_engine, "connect")
        def _connect(dbapi: Any, _record: Any) -> None:
            dbapi.isolation_level = None  # transactions are begun below
            cursor = dbapi.cursor()
            for pragma in PRAGMAS:
                cursor.execute(f"PRAGMA {pragma}")
            cursor.close()

        @event.listens_for(engine.sync_engine, "begin")
        def _begin(conn: Any) -> None:
            conn.exec_driver_sql(begin)

        return engine

    return build("BEGIN IMMEDIATE"), build("BEGIN")


class UsageStore:
    def __init__(
        self, writer: AsyncEngine, reader: AsyncEngine, batches: SqliteWriter | PostgresWriter
    ) -> None:
        self._writer, self._reader = writer, reader
        self.dialect = writer.dialect.name
        self._batches = batches  # the insert path

    @classmethod
    async def open(cls, url: str) -> UsageStore:
        parsed = make_url(url)
        if parsed.get_backend_name() == "sqlite":
            path = parsed.database
            if not path or path == ":memory:":
                raise ValueError(f"the SQLite usage store needs a file: {url}")
            writer, reader = _sqlite_engines(url, path)
            store = cls(writer, reader, SqliteWriter(path))
        else:
            writer = create_async_engine(url, pool_pre_ping=True)
            store = cls(writer, writer, PostgresWriter(writer))
        try:
            await store._migrate()
        except BaseException:
            await store.aclose()
            raise
        return store

    async def _migrate(self) -> None:
        async with self._writer.begin() as conn:
            if self.dialect == "postgresql":
                await conn.execute(select(func.pg_advisory_xact_lock(_MIGRATION_LOCK)))
            await conn.run_sync(migrate, int(time.time() * 1000))

    async def aclose(self) -> None:
        await self._batches.aclose()
        await self._writer.dispose()
        if self._reader is not self._writer:
            await self._reader.dispose()

    async def insert(self, rows: Sequence[Mapping[str, Any]]) -> int:
        """Store `rows` (`rows.row_of`); rows already stored change nothing. Returns how many
        were new."""
        unique = list({row["record_id"]: row for row in rows}.values())
        if not unique:
            return 0
        return await self._batches.insert(unique)

    async def insert_staged(self, rows: Sequence[Sequence[Any]]) -> int:
        """`insert` of rows staged already (`rollup_sql.staged`: a row's columns, then its
        histogram buckets), unique by record id: a bulk load's, made in bulk."""
        if not rows:
            return 0
        return await self._batches.insert_staged(rows)

    @asynccontextmanager
    async def bulk(self) -> AsyncIterator[None]:
        """A bulk load (a benchmark's, a restore's): every `insert` inside goes through the
        same statements in one transaction, with the backend's settings for a large load
        (SQLite: the file to itself, the journal in memory, no syncs; PostgreSQL: a commit that
        does not wait for the disk). Committed at the end; rolled back on an error. The
        store's other connections wait for it (SQLite: they are closed first)."""
        if self.dialect == "sqlite":
            await self._writer.dispose()
            await self._reader.dispose()
        await self._batches.begin_bulk()
        try:
            yield
        except BaseException:
            await self._batches.end_bulk(commit=False)
            raise
        await self._batches.end_bulk(commit=True)

    async def purge(self, now_s: float, retention_days: int, rollup_days: int) -> dict[str, int]:
        """Delete raw rows older than `retention_days`, and the rollups of the UTC months that
        ended more than `rollup_days` ago: whole months, so that every rollup holds the same
        periods (a range's pieces read a month less its days, a day less its hours)."""
        deleted = {}
        async with self._writer.begin() as conn:
            cutoff_ms = int((now_s - retention_days * DAY_S) * 1000)
            result = await conn.execute(delete(records).where(records.c.ts_ms < cutoff_ms))
            deleted[records.name] = result.rowcount
            cutoff = bucket_start(int(now_s - rollup_days * DAY_S), MONTH)
            for table in ROLLUPS:
                result = await conn.execute(delete(table).where(table.c.bucket < cutoff))
                deleted[table.name] = result.rowcount
        return deleted

    # Reads.

    def _records_within(self, q: Filters) -> list[ColumnElement[bool]]:
        """The records matching the query's equalities and time range."""
        conditions: list[ColumnElement[bool]] = [
            records.c[column] == value for column, value in q.equalities().items()
        ]
        if q.start is not None:
            conditions.append(records.c.ts_ms >= int(q.start.timestamp()) * 1000)
        if q.end is not None:
            conditions.append(records.c.ts_ms < int(q.end.timestamp()) * 1000)
        return conditions

    async def summary(self, q: SummaryQuery, only: Only | None = None) -> list[dict[str, Any]]:
        """Totals per group (and per period with `interval`), from one statement on the rollups
        (`summary_sql`); `only`: the groups whose dimensions (query names) take these values.
        One page of them with the query's `limit` (`summary_page`)."""
        return (await self.summary_page(q, only))[0]

    async def summary_page(
        self, q: SummaryQuery, only: Only | None = None
    ) -> tuple[list[dict[str, Any]], str | None]:
        """The summary's rows, ordered by the period and then the groups: the query's `limit`
        of them after its `cursor` (every one without a limit), and the cursor of the next
        page (None: this is the last)."""
        stmt, at = summary_statement(self.dialect, q, only)
        async with self._reader.connect() as conn:
            if self.dialect == "postgresql" and q.latency:  # both statements, one snapshot
                await conn.execution_options(isolation_level="REPEATABLE READ")
            found = (await conn.execute(stmt)).all()
            # (an aggregate without groups over no rows is one row of nulls)
            found = [row for row in found if row[at["requests"]] is not None]
            cursor = None
            width = len(q.order())
            if q.limit is not None and len(found) > q.limit:
                found = found[: q.limit]
                cursor = encode_cursor(list(found[-1][:width]))
            sketches: dict[tuple[Any, ...], Sequence[Any]] = {}
            if q.latency and found:
                # the page's rows' histograms: those after the cursor, up to its last row
                through = list(found[-1][:width]) if q.limit is not None else None
                read, sketch_at = sketch_statement(self.dialect, q, only, through)
                first = sketch_at[SKETCH[0]]
                sketches = {
                    tuple(row[:width]): row[first:] for row in (await conn.execute(read)).all()
                }
        dims = q.dimensions()
        return [
            summary_row(row, at, q, dims, sketches.get(tuple(row[:width]), ())) for row in found
        ], cursor

    async def records(self, q: RecordsQuery) -> tuple[list[dict[str, Any]], str | None]:
        """One page of records, newest first, and the cursor of the next page (None: last)."""
        conditions = self._records_within(q)
        if q.status is not None and q.status != 200:  # (the index of these: schema.py)
            conditions.append(records.c.status != 200)
        if q.cursor is not None:
            ts, record_id = q.cursor.split(":", 1)
            conditions.append(
                or_(
                    records.c.ts_ms < int(ts),
                    and_(records.c.ts_ms == int(ts), records.c.record_id < record_id),
                )
            )
        stmt = (
            select(records)
            .where(*conditions)
            .order_by(records.c.ts_ms.desc(), records.c.record_id.desc())
            .limit(q.limit + 1)
        )
        async with self._reader.connect() as conn:
            rows = [dict(row) for row in (await conn.execute(stmt)).mappings()]
        more = len(rows) > q.limit
        rows = rows[: q.limit]
        cursor = f"{rows[-1]['ts_ms']}:{rows[-1]['record_id']}" if more else None
        return rows, cursor

    async def export(
        self, q: ExportQuery, chunk: int = 5000, *, lines: bool = False
    ) -> AsyncIterator[list[Sequence[Any]]]:
        """Every record of the query, oldest first, in chunks of tuples (`RECORD_COLUMNS`; with
        `lines`, 1-tuples of its CSV line), read through the driver's own cursor (a server-side
        one on PostgreSQL): any size, in bounded memory, without SQLAlchemy's work per row."""
        sql, params = export_sql(self.dialect, q, lines=lines)
        async with self._reader.connect() as conn:
            raw = await conn.get_raw_connection()
            driver: Any = raw.driver_connection
            if self.dialect == "postgresql":
                async with driver.transaction(readonly=True):
                    cursor = await driver.cursor(sql, *params)
                    while part := await cursor.fetch(chunk):
                        yield [tuple(row) for row in part]
            elif q.key is None:
                async for part in self._sqlite_windows(driver, q, chunk, lines):
                    yield part
            else:
                async with driver.execute(sql, params) as cursor:
                    while part := await cursor.fetchmany(chunk):
                        yield part

    async def _sqlite_windows(
        self, driver: Any, q: ExportQuery, chunk: int, lines: bool
    ) -> AsyncIterator[list[Sequence[Any]]]:
        """SQLite's export over every key, a window of time at a time (`sqlite_window_sql`),
        in one read transaction (one snapshot, as one statement would read)."""
        sql, params = sqlite_window_sql(q, lines=lines)
        await driver.execute("BEGIN")
        try:
            async with driver.execute(SQLITE_KEYS) as cursor:
                keys = json.dumps([row[0] for row in await cursor.fetchall()])
            async with driver.execute(SQLITE_BOUNDS) as cursor:
                first, last = await cursor.fetchone()
            if first is None:
                return
            low = max(first, int(q.start.timestamp()) * 1000 if q.start else first)
            high = min(last + 1, int(q.end.timestamp()) * 1000 if q.end else last + 1)
            for start in range(low, high, WINDOW_MS):
                window = [keys, *params, start, min(high, start + WINDOW_MS)]
                async with driver.execute(sql, window) as cursor:
                    while part := await cursor.fetchmany(chunk):
                        yield part
        finally:
            await driver.execute("ROLLBACK")

    async def export_csv(self, q: ExportQuery, chunk: int = 5000) -> AsyncIterator[bytes]:
        """The export as CSV lines (`CSV_COLUMNS`, no header): the database writes each line
        (text quoted, NULL empty, `created_at` the ISO moment to the millisecond). SQLite's
        come in chunks of up to `chunk` lines, which Python joins; PostgreSQL's from its
        COPY, as the server sends them (`export_sql.copy_sql`), with the reader's pace."""
        if self.dialect == "postgresql":
            async for data in self._copy_csv(q):
                yield data
            return
        async for part in self.export(q, chunk, lines=True):
            yield ("\n".join([row[0] for row in part]) + "\n").encode()

    async def _copy_csv(self, q: ExportQuery) -> AsyncIterator[bytes]:
        """PostgreSQL's CSV of the export, from a COPY TO STDOUT run in a task of its own that
        hands each part it receives over (a few at a time: the COPY waits for the reader)."""
        sql = copy_sql(q)
        parts: asyncio.Queue[bytes | None] = asyncio.Queue(maxsize=4)

        async def output(data: bytes) -> None:
            await parts.put(bytes(data))

        async with self._reader.connect() as conn:
            driver: Any = (await conn.get_raw_connection()).driver_connection

            async def copy() -> None:
                try:
                    await driver.copy_from_query(
                        sql, output=output, format="csv", force_quote=list(QUOTED)
                    )
                finally:
                    await parts.put(None)

            task = asyncio.create_task(copy())
            try:
                while (data := await parts.get()) is not None:
                    yield data
                await task  # (its error, if any)
            finally:
                if not task.done():  # the reader stopped early: the COPY is cancelled
                    task.cancel()
                    with suppress(asyncio.CancelledError):
                        await task
                    await conn.invalidate()

    async def last_use(self, key_ids: Sequence[str]) -> dict[str, int]:
        """Each key's latest record's time (epoch ms), for the keys that have one: one
        statement of one indexed lookup per key."""
        if not key_ids:
            return {}
        latest = [
            select(
                literal(key_id, String).label("key_id"),
                select(func.max(records.c.ts_ms))
                .where(records.c.key_id == key_id)
                .scalar_subquery()
                .label("ts_ms"),
            )
            for key_id in dict.fromkeys(key_ids)
        ]
        async with self._reader.connect() as conn:
            found = (await conn.execute(union_all(*latest))).all()
        return {key_id: int(ts) for key_id, ts in found if ts is not None}

    async def count(self) -> int:
        async with self._reader.connect() as conn:
            return int((await conn.execute(select(func.count()).select_from(records))).scalar_one())

    async def size_bytes(self) -> int | None:
        """The database's size on disk (PostgreSQL: the current database's)."""
        async with self._reader.connect() as conn:
            if self.dialect == "sqlite":
                pages = (await conn.execute(text("PRAGMA page_count"))).scalar_one()
                size = (await conn.execute(text("PRAGMA page_size"))).scalar_one()
                return int(pages) * int(size)
            found = await conn.execute(text("SELECT pg_database_size(current_database())"))
            return int(found.scalar_one())

    @property
    def writer(self) -> AsyncEngine:
        return self._writer

    async def run(self, statement: str) -> None:
        """Run one statement in its own transaction (maintenance: ANALYZE, VACUUM)."""
        conn: AsyncConnection
        async with self._writer.begin() as conn:
            await conn.execute(text(statement))
