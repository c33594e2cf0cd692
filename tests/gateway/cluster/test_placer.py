"""The cluster placer's `fit` (what the router asks) against `decide` (what serving does): the
same node and cached prefix, this node's prefix from its own engine rather than the index, and
`routing = "local"` never naming a peer. Peers publish through the real Redis (no engine)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest
from redis.asyncio import Redis

from gateway.cluster.keys import ClusterKeys, NodeRecord
from gateway.cluster.placer import ClusterPlacer
from gateway.cluster.publisher import BlockEventBuffer, BlockPublisher
from gateway.cluster.scoring import NodeLoad
from gateway.config.cluster import ClusterSettings
from providers.types import EngineFit
from testkit.gateway_app import REDIS_URL
from tests.support.cluster_index import ROOT, blocks, follower, sync

BS = 4
CHAIN = blocks(5)  # a prompt of 21 tokens: 5 reusable blocks of 4
HASHES = [b.block_hash for b in CHAIN]
# cheap waits and forwards, so a peer holding the prefix wins against an idle, cold self
SETTINGS = ClusterSettings(
    heartbeat_s=0.05, liveness_ttl_s=5, waiting_cost_tokens=2, forward_cost_tokens=1
)


class Peer:
    def __init__(self, redis: Redis, prefix: str, node_id: str, waiting: int) -> None:
        self.buffer = BlockEventBuffer()
        self.waiting = waiting
        keys = ClusterKeys(prefix)
        self.publisher = BlockPublisher(redis, keys, node_id, self.buffer, self.record, SETTINGS)

    def record(self, epoch: int) -> NodeRecord:
        return NodeRecord("http://peer", ROOT.hex(), epoch, self.waiting, 0, 100, 100)

    async def holds(self, n: int) -> None:
        await self.publisher.start()
        for event in CHAIN[:n]:
            self.buffer.push(event)
        await self.publisher.tick()


@pytest.fixture
async def shared(redis_prefix: str) -> AsyncIterator[tuple[Redis, str, aiohttp.ClientSession]]:
    client = Redis.from_url(REDIS_URL)
    async with aiohttp.ClientSession() as session:
        yield client, redis_prefix, session
    await client.aclose()


async def placer_for(
    shared: tuple[Redis, str, aiohttp.ClientSession],
    own: set[bytes],
    settings: ClusterSettings = SETTINGS,
) -> ClusterPlacer:
    redis, prefix, session = shared
    f = follower(redis, prefix, settings)
    await sync(f)

    def cached_prefix(hashes: list[bytes]) -> int:  # the engine's answer: its leading run
        return next((i for i, h in enumerate(hashes) if h not in own), len(hashes))

    return ClusterPlacer(
        "a", BS, object(), lambda: NodeLoad(0, 0, 100), cached_prefix, f, session, settings
    )  # type: ignore[arg-type]


async def test_fit_names_the_peer_decide_forwards_to(
    shared: tuple[Redis, str, aiohttp.ClientSession],
) -> None:
    await Peer(shared[0], shared[1], "b", waiting=1).holds(5)
    placer = await placer_for(shared, own=set(HASHES[:1]))
    fit = placer.fit(21, HASHES)
    assert fit == EngineFit(cached_tokens=20, peer="b", peer_waiting=1)
    assert len(placer.pending) == 0  # the router's question marks nothing
    placement = placer.decide(21, HASHES)
    assert (placement.node_id, placement.cached_blocks * BS) == (fit.peer, fit.cached_tokens)


async def test_this_nodes_prefix_comes_from_its_engine_not_the_index(
    shared: tuple[Redis, str, aiohttp.ClientSession],
) -> None:
    # the index still lists blocks as this node's (their eviction has not come back yet)
    await Peer(shared[0], shared[1], "a", waiting=0).holds(5)
    placer = await placer_for(shared, own=set())
    assert placer.fit(21, HASHES) == EngineFit(0)
    # and blocks the engine holds count at once, before their events went round Redis
    placer = await placer_for(shared, own=set(HASHES[:3]))
    assert placer.fit(21, HASHES) == EngineFit(12)
    assert placer.decide(21, HASHES).cached_blocks == 3


async def test_routing_local_never_names_a_peer(
    shared: tuple[Redis, str, aiohttp.ClientSession],
) -> None:
    await Peer(shared[0], shared[1], "b", waiting=0).holds(5)
    local = SETTINGS.model_copy(update={"routing": "local"})
    placer = await placer_for(shared, own=set(HASHES[:2]), settings=local)
    assert placer.fit(21, HASHES) == EngineFit(8)
    assert placer.decide(21, HASHES).local
