import subprocess
import sys

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from backend.engine.block_hash import block_hash, chain_hashes, root_hash
from backend.engine.blocks import BlockEvent, BlockEvicted, BlockManager, BlockStored
from backend.engine.request import Request
from backend.engine.sampling_params import SamplingParams

SEED = b"ckpt-fingerprint"


def make_seq(request_id: str, tokens: list[int]) -> Request:
    return Request(request_id, tokens, SamplingParams())


def compute_all(bm: BlockManager, seq: Request) -> None:
    """What a step does to seq: all but its last token now have KV."""
    seq.num_computed_tokens = seq.num_tokens - 1
    bm.cache_full_blocks(seq)


def test_allocate_and_free_count_blocks() -> None:
    bm = BlockManager(8, 4, SEED)
    seq = make_seq("a", list(range(10)))
    assert bm.can_allocate(seq)
    assert bm.allocate(seq) == 0
    assert len(seq.block_table) == 3
    assert (bm.num_used_blocks, bm.num_free_blocks) == (3, 5)
    assert all(bm.ref_count(b) == 1 for b in seq.block_table)
    bm.free(seq)
    assert (bm.num_used_blocks, bm.num_free_blocks) == (0, 8)
    assert seq.block_table == [] and seq.num_computed_tokens == 0


def test_double_free_raises() -> None:
    bm = BlockManager(4, 4, SEED)
    seq = make_seq("a", [1, 2, 3])
    bm.allocate(seq)
    table = list(seq.block_table)
    bm.free(seq)
    with pytest.raises(ValueError, match="holds no blocks"):
        bm.free(seq)
    seq.block_table = table
    with pytest.raises(ValueError, match="double free"):
        bm.free(seq)
    assert bm.num_free_blocks == 4


def test_allocate_refuses_when_pool_is_short() -> None:
    bm = BlockManager(2, 4, SEED)
    seq = make_seq("a", list(range(9)))
    assert not bm.can_allocate(seq)
    with pytest.raises(RuntimeError):
        bm.allocate(seq)
    assert bm.num_free_blocks == 2


def test_prefix_reuse_shares_computed_full_blocks() -> None:
    bm = BlockManager(16, 4, SEED)
    first = make_seq("a", list(range(10)))
    bm.allocate(first)
    # nothing is registered until computed
    assert bm.num_cached_blocks == 0
    compute_all(bm, first)
    assert bm.num_cached_blocks == 2
    second = make_seq("b", [*range(8), 99, 98, 97])
    assert bm.allocate(second) == 8
    assert second.num_computed_tokens == 8
    assert second.block_table[:2] == first.block_table[:2]
    assert second.block_table[2] != first.block_table[2]
    assert [bm.ref_count(b) for b in second.block_table] == [2, 2, 1]
    bm.free(first)
    assert [bm.ref_count(b) for b in second.block_table] == [1, 1, 1]


def test_last_prompt_token_is_always_computed() -> None:
    bm = BlockManager(16, 4, SEED)
    first = make_seq("a", list(range(9)))
    bm.allocate(first)
    compute_all(bm, first)
    assert bm.num_cached_blocks == 2
    exact = make_seq("b", list(range(8)))  # two full blocks, both cached
    assert bm.num_cacheable_tokens(exact) == 4
    assert bm.allocate(exact) == 4
    assert exact.num_uncomputed_tokens == 4


def test_freed_cached_blocks_are_reused_after_free() -> None:
    bm = BlockManager(4, 4, SEED)
    first = make_seq("a", list(range(9)))
    bm.allocate(first)
    compute_all(bm, first)
    cached = first.block_table[:2]
    bm.free(first)
    assert bm.num_free_blocks == 4
    again = make_seq("b", list(range(9)))
    assert bm.allocate(again) == 8
    assert again.block_table[:2] == cached


def test_lru_evicts_least_recently_freed_and_tails_first() -> None:
    events: list[BlockEvent] = []
    bm = BlockManager(6, 2, SEED, on_event=events.append)
    old = make_seq("old", [1, 2, 3, 4, 5])  # 3 blocks, 2 full
    new = make_seq("new", [7, 8, 9, 10, 11])
    for seq in (old, new):
        bm.allocate(seq)
        compute_all(bm, seq)
    old_full, new_full = old.block_table[:2], new.block_table[:2]
    stored = [e.block_hash for e in events if isinstance(e, BlockStored)]
    assert stored == old.block_hashes + new.block_hashes
    bm.free(old)
    bm.free(new)
    # tails first within a sequence; older sequence first overall
    assert bm.eviction_order() == [old_full[1], old_full[0], new_full[1], new_full[0]]
    events.clear()
    taker = make_seq("t", list(range(100, 109)))  # 5 blocks: 2 empty + 3 evicted
    bm.allocate(taker)
    assert events == [
        BlockEvicted(old.block_hashes[1]),
        BlockEvicted(old.block_hashes[0]),
        BlockEvicted(new.block_hashes[1]),
    ]
    assert bm.eviction_order() == [new_full[0]]
    assert bm.num_cached_blocks == 1
    # what the router asks: registered content, free or not, until it is evicted
    assert bm.cached_prefix_blocks(new.block_hashes) == 1
    assert bm.cached_prefix_blocks(old.block_hashes) == 0
    assert bm.cached_prefix_blocks([]) == 0
    assert bm.cached_prefix_blocks([new.block_hashes[0], old.block_hashes[0]]) == 1


def test_reuse_moves_a_block_out_of_the_lru() -> None:
    bm = BlockManager(8, 2, SEED)
    seq = make_seq("a", [1, 2, 3, 4, 5])
    bm.allocate(seq)
    compute_all(bm, seq)
    bm.free(seq)
    order = bm.eviction_order()
    other = make_seq("b", [1, 2, 9])
    assert bm.allocate(other) == 2
    reused = other.block_table[0]
    assert reused == order[-1]  # the prefix block was freed last
    assert reused not in bm.eviction_order()
    bm.free(other)
    assert bm.eviction_order() == [*order[:-1], reused]


def test_append_slot_grows_by_blocks_with_lookahead() -> None:
    bm = BlockManager(4, 4, SEED)
    seq = make_seq("a", [1, 2, 3, 4])
    bm.allocate(seq)
    assert len(seq.block_table) == 1
    assert bm.can_append(seq)
    bm.append_slot(seq)
    assert len(seq.block_table) == 1
    seq.token_ids.append(5)
    bm.append_slot(seq, num_lookahead=4)  # positions up to 8 -> 3 blocks
    assert len(seq.block_table) == 3
    assert not bm.can_append(seq, num_lookahead=12)
    with pytest.raises(RuntimeError):
        bm.append_slot(seq, num_lookahead=12)


def test_duplicate_content_is_registered_once() -> None:
    events: list[BlockEvent] = []
    bm = BlockManager(8, 2, SEED, on_event=events.append)
    a, b = make_seq("a", [1, 2, 3]), make_seq("b", [1, 2, 3])
    bm.allocate(a)
    bm.allocate(b)  # neither computed yet: no sharing
    compute_all(bm, a)
    compute_all(bm, b)
    assert events == [BlockStored(a.block_hashes[0], root_hash(SEED, 2), (1, 2))]
    assert bm.hash_of(b.block_table[0]) is None
    a_block, b_block = a.block_table[0], b.block_table[0]
    bm.free(a)
    bm.free(b)
    assert a_block in bm.eviction_order()
    assert b_block not in bm.eviction_order()


def test_decode_registers_a_block_once_full_and_computed() -> None:
    bm = BlockManager(8, 2, SEED)
    seq = make_seq("a", [1, 2, 3])
    bm.allocate(seq)
    compute_all(bm, seq)
    assert bm.num_cached_blocks == 1
    seq.token_ids.append(4)  # sampled, not computed: block 1 is full but not registered
    bm.append_slot(seq)
    bm.cache_full_blocks(seq)
    assert bm.num_cached_blocks == 1
    seq.num_computed_tokens = 4
    bm.cache_full_blocks(seq)
    assert bm.num_cached_blocks == 2
    assert bm.hash_of(seq.block_table[1]) == chain_hashes(SEED, [1, 2, 3, 4], 2)[1]


def test_hash_chain_depends_on_seed_block_size_and_prefix() -> None:
    tokens = list(range(16))
    base = chain_hashes(SEED, tokens, 4)
    assert len(base) == 4 and len(set(base)) == 4
    assert chain_hashes(b"other", tokens, 4)[0] != base[0]
    assert root_hash(SEED, 4) != root_hash(SEED, 8)
    changed = chain_hashes(SEED, [99, *tokens[1:]], 4)
    assert all(x != y for x, y in zip(changed, base, strict=True))
    assert chain_hashes(SEED, tokens[:15], 4) == base[:3]


def test_hashes_identical_across_processes() -> None:
    tokens = list(range(1000, 1100))
    code = (
        "from backend.engine.block_hash import chain_hashes;"
        f"print(','.join(h.hex() for h in chain_hashes({SEED!r}, {tokens!r}, 16)))"
    )
    outputs = set()
    for hash_seed in ("1", "2"):
        result = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={"PYTHONHASHSEED": hash_seed, "PYTHONPATH": "."},
        )
        outputs.add(result.stdout.strip())
    assert outputs == {",".join(h.hex() for h in chain_hashes(SEED, tokens, 16))}


def test_importing_block_manager_does_not_import_torch() -> None:
    code = (
        "import sys, backend.engine.blocks, backend.engine.scheduler; print('torch' in sys.modules)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "False"


class PoolMachine(RuleBasedStateMachine):
    """Random allocate / compute / decode / free sequences against a model of the pool.

    The model records, for each block position once computed, the tokens its KV depends on (the
    whole prefix up to it); every reused block must match the sequence that reuses it.
    """

    @initialize(
        num_blocks=st.integers(1, 12), block_size=st.integers(1, 4), lookahead=st.integers(0, 2)
    )
    def setup(self, num_blocks: int, block_size: int, lookahead: int) -> None:
        self.events: list[BlockEvent] = []
        self.bm = BlockManager(num_blocks, block_size, SEED, on_event=self.events.append)
        self.lookahead = lookahead
        self.live: list[Request] = []
        self.known: list[list[int]] = []
        self.content: dict[int, dict[int, tuple[int, ...]]] = {}
        self.next_id = 0

    @rule(tokens=st.lists(st.integers(0, 2), min_size=1, max_size=10))
    def allocate(self, tokens: list[int]) -> None:
        self._allocate(tokens)

    @precondition(lambda self: self.known)
    @rule(
        index=st.integers(0, 100),
        cut=st.integers(1, 12),
        tail=st.lists(st.integers(0, 2), max_size=3),
    )
    def allocate_shared_prefix(self, index: int, cut: int, tail: list[int]) -> None:
        tokens = self.known[index % len(self.known)]
        self._allocate(tokens[:cut] + tail)

    def _allocate(self, tokens: list[int]) -> None:
        seq = make_seq(str(self.next_id), tokens)
        self.next_id += 1
        if not self.bm.can_allocate(seq):
            with pytest.raises(RuntimeError):
                self.bm.allocate(seq)
            return
        cached = self.bm.allocate(seq)
        assert cached <= seq.num_tokens - 1 and cached % self.bm.block_size == 0
        for pos in range(cached):
            block = seq.block_table[pos // self.bm.block_size]
            assert self.content[block][pos % self.bm.block_size] == tuple(seq.token_ids[: pos + 1])
        self.live.append(seq)
        self.known.append(seq.token_ids)

    @precondition(lambda self: self.live)
    @rule(index=st.integers(0, 100), count=st.integers(1, 6))
    def compute(self, index: int, count: int) -> None:
        seq = self.live[index % len(self.live)]
        end = min(seq.num_tokens - 1, seq.num_computed_tokens + count)
        for pos in range(seq.num_computed_tokens, end):
            block = seq.block_table[pos // self.bm.block_size]
            # a position's KV depends on every token up to it
            prefix = tuple(seq.token_ids[: pos + 1])
            self.content.setdefault(block, {})[pos % self.bm.block_size] = prefix
        seq.num_computed_tokens = max(seq.num_computed_tokens, end)
        self.bm.cache_full_blocks(seq)

    @precondition(lambda self: self.live)
    @rule(index=st.integers(0, 100), token=st.integers(0, 2))
    def decode(self, index: int, token: int) -> None:
        seq = self.live[index % len(self.live)]
        if seq.num_computed_tokens < seq.num_tokens - 1:
            return
        seq.token_ids.append(token)
        if self.bm.can_append(seq, self.lookahead):
            self.bm.append_slot(seq, self.lookahead)
        else:
            seq.token_ids.pop()

    @precondition(lambda self: self.live)
    @rule(index=st.integers(0, 100))
    def free(self, index: int) -> None:
        seq = self.live.pop(index % len(self.live))
        self.bm.free(seq)
        with pytest.raises(ValueError):
            self.bm.free(seq)

    @invariant()
    def pool_is_consistent(self) -> None:
        bm = self.bm
        assert bm.num_free_blocks + bm.num_used_blocks == bm.num_blocks
        holders = [b for seq in self.live for b in seq.block_table]
        for block in range(bm.num_blocks):
            assert bm.ref_count(block) == holders.count(block) >= 0
        assert bm.num_used_blocks == len(set(holders))
        assert all(bm.ref_count(b) == 0 for b in bm.eviction_order())
        # replaying the events gives exactly the registered hashes
        cached: set[bytes] = set()
        for event in self.events:
            if isinstance(event, BlockStored):
                assert event.block_hash not in cached
                # each event carries what recomputes its hash
                assert block_hash(event.parent_hash, event.token_ids) == event.block_hash
                cached.add(event.block_hash)
            else:
                cached.remove(event.block_hash)
        registered = [bm.hash_of(b) for b in range(bm.num_blocks)]
        assert cached == {h for h in registered if h is not None}
        assert len(cached) == bm.num_cached_blocks
        for seq in self.live:
            assert len(seq.block_table) * bm.block_size >= seq.num_tokens


PoolMachine.TestCase.settings = settings(
    max_examples=100, stateful_step_count=30, deadline=None, database=None
)
TestPool = PoolMachine.TestCase
