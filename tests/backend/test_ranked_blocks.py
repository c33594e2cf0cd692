"""One block pool per attention rank: placement by cached prefix against load, each sequence's
blocks in one pool, preemption within a pool, each pool's events carrying its rank.
No torch."""

from __future__ import annotations

from backend.engine.blocks import BlockEvent, BlockEvicted, BlockStored
from backend.engine.placement import PlacementWeights
from backend.engine.ranked_blocks import RankedBlockManager
from backend.engine.request import Request
from backend.engine.sampling_params import SamplingParams
from backend.engine.scheduler import Scheduler

SEED = b"ckpt-fingerprint"


def make_seq(request_id: str, tokens: list[int]) -> Request:
    return Request(request_id, tokens, SamplingParams())


def compute_all(bm: RankedBlockManager, seq: Request) -> None:
    seq.num_computed_tokens = seq.num_tokens - 1
    bm.cache_full_blocks(seq)


def test_ids_name_their_rank_and_the_pools_add_up() -> None:
    bm = RankedBlockManager(4, 6, 10, 4, SEED)
    assert bm.num_blocks == bm.num_free_blocks == 24
    seqs = [make_seq(f"s{i}", list(range(100 * i, 100 * i + 9))) for i in range(4)]
    ranks = []
    for seq in seqs:
        bm.allocate(seq)
        rank = bm.rank_of(seq)
        assert rank is not None
        ranks.append(rank)
        assert all(rank * 10 <= b < rank * 10 + 6 for b in seq.block_table)
    assert sorted(ranks) == [0, 1, 2, 3]  # equal cost (nothing cached): the least loaded
    assert bm.num_used_blocks == 12 and bm.num_free_blocks == 12
    for seq in seqs:
        bm.free(seq)
    assert bm.num_free_blocks == 24


def test_a_prompt_goes_to_the_rank_holding_its_prefix_unless_that_rank_is_loaded() -> None:
    weights = PlacementWeights(running_token_weight=1.0)  # a held token costs one computed
    bm = RankedBlockManager(2, 64, 64, 4, SEED, weights=weights)
    filler = make_seq("filler", list(range(1000, 1009)))
    bm.allocate(filler)  # rank 0 (3 blocks), so the next one goes to rank 1
    head = list(range(40))
    first = make_seq("first", head + [7, 8])
    bm.allocate(first)
    assert bm.rank_of(first) == 1
    compute_all(bm, first)
    bm.free(first)
    again = make_seq("again", head + [9])
    # rank 1: 1 uncached token; rank 0: 41 uncached + 12 held
    assert bm.place(again) == 1 and bm.num_cacheable_tokens(again) == 40
    assert bm.allocate(again) == 40 and bm.rank_of(again) == 1
    bm.free(again)
    bm.pools[1].allocate(make_seq("load", list(range(2000, 2060))))  # 60 tokens held
    late = make_seq("late", head + [10])
    assert bm.place(late) == 0  # rank 1: 1 + 60 > rank 0: 41 + 12


def test_a_full_pool_is_skipped() -> None:
    bm = RankedBlockManager(2, 4, 4, 4, SEED)
    big = make_seq("big", list(range(15)))
    bm.allocate(big)
    assert bm.rank_of(big) == 0 and bm.pools[0].num_free_blocks == 0
    other = make_seq("other", list(range(100, 110)))
    assert bm.can_allocate(other) and bm.place(other) == 1


def test_preemption_frees_only_the_pool_that_is_short() -> None:
    bm = RankedBlockManager(2, 3, 3, 4, SEED)
    scheduler = Scheduler(4, 64, bm, True, max_model_len=12, eos_token_ids=[])
    seqs = [make_seq(f"s{i}", list(range(20 * i, 20 * i + 7))) for i in range(4)]
    for seq in seqs:
        scheduler.add(seq)
    out = scheduler.schedule()
    assert len(out.scheduled) == 2  # one 2-block sequence per 3-block pool
    placed = {seq.request_id: bm.rank_of(seq) for seq in scheduler.running}
    assert sorted(placed.values()) == [0, 1]
    assert all(bm.shares_pool(s, s) for s in scheduler.running)
    a, b = scheduler.running
    assert not bm.shares_pool(a, b)


def test_each_pools_events_carry_its_rank() -> None:
    events: list[BlockEvent] = []
    bm = RankedBlockManager(2, 2, 2, 4, SEED, events.append)
    head = list(range(4))
    one, two = make_seq("one", head + [50]), make_seq("two", head + [60])
    bm.pools[0].allocate(one)
    bm.pools[1].allocate(two)
    compute_all(bm, one)
    compute_all(bm, two)  # the same block on a second rank: stored there too
    first, second = events
    assert isinstance(first, BlockStored) and isinstance(second, BlockStored)
    assert (first.rank, second.rank) == (0, 1)
    assert first.block_hash == second.block_hash
    bm.free(one)
    bm.free(two)
    bm.pools[0].allocate(make_seq("x", list(range(100, 108))))  # evicts rank 0's copy only
    assert events[2:] == [BlockEvicted(first.block_hash, rank=0)]
    bm.pools[1].allocate(make_seq("y", list(range(200, 208))))  # then rank 1's
    assert events[3:] == [BlockEvicted(first.block_hash, rank=1)]
