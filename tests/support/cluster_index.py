"""A followed cluster index on the real Redis: block events, a follower and a sync."""

from __future__ import annotations

from redis.asyncio import Redis

from backend.engine.block_hash import block_hash, root_hash
from backend.engine.blocks import BlockStored
from gateway.cluster.follower import IndexFollower
from gateway.cluster.index import PrefixIndex
from gateway.cluster.keys import ClusterKeys
from gateway.config.cluster import ClusterSettings

ROOT = root_hash(b"seed", 4)


SETTINGS = ClusterSettings(heartbeat_s=0.05, liveness_ttl_s=0.3, snapshot_interval_s=3600)


def blocks(n: int, start: int = 0) -> list[BlockStored]:
    out, parent = [], ROOT
    for i in range(n):
        tokens = tuple(start + 4 * i + j for j in range(4))
        out.append(BlockStored(block_hash(parent, tokens), parent, tokens))
        parent = out[-1].block_hash
    return out


def follower(redis: Redis, prefix: str, settings: ClusterSettings = SETTINGS) -> IndexFollower:
    return IndexFollower(redis, ClusterKeys(prefix), ROOT.hex(), settings, PrefixIndex())


async def sync(f: IndexFollower) -> None:
    await f.poll()
    await f.read_streams(block_ms=1)
