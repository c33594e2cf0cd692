"""The cluster index of a node with one block pool per data-parallel attention rank, through
the real Redis: the engine's per-rank events (`RankedBlockManager`) -> publisher (index format 2)
-> follower. Blocks keep their rank, eviction on one rank leaves the others, a late joiner's
snapshot carries the ranks, the cluster scores a node as its own placement does, and nodes of
index format 1 (the code before ranks, from the repository's history) mix with format 2 nodes:
read correctly where they can, refused where they cannot."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from redis.asyncio import Redis
from structlog.testing import capture_logs

from backend.engine.blocks import BlockEvicted, BlockManager, BlockStored
from backend.engine.placement import cacheable_blocks
from backend.engine.ranked_blocks import RankedBlockManager
from backend.engine.request import Request
from backend.engine.sampling_params import SamplingParams
from gateway.cluster.keys import ClusterKeys, NodeRecord, published_root
from gateway.cluster.publisher import BlockEventBuffer, BlockPublisher
from gateway.cluster.scoring import NodeLoad, Weights, place
from testkit.gateway_app import REDIS_URL
from tests.support.cluster_index import ROOT, SETTINGS, blocks, follower, sync
from tests.support.old_cluster import load_format_1

BS = 4
SEED = b"seed"  # the chain root of tests.support.cluster_index


class Node:
    """A node publishing its blocks: ranked (index format 2) or not (format 1)."""

    def __init__(self, redis: Redis, prefix: str, node_id: str, *, ranked: bool) -> None:
        self.buffer = BlockEventBuffer()
        self.ranked = ranked
        self.publisher = BlockPublisher(
            redis, ClusterKeys(prefix), node_id, self.buffer, self.record, SETTINGS, ranked=ranked
        )

    def record(self, epoch: int) -> NodeRecord:
        root = published_root(ROOT.hex(), ranked=self.ranked)
        return NodeRecord("http://node", root, epoch, 0, 0, 100, 100, BS)

    def pools(self, ranks: int = 2, blocks_per_rank: int = 8) -> RankedBlockManager:
        """The engine's pools, their events going to this node's buffer."""
        return RankedBlockManager(
            ranks, blocks_per_rank, blocks_per_rank, BS, SEED, self.buffer.push
        )


def seq(request_id: str, tokens: list[int]) -> Request:
    return Request(request_id, tokens, SamplingParams())


def serve(pool: Any, request: Request) -> None:
    """`request` prefilled on `pool` (a rank's pool or the node's), its full blocks cached,
    then finished."""
    pool.allocate(request)
    request.num_computed_tokens = request.num_tokens - 1
    pool.cache_full_blocks(request)
    pool.free(request)


@pytest.fixture
async def shared(redis_prefix: str) -> AsyncIterator[tuple[Redis, str]]:
    client = Redis.from_url(REDIS_URL)
    yield client, redis_prefix
    await client.aclose()


PROMPT = list(range(17))  # 4 full blocks of 4, then one token


async def test_blocks_stored_on_rank_1_are_indexed_as_rank_1(shared: tuple[Redis, str]) -> None:
    redis, prefix = shared
    node = Node(redis, prefix, "dp", ranked=True)
    await node.publisher.start()
    bm = node.pools()
    serve(bm.pools[1], seq("s", PROMPT))
    await node.publisher.tick()
    f = follower(redis, prefix)
    await sync(f)
    chain = bm.pools[1].block_hashes(seq("q", PROMPT))
    assert len(chain) == 4
    for h in chain:
        assert dict(f.index.holders(h)) == {"dp": 0b10}  # rank 1 alone
    assert f.index.prefix_blocks(chain, ["dp"]) == {"dp": 4}
    entries = await redis.xrange(ClusterKeys(prefix).stream("dp"))
    assert all(b"r" in fields and b"d" not in fields for _, fields in entries)


async def test_eviction_on_one_rank_removes_only_that_ranks_entry(
    shared: tuple[Redis, str],
) -> None:
    redis, prefix = shared
    node = Node(redis, prefix, "dp", ranked=True)
    await node.publisher.start()
    bm = node.pools(blocks_per_rank=2)
    head = list(range(4))
    serve(bm.pools[0], seq("one", head + [50]))
    serve(bm.pools[1], seq("two", head + [60]))
    await node.publisher.tick()
    f = follower(redis, prefix)
    await sync(f)
    (h,) = bm.pools[0].block_hashes(seq("q", head + [1]))
    assert dict(f.index.holders(h)) == {"dp": 0b11}
    bm.pools[0].allocate(seq("x", list(range(100, 108))))  # evicts rank 0's copy
    await node.publisher.tick()
    await sync(f)
    assert dict(f.index.holders(h)) == {"dp": 0b10}
    assert f.index.prefix_blocks([h], ["dp"]) == {"dp": 1}  # rank 1 still serves it
    bm.pools[1].allocate(seq("y", list(range(200, 208))))  # and now rank 1's
    await node.publisher.tick()
    await sync(f)
    assert not f.index.holders(h)
    assert f.index.num_blocks("dp") == 0


async def test_a_late_joiners_snapshot_carries_the_ranks(shared: tuple[Redis, str]) -> None:
    redis, prefix = shared
    node = Node(redis, prefix, "dp", ranked=True)
    await node.publisher.start()
    bm = node.pools(ranks=3)
    serve(bm.pools[0], seq("a", PROMPT))
    serve(bm.pools[2], seq("b", PROMPT[:9]))  # the first two blocks on rank 2 too
    serve(bm.pools[1], seq("c", list(range(500, 509))))
    await node.publisher.tick()
    early = follower(redis, prefix)
    await sync(early)
    await node.publisher._write_snapshot()
    bm.pools[0].allocate(seq("x", list(range(300, 332))))  # evicts rank 0's blocks
    await node.publisher.tick()
    late = follower(redis, prefix)
    await sync(late)
    await sync(early)
    snapshot = await redis.hgetall(ClusterKeys(prefix).snapshot("dp"))
    assert b"ranks" in snapshot
    chain = bm.block_hashes(seq("q", PROMPT))
    other = bm.block_hashes(seq("q", list(range(500, 509))))
    for f in (early, late):
        assert [dict(f.index.holders(h)) for h in chain] == [{"dp": 0b100}] * 2 + [{}] * 2
        assert [dict(f.index.holders(h)) for h in other] == [{"dp": 0b10}] * 2
        assert f.index.num_blocks("dp") == 4
    assert late.index.position("dp") == early.index.position("dp")
    # a fresh follower reading only the snapshot (nothing after it) sees the ranks as they were
    await node.publisher._write_snapshot()
    fresh = follower(redis, prefix)
    await fresh.poll()
    assert [dict(fresh.index.holders(h)) for h in chain[:2]] == [{"dp": 0b100}] * 2


async def test_the_cluster_scores_a_node_as_its_own_placement_does(
    shared: tuple[Redis, str],
) -> None:
    """The prefix the cluster's placer sees for a node (from Redis) is the node's own longest
    prefix on one rank, and that rank is the one the node places the prompt on; a prefix split
    over ranks counts only as its longest part on one rank."""
    redis, prefix = shared
    node = Node(redis, prefix, "dp", ranked=True)
    await node.publisher.start()
    bm = node.pools(blocks_per_rank=6)
    serve(bm.pools[0], seq("long", PROMPT))  # rank 0: the prompt's 4 blocks
    serve(bm.pools[1], seq("short", PROMPT[:9]))  # rank 1: its first 2
    serve(bm.pools[1], seq("other", list(range(900, 909))))
    passing = seq("x", list(range(300, 312)))
    bm.pools[0].allocate(passing)  # rank 0 evicts down to 3 blocks
    bm.pools[0].free(passing)  # (and has room again)
    await node.publisher.tick()
    f = follower(redis, prefix)
    await sync(f)
    prompts = [PROMPT, PROMPT[:9] + [7, 7, 7, 7, 7], list(range(900, 910)), list(range(50, 70))]
    for tokens in prompts:
        chain = bm.block_hashes(seq("q", tokens))
        own = bm.cached_prefix_blocks(chain)
        assert f.index.prefix_blocks(chain, ["dp"]) == {"dp": own}
        loads = {"me": NodeLoad(0, 0, 100), "dp": NodeLoad(0, 0, 100)}
        weights = Weights(forward_cost_tokens=0.0)
        ranked = f.index.ranked_nodes
        choice = place("me", chain, len(tokens), BS, loads, weights, f.index.holders, ranked=ranked)
        assert choice.cached_blocks == min(own, cacheable_blocks(len(tokens), BS))
        assert choice.node_id == ("dp" if own else "me")
        if own:
            rank = bm.place(seq("q", tokens))
            assert f.index.holders(chain[own - 1])["dp"] >> rank & 1, tokens
    # a prefix split over ranks: blocks 0-1 on rank 0, blocks 2-3 on rank 1 alone
    chain = [b.block_hash for b in blocks(4, start=1000)]
    split = [BlockStored(b.block_hash, b.parent_hash, b.token_ids, rank=0) for b in blocks(2, 1000)]
    split += [BlockStored(b.block_hash, b.parent_hash, b.token_ids, 1) for b in blocks(4, 1000)]
    split += [BlockEvicted(chain[0], rank=1)]
    for event in split:
        node.buffer.push(event)
    await node.publisher.tick()
    await sync(f)
    assert set(f.index.holders(chain[0])) == set(f.index.holders(chain[3])) == {"dp"}
    assert f.index.prefix_blocks(chain, ["dp"]) == {"dp": 2}  # not 4


async def test_a_format_1_node_is_read_as_one_pool(shared: tuple[Redis, str]) -> None:
    """The older code's publisher (one pool, no ranks) read by this follower: its blocks are
    rank 0's, and its format is refused nowhere."""
    old = load_format_1()
    redis, prefix = shared
    buffer = old.publisher.BlockEventBuffer()

    def record(epoch: int) -> Any:
        return old.keys.NodeRecord("http://old", ROOT.hex(), epoch, 0, 0, 100, 100, BS)

    publisher = old.publisher.BlockPublisher(
        redis, old.keys.ClusterKeys(prefix), "old", buffer, record, SETTINGS
    )
    await publisher.start()
    chain = blocks(3)
    for event in chain:
        buffer.push(event)
    await publisher.tick()
    await publisher._write_snapshot()
    buffer.push(BlockEvicted(chain[2].block_hash))
    await publisher.tick()
    f = follower(redis, prefix)
    await sync(f)
    assert [dict(f.index.holders(b.block_hash)) for b in chain] == [{"old": 1}] * 2 + [{}]
    assert f.index.prefix_blocks([b.block_hash for b in chain], ["old"]) == {"old": 2}
    assert [p.compatible for p in f.peers(float("-inf"))] == [True]


async def test_a_format_1_reader_reads_one_pool_nodes_and_refuses_ranked_ones(
    shared: tuple[Redis, str],
) -> None:
    """The older code's follower, beside a node of one pool (this code, format 1: read as
    before) and a node of ranks (format 2: another model cache to it, refused and logged,
    its stream never read)."""
    old = load_format_1()
    redis, prefix = shared
    single, ranked = (
        Node(redis, prefix, "one", ranked=False),
        Node(redis, prefix, "dp", ranked=True),
    )
    for node in (single, ranked):
        await node.publisher.start()
    serve(BlockManager(8, BS, SEED, single.buffer.push), seq("s", PROMPT))
    serve(ranked.pools().pools[1], seq("s", PROMPT))
    for node in (single, ranked):
        await node.publisher.tick()
    reader = old.follower.IndexFollower(
        redis,
        old.keys.ClusterKeys(prefix),
        ROOT.hex(),
        SETTINGS,
        old.index.PrefixIndex(),
        node_id="reader",
        block_size=BS,
    )
    with capture_logs() as logs:
        await reader.poll()
        await reader.read_streams(block_ms=1)
    chain = BlockManager(8, BS, SEED).block_hashes(seq("q", PROMPT))
    assert reader.index.prefix_blocks(chain, ["one", "dp"]) == {"one": 4, "dp": 0}
    assert set(reader.live(float("-inf"))) == {"one"}
    refused = [e for e in logs if e["event"] == "cluster_peer_incompatible"]
    assert [e["peer"] for e in refused] == ["dp"]
    assert not [e for e in logs if e["event"] in ("cluster_bad_entry", "cluster_gap")]
    # this code reads both, and says why it would refuse a format it does not know
    f = follower(redis, prefix)
    await sync(f)
    assert f.index.prefix_blocks(chain, ["one", "dp"]) == {"one": 4, "dp": 4}
    assert dict(f.index.holders(chain[0])) == {"one": 1, "dp": 0b10}
