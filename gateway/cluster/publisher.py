"""Publishes this node's prefix-cache blocks to Redis: events, snapshot, liveness and load.

The engine thread hands block events to a `BlockEventBuffer`; every `flush_s` the publisher
drains it, numbers the events (seq, 1-based within an epoch) and writes them as one stream entry
`<epoch>-<first seq>`, in the same MULTI as the snapshot when one is due, so a snapshot always
names the exact stream position it reflects. It keeps its own copy of the cached hashes (the
snapshot's content: each cached hash with the mask of the ranks holding it). With `ranked` (an
engine of several data-parallel attention ranks) entries and snapshot are in index format 2,
with each block's rank (`gateway.cluster.events`, `gateway.cluster.keys`); else in format 1,
which readers of format 1 alone read too. A start is a new epoch whose first event is
`AllBlocksCleared`. When a write fails (or Redis lost the snapshot, say after a restart without
persistence), the next tick opens a new epoch with a full snapshot, so readers resync instead of
missing events. Every `heartbeat_s` the liveness record (address, cache root, load) is written
with a TTL.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

import structlog
from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from redis.exceptions import RedisError

from backend.engine.blocks import BlockEvent, BlockEvicted, BlockStored
from gateway.cluster.events import AllBlocksCleared, IndexEvent, entry_fields
from gateway.cluster.keys import ClusterKeys, NodeRecord, encode_masks
from gateway.config.cluster import ClusterSettings

log = structlog.get_logger("gateway.cluster.publisher")


class BlockEventBuffer:
    """Block events from the engine thread, waiting for the publisher (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._events: list[BlockEvent] = []

    def push(self, event: BlockEvent) -> None:
        with self._lock:
            self._events.append(event)

    def drain(self) -> list[BlockEvent]:
        with self._lock:
            events, self._events = self._events, []
        return events


class BlockPublisher:
    """`record()` gives the node's liveness record (its load now); `start`, then `run`."""

    def __init__(
        self,
        redis: Redis,
        keys: ClusterKeys,
        node_id: str,
        buffer: BlockEventBuffer,
        record: Callable[[int], NodeRecord],
        settings: ClusterSettings,
        *,
        ranked: bool = False,
    ) -> None:
        self._redis = redis
        self._ranked = ranked
        self._keys = keys
        self._node = node_id
        self._buffer = buffer
        self._record = record
        self._settings = settings
        self._epoch = 0
        self._seq = 0
        self._mirror: dict[bytes, int] = {}  # cached hash -> the mask of ranks holding it
        self._broken = False  # a write failed: the next tick opens a new epoch
        self._snapshot_due = 0.0
        self._heartbeat_due = 0.0

    @property
    def epoch(self) -> int:
        return self._epoch

    async def start(self) -> None:
        """A new epoch starting with `AllBlocksCleared` (whatever this node published before
        is gone), then the first heartbeat."""
        raw = await self._redis.hget(self._keys.snapshot(self._node), "epoch")
        self._epoch = max(int(time.time() * 1000), int(raw or 0) + 1)
        self._seq = 0
        await self._flush([AllBlocksCleared(), *self._buffer.drain()], snapshot=True, fresh=True)
        await self._heartbeat()

    async def run(self) -> None:
        """Tick every `flush_s`; after a failure, wait a heartbeat before the next try."""
        pause = self._settings.flush_s
        while True:
            await asyncio.sleep(pause)
            pause = self._settings.flush_s
            try:
                await self.tick()
            except (RedisError, OSError) as exc:
                log.warning("cluster_publish_failed", error=str(exc))
                self._broken = True
                pause = self._settings.heartbeat_s
            except Exception:
                log.exception("cluster_publish_bug")
                self._broken = True
                pause = self._settings.heartbeat_s

    async def tick(self) -> None:
        now = time.monotonic()
        events: list[IndexEvent] = list(self._buffer.drain())
        if self._broken:
            self._apply(events)
            self._epoch = max(int(time.time() * 1000), self._epoch + 1)
            self._seq = 0
            await self._write_snapshot()
            self._broken = False
            self._heartbeat_due = 0.0  # peers learn the new epoch at once
            log.info("cluster_publisher_resynced", epoch=self._epoch, blocks=len(self._mirror))
        elif events or now >= self._snapshot_due:
            await self._flush(events, snapshot=now >= self._snapshot_due)
        if now >= self._heartbeat_due:
            await self._heartbeat()

    async def close(self) -> None:
        """Leave the cluster at once: peers drop this node's entries on their next poll."""
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.delete(self._keys.live(self._node))
                pipe.srem(self._keys.members, self._node)
                await pipe.execute()
        except (RedisError, OSError) as exc:
            log.warning("cluster_leave_failed", error=str(exc))

    async def _flush(
        self, events: list[IndexEvent], *, snapshot: bool, fresh: bool = False
    ) -> None:
        """One stream entry (and the snapshot when asked) in one MULTI; `fresh` drops the
        stream first (a start: older epochs mean nothing now)."""
        first = self._seq + 1
        self._apply(events)
        try:
            async with self._redis.pipeline(transaction=True) as pipe:
                if fresh:
                    pipe.delete(self._keys.stream(self._node), self._keys.snapshot(self._node))
                if events:
                    pipe.xadd(
                        self._keys.stream(self._node),
                        entry_fields(events, ranked=self._ranked),  # type: ignore[arg-type]
                        id=f"{self._epoch}-{first}",
                        maxlen=self._settings.stream_maxlen,
                        approximate=True,
                    )
                if snapshot:
                    self._queue_snapshot(pipe)
                await pipe.execute()
        except BaseException:
            self._broken = True
            raise

    def _apply(self, events: list[IndexEvent]) -> None:
        mirror = self._mirror
        for event in events:
            if isinstance(event, BlockStored):
                mirror[event.block_hash] = mirror.get(event.block_hash, 0) | 1 << event.rank
            elif isinstance(event, BlockEvicted):
                mask = mirror.pop(event.block_hash, 0) & ~(1 << event.rank)
                if mask:
                    mirror[event.block_hash] = mask
            else:
                mirror.clear()
        self._seq += len(events)

    async def _write_snapshot(self) -> None:
        async with self._redis.pipeline(transaction=True) as pipe:
            self._queue_snapshot(pipe)
            await pipe.execute()

    def _queue_snapshot(self, pipe: Pipeline) -> None:
        key = self._keys.snapshot(self._node)
        mapping: dict[str, int | bytes] = {
            "epoch": self._epoch,
            "seq": self._seq,
            "hashes": b"".join(self._mirror),
        }
        if self._ranked:
            mapping["ranks"] = encode_masks(list(self._mirror.values()))
        pipe.hset(key, mapping=mapping)  # type: ignore[arg-type]
        self._snapshot_due = time.monotonic() + self._settings.snapshot_interval_s

    async def _heartbeat(self) -> None:
        ttl_ms = int(self._settings.liveness_ttl_s * 1000)
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.set(self._keys.live(self._node), self._record(self._epoch).dumps(), px=ttl_ms)
            pipe.sadd(self._keys.members, self._node)
            pipe.exists(self._keys.snapshot(self._node))
            _, _, has_snapshot = await pipe.execute()
        self._heartbeat_due = time.monotonic() + self._settings.heartbeat_s
        if not has_snapshot:
            log.warning("cluster_snapshot_missing", node=self._node)
            self._broken = True
