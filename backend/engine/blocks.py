"""KV block pool: allocation, ref counts, prefix caching with LRU eviction. No torch.

A block holds `block_size` consecutive token positions of one sequence. A full block whose tokens
are all computed is registered under its chained hash (`backend.engine.block_hash`); a later
sequence whose prompt starts with the same blocks shares them (ref count > 1) instead of computing
them.
A freed block keeps its content while it sits in the free pool: blocks that hold cached content
are evicted least recently freed first, and only once no empty block is left.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import takewhile
from typing import Protocol

from backend.engine.block_hash import extend_chain, root_hash
from backend.engine.request import Request


@dataclass(frozen=True, slots=True)
class BlockStored:
    """A block's content became reusable under `block_hash` = block_hash(parent_hash,
    token_ids) (`backend.engine.block_hash`), so a listener can check or recompute it; `rank`:
    the attention rank whose pool holds it (0 with one pool)."""

    block_hash: bytes
    parent_hash: bytes
    token_ids: tuple[int, ...]
    rank: int = 0


@dataclass(frozen=True, slots=True)
class BlockEvicted:
    """The content cached under `block_hash` is gone from `rank`'s pool."""

    block_hash: bytes
    rank: int = 0


BlockEvent = BlockStored | BlockEvicted


class BlockPool(Protocol):
    """What the scheduler and the engine ask of the block pool: one `BlockManager`, or one
    per attention rank (`backend.engine.ranked_blocks.RankedBlockManager`)."""

    num_blocks: int
    block_size: int

    @property
    def num_free_blocks(self) -> int: ...
    def cached_prefix_blocks(self, hashes: Sequence[bytes]) -> int: ...
    def num_cacheable_tokens(self, seq: Request) -> int: ...
    def can_allocate(self, seq: Request) -> bool: ...
    def allocate(self, seq: Request) -> int: ...
    def can_append(self, seq: Request, num_lookahead: int = 0) -> bool: ...
    def append_slot(self, seq: Request, num_lookahead: int = 0) -> None: ...
    def release_tail(self, seq: Request) -> None: ...
    def cache_full_blocks(self, seq: Request) -> None: ...
    def free(self, seq: Request) -> None: ...
    def shares_pool(self, seq: Request, other: Request) -> bool: ...


class BlockManager:
    """A fixed pool of `num_blocks` blocks, ids first_block..first_block+num_blocks-1.

    `hash_seed` (a checkpoint fingerprint) seeds the hash chain. `on_event` hears every
    registration and eviction of cached content, in order (for the Redis prefix index).
    `first_block` numbers a pool that is one of several (`backend.engine.ranked_blocks`).
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        hash_seed: bytes,
        on_event: Callable[[BlockEvent], None] | None = None,
        *,
        first_block: int = 0,
    ) -> None:
        if num_blocks <= 0 or block_size <= 0 or first_block < 0:
            raise ValueError(
                f"need num_blocks > 0 and block_size > 0, got {num_blocks}, {block_size}"
            )
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._root = root_hash(hash_seed, block_size)
        self._on_event = on_event
        self._ref_counts = [0] * (first_block + num_blocks)
        self._hashes: list[bytes | None] = [None] * (first_block + num_blocks)
        self._block_of_hash: dict[bytes, int] = {}
        self._empty: deque[int] = deque(range(first_block, first_block + num_blocks))
        # free blocks holding cached content; first = least recently freed = next to evict
        self._cached_free: OrderedDict[int, None] = OrderedDict()
        # per request id: how many leading blocks `cache_full_blocks` has already considered
        self._num_committed: dict[str, int] = {}

    @property
    def num_free_blocks(self) -> int:
        return len(self._empty) + len(self._cached_free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    @property
    def num_cached_blocks(self) -> int:
        """Blocks whose content is registered for reuse, in use or free."""
        return len(self._block_of_hash)

    def ref_count(self, block_id: int) -> int:
        return self._ref_counts[block_id]

    def hash_of(self, block_id: int) -> bytes | None:
        return self._hashes[block_id]

    def cached_prefix_blocks(self, hashes: Sequence[bytes]) -> int:
        """How many of `hashes` (a prompt's block chain) are registered, from the first on
        without a hole (in use or free, not yet evicted). Dict membership tests only, no write,
        so another thread may ask while the engine runs: the answer is as of a moment ago (a
        free block may be evicted before the prompt is scheduled)."""
        return len(list(takewhile(self._block_of_hash.__contains__, hashes)))

    def eviction_order(self) -> list[int]:
        """Free blocks holding cached content, next to be evicted first."""
        return list(self._cached_free)

    def shares_pool(self, seq: Request, other: Request) -> bool:
        """Whether freeing `other`'s blocks can make room for `seq` (one pool: always)."""
        return True

    def num_blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def block_hashes(self, seq: Request) -> list[bytes]:
        """The hash chain of seq's full blocks (cached on the sequence)."""
        extend_chain(seq.block_hashes, self._root, seq.token_ids, self.block_size)
        return seq.block_hashes

    def num_cacheable_tokens(self, seq: Request) -> int:
        """Tokens of seq that `allocate` would take from the prefix cache right now."""
        return len(self._match_prefix(seq)) * self.block_size

    def can_allocate(self, seq: Request) -> bool:
        matched = self._match_prefix(seq)
        revived = sum(1 for b in matched if self._ref_counts[b] == 0)
        num_new = self.num_blocks_for(seq.num_tokens) - len(matched)
        return num_new + revived <= self.num_free_blocks

    def allocate(self, seq: Request) -> int:
        """Give seq blocks for all its tokens, sharing cached full blocks of its prefix.

        The last token is never taken from the cache, so at least one token is computed. Sets
        `block_table`, `num_cached_tokens` and `num_computed_tokens`; returns the cached count.
        """
        if seq.block_table:
            raise ValueError(f"{seq.request_id} already holds blocks")
        if not self.can_allocate(seq):
            raise RuntimeError(f"not enough free blocks for {seq.request_id}")
        matched = self._match_prefix(seq)
        for b in matched:  # before taking new blocks, so none of these is evicted
            if self._ref_counts[b] == 0:
                del self._cached_free[b]
            self._ref_counts[b] += 1
        num_new = self.num_blocks_for(seq.num_tokens) - len(matched)
        seq.block_table = matched + [self._take_free() for _ in range(num_new)]
        seq.num_cached_tokens = len(matched) * self.block_size
        seq.num_computed_tokens = seq.num_cached_tokens
        self._num_committed[seq.request_id] = len(matched)
        return seq.num_cached_tokens

    def can_append(self, seq: Request, num_lookahead: int = 0) -> bool:
        """Whether seq's blocks can grow to hold its tokens plus `num_lookahead` more."""
        return self._num_missing(seq, num_lookahead) <= self.num_free_blocks

    def append_slot(self, seq: Request, num_lookahead: int = 0) -> None:
        """Grow seq's block table to hold its tokens plus `num_lookahead` draft positions."""
        num_missing = self._num_missing(seq, num_lookahead)
        if num_missing > self.num_free_blocks:
            raise RuntimeError(f"not enough free blocks for {seq.request_id}")
        seq.block_table.extend(self._take_free() for _ in range(num_missing))

    def release_tail(self, seq: Request) -> None:
        """Free seq's blocks past those its tokens need (slots of drafts that were rejected or
        not used); they were never registered, since they hold no computed token."""
        keep = self.num_blocks_for(seq.num_tokens)
        while len(seq.block_table) > keep:
            block_id = seq.block_table.pop()
            self._ref_counts[block_id] -= 1
            if self._ref_counts[block_id] == 0:
                if self._hashes[block_id] is None:
                    self._empty.append(block_id)
                else:
                    self._cached_free[block_id] = None

    def cache_full_blocks(self, seq: Request) -> None:
        """Register seq's full blocks whose tokens are all computed; call after each step.

        A block whose content is already registered under another block id (two sequences
        computed the same prefix at once) stays unregistered and is simply freed later.
        """
        start = self._num_committed.get(seq.request_id, 0)
        end = min(seq.num_computed_tokens // self.block_size, len(seq.block_table))
        if end <= start:
            return
        hashes = self.block_hashes(seq)
        size = self.block_size
        for i in range(start, end):
            block_id, h = seq.block_table[i], hashes[i]
            if self._hashes[block_id] is None and h not in self._block_of_hash:
                self._hashes[block_id] = h
                self._block_of_hash[h] = block_id
                if self._on_event is not None:
                    parent = hashes[i - 1] if i else self._root
                    tokens = tuple(seq.token_ids[i * size : (i + 1) * size])
                    self._on_event(BlockStored(h, parent, tokens))
        self._num_committed[seq.request_id] = end

    def free(self, seq: Request) -> None:
        """Release seq's blocks, last block first so a prefix outlives its tails in the cache;
        nothing of seq counts as computed any more. Raises on a sequence holding no blocks or
        on a block that is already free."""
        if not seq.block_table:
            raise ValueError(f"{seq.request_id} holds no blocks")
        free_ids = [b for b in seq.block_table if self._ref_counts[b] == 0]
        if free_ids:
            raise ValueError(f"double free of blocks {free_ids} by {seq.request_id}")
        for b in reversed(seq.block_table):
            self._ref_counts[b] -= 1
            if self._ref_counts[b] == 0:
                if self._hashes[b] is None:
                    self._empty.append(b)
                else:
                    self._cached_free[b] = None
        seq.block_table = []
        seq.num_computed_tokens = 0
        self._num_committed.pop(seq.request_id, None)

    def _match_prefix(self, seq: Request) -> list[int]:
        """Cached block ids for the longest run of seq's leading full blocks, never covering
        its last token."""
        limit = (seq.num_tokens - 1) // self.block_size
        matched: list[int] = []
        for h in self.block_hashes(seq)[:limit]:
            block_id = self._block_of_hash.get(h)
            if block_id is None:
                break
            matched.append(block_id)
        return matched

    def _num_missing(self, seq: Request, num_lookahead: int) -> int:
        needed = self.num_blocks_for(seq.num_tokens + num_lookahead)
        return max(0, needed - len(seq.block_table))

    def _take_free(self) -> int:
        """Pop a free block (an empty one if any, else evict the least recently freed)."""
        if self._empty:
            block_id = self._empty.popleft()
        else:
            block_id, _ = self._cached_free.popitem(last=False)
            h = self._hashes[block_id]
            assert h is not None
            self._hashes[block_id] = None
            del self._block_of_hash[h]
            self._emit(BlockEvicted(h))
        self._ref_counts[block_id] = 1
        return block_id

    def _emit(self, event: BlockEvent) -> None:
        if self._on_event is not None:
            self._on_event(event)
