"""The in-memory prefix index: block hash -> the nodes that hold it, and on which of their
attention ranks (a mask: bit r for rank r; a node of one pool holds everything on rank 0).
Pure data, no I/O.

Fed only from Redis (`gateway.cluster.follower`): a node's snapshot, then its stream entries in
order. Each node's position is (epoch, seq of its last applied event). An entry that repeats
applied events is skipped (replays are idempotent); one that starts past the next expected seq,
or in a newer epoch without an `AllBlocksCleared` at seq 1, is a gap: the caller resyncs that
node from its snapshot. Dropping a node (its liveness expired) removes all its entries.

A node's cached prefix is the longest leading run of a prompt's blocks that one of its ranks
holds whole (`longest_prefixes`): a rank serves a sequence from its own pool alone, so a prefix
split over ranks is not usable as one.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field

from backend.engine.blocks import BlockEvicted, BlockStored
from gateway.cluster.events import AllBlocksCleared, IndexEvent

# block hash -> the nodes that hold it: a dict node -> mask of its ranks holding it (the index),
# or another collection of nodes that count as holding it on every rank (pending marks, the
# node's own engine, which answers for its ranks itself)
HolderLookup = Callable[[bytes], Collection[str] | dict[str, int]]
ALL_RANKS = -1  # a mask with every bit set


class Applied(enum.Enum):
    APPLIED = "applied"
    DUPLICATE = "duplicate"  # nothing new: already applied, or from an older epoch
    GAP = "gap"  # events are missing: resync the node from its snapshot


@dataclass(slots=True)
class _NodeState:
    epoch: int
    seq: int
    masks: dict[bytes, int] = field(default_factory=dict)  # hash -> the ranks holding it


class PrefixIndex:
    def __init__(self) -> None:
        self._holders: dict[bytes, dict[str, int]] = {}
        self._nodes: dict[str, _NodeState] = {}
        self._ranked: set[str] = set()  # nodes that held a block on a rank other than 0

    @property
    def nodes(self) -> list[str]:
        return list(self._nodes)

    def position(self, node: str) -> tuple[int, int] | None:
        """(epoch, seq) of the node's last applied event; None for a node not synced."""
        state = self._nodes.get(node)
        return None if state is None else (state.epoch, state.seq)

    def num_blocks(self, node: str) -> int:
        state = self._nodes.get(node)
        return 0 if state is None else len(state.masks)

    @property
    def ranked_nodes(self) -> Collection[str]:
        """The nodes that held a block on a rank other than 0 since they were (re)loaded."""
        return self._ranked

    def holders(self, block: bytes) -> dict[str, int]:
        """The nodes holding `block`, each with the mask of its ranks that hold it."""
        return self._holders.get(block, _NONE)

    def load_snapshot(
        self,
        node: str,
        epoch: int,
        seq: int,
        hashes: Iterable[bytes],
        masks: Iterable[int] | None = None,
    ) -> None:
        """Replace what the index knows of `node` by its snapshot taken at (epoch, seq): its
        cached `hashes` with, per hash, the mask of the ranks holding it (rank 0 without)."""
        self.drop(node)
        state = _NodeState(epoch, seq)
        self._nodes[node] = state
        if masks is None:
            for h in hashes:
                self._add(node, state, h, 0)
            return
        for h, mask in zip(hashes, masks, strict=True):
            for rank in range(mask.bit_length()):
                if mask >> rank & 1:
                    self._add(node, state, h, rank)

    def apply(self, node: str, epoch: int, seq: int, events: Sequence[IndexEvent]) -> Applied:
        """Apply one stream entry whose first event has number `seq` in `epoch`."""
        state = self._nodes.get(node)
        if state is None:
            return Applied.GAP
        if epoch < state.epoch:
            return Applied.DUPLICATE
        if epoch > state.epoch:
            if seq != 1 or not events or not isinstance(events[0], AllBlocksCleared):
                return Applied.GAP
            self._clear(node, state)
            state.epoch, state.seq = epoch, 0
        last = seq + len(events) - 1
        if last <= state.seq:
            return Applied.DUPLICATE
        if seq > state.seq + 1:
            return Applied.GAP
        for event in events[state.seq + 1 - seq :]:
            if isinstance(event, BlockStored):
                self._add(node, state, event.block_hash, event.rank)
            elif isinstance(event, BlockEvicted):
                self._remove(node, state, event.block_hash, event.rank)
            else:
                self._clear(node, state)
        state.seq = last
        return Applied.APPLIED

    def drop(self, node: str) -> None:
        """Forget `node` and every entry it held."""
        state = self._nodes.pop(node, None)
        self._ranked.discard(node)
        if state is not None:
            self._clear(node, state)

    def prefix_blocks(self, hashes: Sequence[bytes], nodes: Collection[str]) -> dict[str, int]:
        """For each of `nodes`, how many of `hashes` (a prompt's chain) one of its ranks holds
        from the first block on, without a hole."""
        return longest_prefixes(hashes, nodes, self.holders, ranked=self._ranked)

    def _add(self, node: str, state: _NodeState, h: bytes, rank: int) -> None:
        if rank:
            self._ranked.add(node)
        mask = state.masks.get(h, 0) | 1 << rank
        state.masks[h] = mask
        self._holders.setdefault(h, {})[node] = mask

    def _remove(self, node: str, state: _NodeState, h: bytes, rank: int) -> None:
        mask = state.masks.pop(h, 0) & ~(1 << rank)
        holders = self._holders.get(h)
        if mask:
            state.masks[h] = mask
            if holders is not None:
                holders[node] = mask
            return
        if holders is not None:
            holders.pop(node, None)
            if not holders:
                del self._holders[h]

    def _clear(self, node: str, state: _NodeState) -> None:
        for h in list(state.masks):
            holders = self._holders.get(h)
            if holders is not None:
                holders.pop(node, None)
                if not holders:
                    del self._holders[h]
        state.masks.clear()


_NONE: dict[str, int] = {}  # never written


def longest_prefixes(
    hashes: Sequence[bytes],
    nodes: Collection[str],
    *sources: HolderLookup,
    ranked: Collection[str] = (),
) -> dict[str, int]:
    """Per node, the length of the leading run of `hashes` that one of its ranks holds, by
    what the sources say (a source naming a node without ranks counts for all of them).
    `ranked`: the nodes that may hold blocks on several ranks; every other node's blocks are on
    one, so its run is the run of blocks it holds at all. One dict lookup per block and source
    (stopping as soon as no node is still matching), then per ranked node one per block of its
    run and source."""
    result = dict.fromkeys(nodes, 0)
    alive = set(nodes)
    for i, h in enumerate(hashes):
        holding: set[str] = set()
        for source in sources:
            holding.update(source(h))
        dropped = alive - holding
        for node in dropped:
            result[node] = i
        alive -= dropped
        if not alive:
            break
    else:
        for node in alive:
            result[node] = len(hashes)
    for node in ranked:
        if result.get(node):
            result[node] = _run_on_one_rank(hashes[: result[node]], node, sources)
    return result


def _run_on_one_rank(hashes: Sequence[bytes], node: str, sources: Sequence[HolderLookup]) -> int:
    """How many of `hashes` (each held by `node` on some rank) one of its ranks holds from the
    first on."""
    mask = ALL_RANKS
    for i, h in enumerate(hashes):
        held = 0
        for source in sources:
            found = source(h)
            if node in found:
                held |= found[node] if isinstance(found, dict) else ALL_RANKS
        mask &= held
        if not mask:
            return i
    return len(hashes)
