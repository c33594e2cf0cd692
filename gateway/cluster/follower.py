"""Keeps the in-memory `PrefixIndex` in step with Redis, and knows which nodes are live.

Every `heartbeat_s` it reads the member set and every member's liveness record in one round
trip: a member with a record (and this node's cache root) is live; one without is dropped with
all its entries; one whose record names a newer epoch than its synced position is resynced. A
live node not yet synced is loaded from its snapshot, and its stream is then read from the
position the snapshot names (one blocking XREAD over all streams). A gap, a malformed entry or
a lost connection resyncs from the snapshot. When Redis cannot be read for longer than the
liveness TTL, no peer counts as live (requests are served locally). Every peer's join, leave
and incompatibility (another checkpoint or block size: its blocks are never compared with this
node's) is logged once per transition, and `peers` shows them (gateway/cluster/membership.py).
Nodes of both index formats are read (`gateway.cluster.keys`): a format 1 node's blocks count as
its rank 0's; a format 2 node's carry their ranks, in its stream and its snapshot.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import structlog
from redis.asyncio import Redis
from redis.exceptions import RedisError

from backend.engine.block_hash import HASH_SIZE
from gateway.cluster.events import MalformedBatch, decode_entry
from gateway.cluster.index import Applied, PrefixIndex
from gateway.cluster.keys import ClusterKeys, NodeRecord, decode_masks, parse_root
from gateway.cluster.peers import PeerView
from gateway.cluster.scoring import NodeLoad
from gateway.config.cluster import ClusterSettings

log = structlog.get_logger("gateway.cluster.follower")

_XREAD_COUNT = 512


class IndexFollower:
    def __init__(
        self,
        redis: Redis,
        keys: ClusterKeys,
        cache_root: str,
        settings: ClusterSettings,
        index: PrefixIndex,
        *,
        node_id: str = "",
        block_size: int = 0,
    ) -> None:
        """`node_id`, `block_size`: this node's (its own record is no peer; a peer's block
        size tells why it is incompatible)."""
        self._redis = redis
        self._node_id = node_id
        self._block_size = block_size
        self._members: list[str] = []
        self._foreign: dict[str, NodeRecord] = {}  # live nodes of another model cache
        self._keys = keys
        self._cache_root = cache_root
        self._settings = settings
        self.index = index
        self._records: dict[str, NodeRecord] = {}
        self._positions: dict[str, str] = {}  # synced node -> last stream id read
        self._valid_until = 0.0  # the live set is trusted until then
        self._poll_due = 0.0
        self.num_resyncs = 0

    def live(self, now: float) -> dict[str, NodeRecord]:
        """Live nodes (this one included once it published), by id."""
        return dict(self._records) if now < self._valid_until else {}

    def loads(self, now: float) -> dict[str, NodeLoad]:
        return {
            node: NodeLoad(r.waiting, r.running_tokens, r.free_blocks)
            for node, r in self.live(now).items()
        }

    async def run(self) -> None:
        backoff = self._settings.heartbeat_s
        while True:
            try:
                if time.monotonic() >= self._poll_due:
                    await self.poll()
                await self.read_streams(block_ms=int(self._settings.heartbeat_s * 1000))
                backoff = self._settings.heartbeat_s
            except (RedisError, OSError, MalformedBatch, ValueError) as exc:
                if isinstance(exc, RedisError | OSError):
                    log.warning("cluster_follow_failed", error=str(exc))
                else:
                    log.exception("cluster_follow_bad_data")
                self._positions.clear()  # every node is resynced once Redis answers again
                if time.monotonic() >= self._valid_until:
                    self._forget_all()
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self._settings.liveness_ttl_s)

    async def poll(self) -> None:
        """Read members and liveness; drop the dead, sync the newly live."""
        started = time.monotonic()
        raw_members = await self._redis.smembers(self._keys.members)
        members = sorted(m.decode() if isinstance(m, bytes) else m for m in raw_members)
        raws = await self._redis.mget([self._keys.live(m) for m in members]) if members else []
        records: dict[str, NodeRecord] = {}
        foreign: dict[str, NodeRecord] = {}
        for node, raw in zip(members, raws, strict=True):
            if raw is None:
                continue
            try:
                record = NodeRecord.loads(raw)
            except (ValueError, KeyError, TypeError):
                log.warning("cluster_bad_record", node=node)
                continue
            root, index_format = parse_root(record.cache_root)
            if root == self._cache_root and index_format:
                records[node] = record
            else:
                foreign[node] = record
        self._log_transitions(records, foreign)
        for node in list(self._records):
            if node not in records:
                self._forget(node)
        self._records = records
        self._foreign = foreign
        self._members = members
        self._valid_until = started + self._settings.liveness_ttl_s
        self._poll_due = started + self._settings.heartbeat_s
        for node, record in records.items():
            position = self.index.position(node)
            # a record of a newer epoch: the node republished (a restart, lost Redis data)
            if node not in self._positions or position is None or position[0] < record.epoch:
                await self.resync(node)

    async def resync(self, node: str) -> None:
        """Load `node` from its snapshot; without one it stays unsynced (and holds nothing)."""
        self.num_resyncs += 1
        snap: dict[Any, Any] = await self._redis.hgetall(self._keys.snapshot(node))
        self._positions.pop(node, None)
        if not snap or b"epoch" not in snap:
            self.index.drop(node)
            return
        epoch, seq, blob = int(snap[b"epoch"]), int(snap[b"seq"]), snap.get(b"hashes", b"")
        hashes = [blob[i : i + HASH_SIZE] for i in range(0, len(blob), HASH_SIZE)]
        record = self._records.get(node)
        ranked = record is not None and parse_root(record.cache_root)[1] == 2
        masks = decode_masks(snap.get(b"ranks", b""), len(hashes)) if ranked else None
        self.index.load_snapshot(node, epoch, seq, hashes, masks)
        self._positions[node] = f"{epoch}-{seq}"

    async def read_streams(self, block_ms: int) -> None:
        """Apply what the synced nodes' streams hold past their positions (waiting up to
        `block_ms` for something new)."""
        if not self._positions:
            await asyncio.sleep(block_ms / 1000)
            return
        streams: dict[Any, Any] = {self._keys.stream(n): p for n, p in self._positions.items()}
        node_of = {self._keys.stream(n).encode(): n for n in self._positions}
        replies: Any = await self._redis.xread(streams, count=_XREAD_COUNT, block=block_ms)
        for stream, entries in replies or []:
            node = node_of[stream]
            if node not in self._positions:
                continue
            await self._apply_entries(node, entries)

    async def _apply_entries(
        self, node: str, entries: list[tuple[bytes, dict[bytes, bytes]]]
    ) -> None:
        for entry_id, fields in entries:
            sid = entry_id.decode()
            epoch, _, seq = sid.partition("-")
            try:
                events = decode_entry(fields)
            except MalformedBatch:
                log.warning("cluster_bad_entry", node=node, id=sid)
                await self.resync(node)
                return
            if self.index.apply(node, int(epoch), int(seq), events) is Applied.GAP:
                log.info("cluster_gap", node=node, id=sid, at=self.index.position(node))
                await self.resync(node)
                return
            self._positions[node] = sid

    def peers(self, now: float) -> list[PeerView]:
        """Every other member as last polled: none counts as live once Redis could not be read
        for the liveness TTL."""
        trusted = now < self._valid_until
        views: list[PeerView] = []
        for node in self._members:
            if node == self._node_id:
                continue
            record = self._records.get(node) if trusted else None
            foreign = self._foreign.get(node) if trusted else None
            seen = record or foreign
            if seen is None:
                views.append(PeerView(node))
                continue
            views.append(
                PeerView(
                    node,
                    url=seen.url,
                    live=True,
                    compatible=record is not None,
                    incompatible=self._why_incompatible(seen) if foreign is not None else "",
                    waiting=seen.waiting,
                    running_tokens=seen.running_tokens,
                    free_blocks=seen.free_blocks,
                    total_blocks=seen.total_blocks,
                    cached_blocks=self.index.num_blocks(node) if record is not None else 0,
                )
            )
        return views

    def _log_transitions(
        self, records: dict[str, NodeRecord], foreign: dict[str, NodeRecord]
    ) -> None:
        """Log each peer that joined, left, or turned out to serve another model cache since
        the last poll (this node's own record is no peer)."""
        for node in sorted(records.keys() - self._records.keys() - {self._node_id}):
            record = records[node]
            log.info("cluster_peer_joined", peer=node, url=record.url, epoch=record.epoch)
        gone = (self._records.keys() | self._foreign.keys()) - records.keys() - foreign.keys()
        for node in sorted(gone - {self._node_id}):
            log.info("cluster_peer_left", peer=node, reason="liveness expired or left")
        for node in sorted(foreign.keys() - self._foreign.keys() - {self._node_id}):
            record = foreign[node]
            log.warning(
                "cluster_peer_incompatible",
                peer=node,
                url=record.url,
                reason=self._why_incompatible(record),
            )

    def _why_incompatible(self, record: NodeRecord) -> str:
        if record.block_size and self._block_size and record.block_size != self._block_size:
            return f"block size {record.block_size} there, {self._block_size} here"
        root, index_format = parse_root(record.cache_root)
        if root == self._cache_root and not index_format:
            return f"an index format this node cannot read (cache root {record.cache_root!r})"
        return "another checkpoint (its cache root differs)"

    def _forget(self, node: str) -> None:
        self.index.drop(node)
        self._positions.pop(node, None)
        self._records.pop(node, None)

    def _forget_all(self) -> None:
        for node in sorted((self._records.keys() | self._foreign.keys()) - {self._node_id}):
            log.info("cluster_peer_left", peer=node, reason="Redis unreadable")
        for node in list(self._records):
            self._forget(node)
        self._foreign = {}
