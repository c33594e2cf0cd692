"""One latent-cache pool per attention rank (data-parallel attention), behind the block
manager's interface. No torch.

Rank r's pool is a `BlockManager` of `blocks_per_rank` blocks numbered
[r x stride, r x stride + blocks_per_rank): a block id names its rank (id // stride), and so
does a sequence's block table, which every rank reads from the step's plan. A sequence lives
in one pool for its whole life; a new one (or one preempted, on readmission) goes to the rank
where `backend.engine.placement.placement_cost` is lowest: its uncached prompt tokens there
(the longest cached prefix in that pool) plus that pool's load (`running_token_weight` x tokens
held), among the ranks with room for it; ties go to the lowest rank. Preemption frees only
sequences of the same pool (`shares_pool`).

The node's prefix-cache events are the pools' own, each carrying its rank: a block two pools
hold is stored twice (rank by rank) and evicted rank by rank, so the cluster's index knows which
rank holds which block, and scores a node by the longest cached prefix on any one rank (as
`place` and `cached_prefix_blocks` do here): a prefix split over ranks is not usable as one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from backend.engine.blocks import BlockEvent, BlockManager
from backend.engine.placement import PlacementWeights, placement_cost
from backend.engine.request import Request


class RankedBlockManager:
    """`ranks` pools of `blocks_per_rank` blocks; rank r's ids start at r x `stride`."""

    def __init__(
        self,
        ranks: int,
        blocks_per_rank: int,
        stride: int,
        block_size: int,
        hash_seed: bytes,
        on_event: Callable[[BlockEvent], None] | None = None,
        weights: PlacementWeights | None = None,
    ) -> None:
        if ranks < 1 or not 0 < blocks_per_rank <= stride:
            raise ValueError(
                f"need ranks >= 1 and 0 < blocks_per_rank <= stride, got {ranks}, "
                f"{blocks_per_rank}, {stride}"
            )
        self.stride = stride
        self.block_size = block_size
        self.blocks_per_rank = blocks_per_rank
        self.num_blocks = ranks * blocks_per_rank
        self.weights = weights or PlacementWeights()
        self._on_event = on_event
        self.pools = [
            BlockManager(
                blocks_per_rank, block_size, hash_seed, self._relay(rank), first_block=rank * stride
            )
            for rank in range(ranks)
        ]

    @property
    def num_free_blocks(self) -> int:
        return sum(pool.num_free_blocks for pool in self.pools)

    @property
    def num_used_blocks(self) -> int:
        return sum(pool.num_used_blocks for pool in self.pools)

    @property
    def num_cached_blocks(self) -> int:
        return sum(pool.num_cached_blocks for pool in self.pools)

    def rank_of_block(self, block_id: int) -> int:
        return block_id // self.stride

    def rank_of(self, seq: Request) -> int | None:
        """The rank whose pool holds seq's blocks; None while it holds none."""
        return self.rank_of_block(seq.block_table[0]) if seq.block_table else None

    def ref_count(self, block_id: int) -> int:
        return self.pools[self.rank_of_block(block_id)].ref_count(block_id)

    def hash_of(self, block_id: int) -> bytes | None:
        return self.pools[self.rank_of_block(block_id)].hash_of(block_id)

    def cached_prefix_blocks(self, hashes: Sequence[bytes]) -> int:
        """The longest cached run of `hashes` in any pool (what routing to this node gains;
        thread-safe as `BlockManager.cached_prefix_blocks` is)."""
        return max(pool.cached_prefix_blocks(hashes) for pool in self.pools)

    def eviction_order(self) -> list[int]:
        return [block for pool in self.pools for block in pool.eviction_order()]

    def num_blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def block_hashes(self, seq: Request) -> list[bytes]:
        return self.pools[0].block_hashes(seq)  # every pool chains from the same root

    def shares_pool(self, seq: Request, other: Request) -> bool:
        return self.rank_of(seq) == self.rank_of(other)

    def place(self, seq: Request) -> int:
        """The rank a sequence without blocks goes to (see the module's docstring)."""
        best: tuple[float, int] | None = None
        for rank, pool in enumerate(self.pools):
            if not pool.can_allocate(seq):
                continue
            uncached = seq.num_tokens - pool.num_cacheable_tokens(seq)
            running = pool.num_used_blocks * self.block_size
            cost = placement_cost(uncached, 0, running, self.weights, forwarded=False)
            if best is None or (cost, rank) < best:
                best = (cost, rank)
        if best is None:  # no pool has room: the least loaded one (the sequence waits)
            return min(range(len(self.pools)), key=lambda r: self.pools[r].num_used_blocks)
        return best[1]

    def num_cacheable_tokens(self, seq: Request) -> int:
        return self._pool(seq).num_cacheable_tokens(seq)

    def can_allocate(self, seq: Request) -> bool:
        return self._pool(seq).can_allocate(seq)

    def allocate(self, seq: Request) -> int:
        if seq.block_table:
            raise ValueError(f"{seq.request_id} already holds blocks")
        return self.pools[self.place(seq)].allocate(seq)

    def can_append(self, seq: Request, num_lookahead: int = 0) -> bool:
        return self._pool(seq).can_append(seq, num_lookahead)

    def append_slot(self, seq: Request, num_lookahead: int = 0) -> None:
        self._pool(seq).append_slot(seq, num_lookahead)

    def release_tail(self, seq: Request) -> None:
        self._pool(seq).release_tail(seq)

    def cache_full_blocks(self, seq: Request) -> None:
        if seq.block_table:
            self._pool(seq).cache_full_blocks(seq)

    def free(self, seq: Request) -> None:
        self._pool(seq).free(seq)

    def _pool(self, seq: Request) -> BlockManager:
        rank = self.rank_of(seq)
        return self.pools[self.place(seq) if rank is None else rank]

    def _relay(self, rank: int) -> Callable[[BlockEvent], None]:
        """Rank `rank`'s events, passed on with its rank."""

        def relay(event: BlockEvent) -> None:
            if self._on_event is not None:
                self._on_event(replace(event, rank=rank))

        return relay
