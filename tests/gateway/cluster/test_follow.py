"""Publisher -> Redis -> follower, driven step by step on the real Redis (no engine): the index a
node builds from Redis alone matches what the publisher holds, through gaps, restarts, lost Redis
data and expired liveness."""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from redis.asyncio import Redis
from redis.exceptions import RedisError
from structlog.testing import capture_logs

from backend.engine.block_hash import root_hash
from backend.engine.blocks import BlockEvicted, BlockStored
from gateway.cluster.follower import IndexFollower
from gateway.cluster.index import PrefixIndex
from gateway.cluster.keys import ClusterKeys, NodeRecord
from gateway.cluster.publisher import BlockEventBuffer, BlockPublisher
from gateway.config.cluster import ClusterSettings
from testkit.gateway_app import REDIS_URL, PrivateRedis
from tests.support.cluster_index import ROOT, SETTINGS, blocks, follower, sync


class Node:
    """A publisher of its own buffer (standing in for an engine) under `node_id`."""

    def __init__(self, redis: Redis, prefix: str, node_id: str, settings: ClusterSettings) -> None:
        self.buffer = BlockEventBuffer()
        self.publisher = BlockPublisher(
            redis, ClusterKeys(prefix), node_id, self.buffer, self.record, settings
        )
        self.node_id = node_id

    def record(self, epoch: int) -> NodeRecord:
        return NodeRecord(f"http://{self.node_id}", ROOT.hex(), epoch, 0, 0, 100, 100)

    async def publish(self, *events: BlockStored | BlockEvicted) -> None:
        for event in events:
            self.buffer.push(event)
        await self.publisher.tick()


def held(f: IndexFollower, node: str, chain: list[BlockStored]) -> int:
    return f.index.prefix_blocks([b.block_hash for b in chain], [node])[node]


@pytest.fixture
async def shared(redis_prefix: str) -> AsyncIterator[tuple[Redis, str]]:
    client = Redis.from_url(REDIS_URL)
    yield client, redis_prefix
    await client.aclose()


async def test_a_late_joiner_builds_the_index_from_snapshot_then_stream(
    shared: tuple[Redis, str],
) -> None:
    redis, prefix = shared
    a = Node(redis, prefix, "a", SETTINGS)
    await a.publisher.start()
    chain = blocks(5)
    await a.publish(*chain[:3])
    early = follower(redis, prefix)
    await sync(early)
    assert held(early, "a", chain) == 3
    await a.publish(chain[3], chain[4], BlockEvicted(chain[4].block_hash))
    # a snapshot now, then more events: a late joiner reads both
    await a.publisher._write_snapshot()
    await a.publish(BlockEvicted(chain[3].block_hash))
    late = follower(redis, prefix)
    await sync(late)
    await sync(early)
    for f in (early, late):
        assert held(f, "a", chain) == 3
        assert f.index.num_blocks("a") == 3
    assert late.index.position("a") == early.index.position("a")


async def test_a_gap_in_the_stream_is_resynced_from_the_snapshot(
    shared: tuple[Redis, str],
) -> None:
    redis, prefix = shared
    every_tick = SETTINGS.model_copy(update={"snapshot_interval_s": 1e-9})
    a = Node(redis, prefix, "a", every_tick)
    await a.publisher.start()
    chain = blocks(4)
    f = follower(redis, prefix)
    await a.publish(chain[0])
    await sync(f)
    await a.publish(chain[1])
    await a.publish(chain[2], chain[3])
    # the entry holding chain[1] is lost (a trimmed stream)
    key = ClusterKeys(prefix).stream("a")
    entries = await redis.xrange(key)
    await redis.xdel(key, entries[-2][0])
    resyncs = f.num_resyncs
    await f.read_streams(block_ms=1)
    assert f.num_resyncs == resyncs + 1
    assert held(f, "a", chain) == 4


async def test_a_restart_clears_the_nodes_entries(shared: tuple[Redis, str]) -> None:
    redis, prefix = shared
    a = Node(redis, prefix, "a", SETTINGS)
    await a.publisher.start()
    chain = blocks(3)
    await a.publish(*chain)
    f = follower(redis, prefix)
    await sync(f)
    assert held(f, "a", chain) == 3
    restarted = Node(redis, prefix, "a", SETTINGS)
    await restarted.publisher.start()  # a new epoch opening with AllBlocksCleared
    resyncs = f.num_resyncs
    await f.read_streams(block_ms=1)
    await f.poll()
    assert held(f, "a", chain) == 0
    assert f.num_resyncs == resyncs  # applied from the stream, no resync needed
    await restarted.publish(*chain[:1])
    await sync(f)
    assert held(f, "a", chain) == 1


async def test_a_node_whose_liveness_expires_loses_its_entries(shared: tuple[Redis, str]) -> None:
    redis, prefix = shared
    a, b = Node(redis, prefix, "a", SETTINGS), Node(redis, prefix, "b", SETTINGS)
    await a.publisher.start()
    await b.publisher.start()
    chain = blocks(2)
    await a.publish(*chain)
    await b.publish(*chain)
    f = follower(redis, prefix)
    await sync(f)
    assert set(f.index.holders(chain[0].block_hash)) == {"a", "b"}
    # a stops heartbeating (killed): its key expires after the TTL
    deadline = time.monotonic() + 10
    while "a" in f.live(time.monotonic()):
        assert time.monotonic() < deadline, "a's liveness never expired"
        await b.publisher.tick()
        await asyncio.sleep(0.05)
        await f.poll()
    assert set(f.index.holders(chain[0].block_hash)) == {"b"}
    await b.publisher.close()  # a clean leave is seen at the next poll
    await f.poll()
    assert not f.index.holders(chain[0].block_hash)
    assert f.live(time.monotonic()) == {}


async def test_lost_redis_data_is_republished_and_resynced(tmp_path: Path) -> None:
    server = PrivateRedis(tmp_path)
    server.start()
    redis = Redis.from_url(server.url())
    try:
        a = Node(redis, "p:", "a", SETTINGS)
        await a.publisher.start()
        chain = blocks(3)
        await a.publish(*chain[:2])
        f = follower(redis, "p:")
        await sync(f)
        assert held(f, "a", chain) == 2
        server.stop()  # Redis goes away ...
        with pytest.raises((RedisError, OSError)):
            await a.publish(chain[2])
        with pytest.raises((RedisError, OSError)):
            await sync(f)
        shutil.rmtree(tmp_path / "appendonlydir", ignore_errors=True)
        server.start()  # ... and comes back empty
        await a.publisher._heartbeat()  # notices its snapshot is gone
        await a.publish()  # a new epoch, with a full snapshot
        await sync(f)
        assert held(f, "a", chain) == 3
        await a.publish(BlockEvicted(chain[2].block_hash))
        await sync(f)
        assert held(f, "a", chain) == 2
    finally:
        await redis.aclose()
        server.stop()


async def test_peers_joins_leaves_and_incompatible_nodes_are_seen_and_logged_once(
    shared: tuple[Redis, str],
) -> None:
    """The follower of node "me" shows every other member (live, compatible, load, cached
    blocks) and logs each transition once: joins, leaves, and nodes of another block size or
    checkpoint, whose blocks it never compares with its own."""
    redis, prefix = shared
    keys = ClusterKeys(prefix)
    me, a = Node(redis, prefix, "me", SETTINGS), Node(redis, prefix, "a", SETTINGS)
    await me.publisher.start()
    await a.publisher.start()
    await a.publish(*blocks(3))
    other_size = NodeRecord("http://wide", root_hash(b"seed", 8).hex(), 1, 2, 30, 40, 50, 8)
    other_model = NodeRecord("http://other", root_hash(b"other", 4).hex(), 1, 0, 0, 9, 9, 4)
    await redis.set(keys.live("wide"), other_size.dumps(), px=60_000)
    await redis.set(keys.live("other"), other_model.dumps(), px=60_000)
    await redis.sadd(keys.members, "wide", "other")
    f = IndexFollower(redis, keys, ROOT.hex(), SETTINGS, PrefixIndex(), node_id="me", block_size=4)
    with capture_logs() as logs:
        await sync(f)
        await sync(f)  # nothing changed: nothing logged again
    views = {v.node: v for v in f.peers(time.monotonic())}
    assert set(views) == {"a", "wide", "other"}  # this node is no peer of its own
    assert views["a"].live and views["a"].compatible and views["a"].cached_blocks == 3
    assert views["a"].free_blocks == 100 and views["a"].url == "http://a"
    assert views["wide"].live and not views["wide"].compatible
    assert views["wide"].incompatible == "block size 8 there, 4 here"
    assert (views["wide"].waiting, views["wide"].running_tokens) == (2, 30)
    assert "checkpoint" in views["other"].incompatible
    events = [(e["event"], e.get("peer")) for e in logs]
    assert sorted(events) == [
        ("cluster_peer_incompatible", "other"),
        ("cluster_peer_incompatible", "wide"),
        ("cluster_peer_joined", "a"),
    ]
    with capture_logs() as logs:
        await a.publisher.close()  # a clean leave
        await redis.delete(keys.live("wide"))  # a liveness key that expired
        await f.poll()
    assert [(e["event"], e["peer"]) for e in logs] == [
        ("cluster_peer_left", "a"),
        ("cluster_peer_left", "wide"),
    ]
    views = {v.node: v for v in f.peers(time.monotonic())}
    assert set(views) == {"wide", "other"}
    assert not views["wide"].live and views["wide"].as_json() == {"node": "wide", "live": False}
