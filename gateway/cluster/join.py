"""Joining the cluster with the local engine: publisher, index follower, placer, sweeper."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
import structlog
from redis.asyncio import Redis

from backend.engine.block_hash import root_hash
from gateway.cluster.follower import IndexFollower
from gateway.cluster.index import PrefixIndex
from gateway.cluster.keys import ClusterKeys, NodeRecord, published_root
from gateway.cluster.node import ClusterNode
from gateway.cluster.placer import ClusterPlacer
from gateway.cluster.publisher import BlockPublisher
from gateway.cluster.scoring import NodeLoad
from providers.local.engine_client import ServedEngine

log = structlog.get_logger("gateway.cluster")


@asynccontextmanager
async def join_cluster(
    node: ClusterNode,
    engine: ServedEngine,
    redis: Redis,
    keys: ClusterKeys,
    session: aiohttp.ClientSession,
) -> AsyncIterator[ClusterPlacer]:
    """Publish `engine`'s blocks (a new epoch), follow every node's, and yield the placer;
    on exit leave the cluster (the liveness key is deleted at once)."""
    settings = node.settings
    root = root_hash(engine.hash_seed, engine.block_size)
    block_size = engine.block_size
    # several attention ranks: blocks published with their ranks (index format 2)
    ranked = engine.stats().num_attention_ranks > 1

    def local_load() -> NodeLoad:
        s = engine.stats()
        used = s.num_total_blocks - s.num_free_blocks
        return NodeLoad(s.num_waiting, used * block_size, s.num_free_blocks)

    def record(epoch: int) -> NodeRecord:
        load = local_load()
        total = engine.stats().num_total_blocks
        return NodeRecord(
            node.url,
            published_root(root.hex(), ranked=ranked),
            epoch,
            load.waiting,
            load.running_tokens,
            load.free_blocks,
            total,
            block_size,
        )

    publisher = BlockPublisher(
        redis, keys, node.node_id, node.buffer, record, settings, ranked=ranked
    )
    follower = IndexFollower(
        redis,
        keys,
        root.hex(),
        settings,
        PrefixIndex(),
        node_id=node.node_id,
        block_size=block_size,
    )
    placer = ClusterPlacer(
        node.node_id,
        block_size,
        engine,
        local_load,
        engine.cached_prefix_blocks,
        follower,
        session,
        settings,
    )
    await publisher.start()
    tasks = [
        asyncio.create_task(publisher.run(), name="cluster-publisher"),
        asyncio.create_task(follower.run(), name="cluster-follower"),
        asyncio.create_task(_sweep(placer, settings.pending_s or 1.0), name="cluster-sweeper"),
    ]
    log.info("cluster_joined", node=node.node_id, url=node.url, epoch=publisher.epoch)
    try:
        yield placer
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await publisher.close()
        await placer.aclose()
        log.info("cluster_left", node=node.node_id)


@asynccontextmanager
async def serve_engine(node: ClusterNode, engine: ServedEngine) -> AsyncIterator[ClusterPlacer]:
    """`node` serving `engine`: its blocks published, everyone's followed, prompts placed,
    until exit (the local provider's `open_placer`)."""
    if node.engine is not None:
        raise RuntimeError("a cluster node serves one local engine")
    async with join_cluster(node, engine, node.redis, node.keys, node.session) as placer:
        node.engine, node.placer = engine, placer
        try:
            yield placer
        finally:
            node.engine = node.placer = None


async def _sweep(placer: ClusterPlacer, every_s: float) -> None:
    while True:
        await asyncio.sleep(every_s)
        placer.sweep()
