"""`UsageConsumer`: moves records from the Redis usage stream into the usage store.

Every process that stores usage runs one; they share one consumer group, so each record is
read by one of them. A batch is stored (idempotently by entry id, rollups in the same
transaction), then acknowledged, then the stream is trimmed below the oldest entry not yet
acknowledged: nothing unstored is ever trimmed. A consumer that failed mid-batch (Redis or
the database down) re-reads its own pending entries (XREADGROUP from id 0 under its own name)
as soon as it recovers, all of them before anything new, with no wait; entries a dead
consumer read and never acknowledged are claimed (XAUTOCLAIM) after `claim_idle_s`. A crash
between the commit and the ack stores nothing twice.

While a full batch is being stored (the database works in its own thread or server), the next
new entries are read and made into rows (a backlog drains at the pace of the slower of the
two, not of both added up); they are stored by the next step, or before `run` returns. A batch
is read a chunk at a time, each chunk's stream fields let go once made into rows, so a batch
holds its rows and ids (about 2 KiB a record), not its entries as well.
After a batch that was not full (live traffic, not a backlog), `run` waits `flush_ms` before
reading again, so that a batch holds that while's records: a transaction and an ack and trim a
second, not one per few records.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import socket
import sqlite3
from collections.abc import Sequence
from typing import Any

import structlog
from redis.asyncio import Redis
from redis.exceptions import RedisError, ResponseError
from sqlalchemy.exc import SQLAlchemyError

from gateway.config.usage import UsageSettings
from gateway.keys.store import text
from gateway.usage_store.rows import rows_of
from gateway.usage_store.store import UsageStore

log = structlog.get_logger("gateway.usage_store")

Entry = tuple[Any, dict[Any, Any]]
_FAILURES = (RedisError, SQLAlchemyError, sqlite3.Error, OSError, asyncio.TimeoutError)
_MAX_RETRY_S = 30.0
# Consumers with nothing pending idle this long are removed from the group (dead processes').
_FORGET_IDLE_MS = 86_400_000
_READ_CHUNK = 5_000  # entries a read asks for: a batch is read in chunks of this many


def _next_id(entry_id: str) -> str:
    ms, _, seq = entry_id.partition("-")
    return f"{ms}-{int(seq or 0) + 1}"


class UsageConsumer:
    def __init__(
        self,
        redis: Redis,
        store: UsageStore,
        *,
        stream: str,
        settings: UsageSettings,
        local_providers: frozenset[str],
        name: str | None = None,
    ) -> None:
        self._redis = redis
        self._store = store
        self.stream = stream
        self.group = settings.group
        self.name = name or f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
        self._settings = settings
        self._local = local_providers
        # Whether some of our own entries may be pending (read, not acknowledged) that we do
        # not hold: at start (a restarted consumer of the same name) and after any failure;
        # cleared only once a read of them comes back short (they are all in hand). While it
        # is set they are read before new ones, at once, not claimed after `claim_idle_s`.
        self._own_pending = True
        # read and made into rows, not stored yet: the entries' ids and their rows
        self._ahead: tuple[list[Any], list[dict[str, Any]]] | None = None
        self._stopping = asyncio.Event()
        self.stored = 0  # records this consumer stored (new to the store)

    async def ensure_group(self) -> None:
        """Create the group (reading from the stream's start) unless it exists."""
        try:
            await self._redis.xgroup_create(self.stream, self.group, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    async def step(self, block_ms: int | None = None) -> int:
        """One round: claim a dead consumer's entries, else re-read our own pending ones, else
        read new ones (waiting up to `block_ms`); store, ack, trim. Returns the entries
        handled."""
        batch = self._settings.batch_size
        if self._ahead is not None:
            (ids, rows), self._ahead = self._ahead, None
        else:
            ids, rows = self._rows(await self._claim(batch))
            if not ids and self._own_pending:
                ids, rows, more = await self._read_pending(batch)
                # all of ours are in hand: a failure storing them sets the flag again (`run`)
                self._own_pending = more
            if not ids and not self._own_pending:
                wait = self._settings.block_ms if block_ms is None else block_ms
                ids, rows = await self._read_rows(">", batch, wait)
            if not ids:
                return 0
        read_ahead = len(ids) >= batch and not self._stopping.is_set()
        more_pending, self._own_pending = self._own_pending, True  # (a failure: re-read them)
        await self._store_and_ack(ids, rows, read_ahead)
        self._own_pending = more_pending
        return len(ids)

    async def _read_pending(self, count: int) -> tuple[list[Any], list[dict[str, Any]], bool]:
        """Up to `count` of our own pending entries (read before, not acknowledged: a batch
        whose store or ack failed, or read ahead of one), from the oldest, as ids and rows;
        and whether more may be pending after them."""
        ids: list[Any] = []
        rows: list[dict[str, Any]] = []
        after = "0"
        while len(ids) < count:
            want = min(_READ_CHUNK, count - len(ids))
            entries, read, last = await self._read_with_count(after, want, None)
            if entries:
                more_ids, more_rows = self._rows(entries)
                ids += more_ids
                rows += more_rows
            if read < want:
                return ids, rows, False
            after = last
        return ids, rows, True

    def _rows(self, entries: list[Entry]) -> tuple[list[Any], list[dict[str, Any]]]:
        """The entries' ids and rows; the entries' fields are let go (a batch holds its rows
        and ids only)."""
        rows = rows_of(entries, self._local)
        ids = [entry_id for entry_id, _ in entries]
        entries.clear()
        return ids, rows

    async def _read_rows(
        self, after: str, count: int, block_ms: int | None
    ) -> tuple[list[Any], list[dict[str, Any]]]:
        """Up to `count` new entries (`after` ">") as their ids and rows, read `_READ_CHUNK` at
        a time, each chunk's fields let go once made into rows (a batch's fields are the larger
        part of it); only the first read waits."""
        ids: list[Any] = []
        rows: list[dict[str, Any]] = []
        while len(ids) < count:
            want = min(_READ_CHUNK, count - len(ids))
            entries = await self._read(after, want, None if ids else block_ms)
            got = len(entries)
            if got:
                more_ids, more_rows = self._rows(entries)
                ids += more_ids
                rows += more_rows
            if got < want:
                break
        return ids, rows

    async def _read(self, after: str, count: int, block_ms: int | None) -> list[Entry]:
        return (await self._read_with_count(after, count, block_ms))[0]

    async def _read_with_count(
        self, after: str, count: int, block_ms: int | None
    ) -> tuple[list[Entry], int, Any]:
        """The entries after `after` that still have their fields, how many the read returned
        (with those trimmed away: acknowledged here) and the last one's id."""
        reply: Any = await self._redis.xreadgroup(
            self.group, self.name, {self.stream: after}, count=count, block=block_ms
        )
        if not reply:
            return [], 0, after
        # RESP2: [[stream, entries]]; RESP3: {stream: [entries]}.
        found = reply[0][1] if isinstance(reply, list) else next(iter(reply.values()))
        entries: list[Entry] = found[0] if found and isinstance(found[0], list) else found
        # Our pending entries trimmed away come back without fields: nothing left to store.
        gone = [entry_id for entry_id, fields in entries if not fields]
        if gone:
            await self._redis.xack(self.stream, self.group, *gone)
        last = entries[-1][0] if entries else after
        return [(entry_id, fields) for entry_id, fields in entries if fields], len(entries), last

    async def _claim(self, count: int) -> list[Entry]:
        idle_ms = int(self._settings.claim_idle_s * 1000)
        reply: Any = await self._redis.xautoclaim(
            self.stream, self.group, self.name, idle_ms, start_id="0-0", count=count
        )
        entries: list[Entry] = reply[1]
        deleted = reply[2] if len(reply) > 2 else []
        if deleted:
            await self._redis.xack(self.stream, self.group, *deleted)
        if entries:
            log.warning("usage_records_claimed", count=len(entries), consumer=self.name)
        return [(entry_id, fields) for entry_id, fields in entries if fields]

    async def _store_and_ack(
        self, ids: Sequence[Any], rows: list[dict[str, Any]], read_ahead: bool
    ) -> None:
        """Store, ack, trim; with `read_ahead`, the next new entries are read and made into
        rows while the store works (kept for the next step only if this one succeeds)."""
        storing = asyncio.ensure_future(self._store.insert(rows))
        ahead: tuple[list[Any], list[dict[str, Any]]] | None = None
        try:
            if read_ahead:
                ahead = await self._read_rows(">", self._settings.batch_size, None)
                if not ahead[0]:
                    ahead = None
        except BaseException:
            await asyncio.wait([storing])  # never left running; the read's failure is raised
            if not storing.cancelled():
                storing.exception()  # (retrieved: the batch stays pending either way)
            raise
        self.stored += await storing
        await self._redis.xack(self.stream, self.group, *ids)
        await self.trim()
        self._ahead = ahead

    async def trim(self) -> None:
        """Trim the stream below its oldest entry the group has not acknowledged."""
        groups = await self._redis.xinfo_groups(self.stream)
        mine = next((g for g in groups if text(g["name"]) == self.group), None)
        if mine is None:
            return
        if int(mine["pending"]):
            summary = await self._redis.xpending(self.stream, self.group)
            min_id = text(summary["min"])
        else:
            min_id = _next_id(text(mine["last-delivered-id"]))
        await self._redis.xtrim(self.stream, minid=min_id, approximate=False)

    async def forget_dead(self) -> None:
        """Remove consumers that hold nothing and have been idle for a day."""
        for consumer in await self._redis.xinfo_consumers(self.stream, self.group):
            name = text(consumer["name"])
            if (
                name != self.name
                and int(consumer["pending"]) == 0
                and int(consumer["idle"]) > _FORGET_IDLE_MS
            ):
                await self._redis.xgroup_delconsumer(self.stream, self.group, name)

    async def run(self) -> None:
        """Consume until `stop()`; a failure (Redis or the database down) is retried with
        backoff, and nothing read is lost: it stays pending until stored."""
        delay = self._settings.retry_s
        ready = False
        while not self._stopping.is_set():
            try:
                if not ready:
                    await self.ensure_group()
                    await self.forget_dead()
                    ready = True
                handled = await self.step()
                delay = self._settings.retry_s
                if 0 < handled < self._settings.batch_size and self._settings.flush_ms:
                    # live traffic: the next batch gathers a while (stop still ends it at once)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(
                            self._stopping.wait(), self._settings.flush_ms / 1000
                        )
            except _FAILURES as exc:
                self._own_pending = True  # what was read ahead is among our pending entries
                self._ahead = None
                if isinstance(exc, ResponseError) and "NOGROUP" in str(exc):
                    ready = False  # the stream or group was deleted: create it again
                log.warning(
                    "usage_consumer_retry", error=f"{type(exc).__name__}: {exc}"[:300], wait_s=delay
                )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), delay)
                delay = min(delay * 2, _MAX_RETRY_S)
        if self._ahead is not None:  # read ahead before the stop: stored now, not claimed later
            try:
                await self.step()
            except _FAILURES as exc:
                self._ahead = None  # still pending: re-read or claimed by the next consumer
                log.warning("usage_consumer_stop", error=f"{type(exc).__name__}: {exc}"[:300])

    def stop(self) -> None:
        """Finish the batch under way, then return from `run`."""
        self._stopping.set()
