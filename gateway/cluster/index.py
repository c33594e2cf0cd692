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
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from backend.engine.blocks import BlockEvicted, BlockStored
from gateway.cluster.events import AllBlocksCleared, IndexEvent

# block hash -> the nodes that hold it: a mapping node -> mask of its ranks holding it (the
# index), or a collection of nodes that count as holding it on every rank (pending marks, the
# node's own engine, which answers for its ranks itself)
HolderLookup = Callable[[bytes], Collection[str] | Mapping[str, int]]
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

    def holders(self, block: bytes) -> Mapping[str, int]:
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
        if state is not None:
            self._clear(node, state)

    def prefix_blocks(self, hashes: Sequence[bytes], nodes: Collection[str]) -> dict[str, int]:
        """For each of `nodes`, how many of `hashes` (a prompt's chain) one of its ranks holds
        from the first block on, without a hole."""
        return longest_prefixes(hashes, nodes, self.holders)

    def _add(self, node: str, state: _NodeState, h: bytes, rank: int) -> None:
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


_NONE: Mapping[str, int] = {}


def longest_prefixes(
    hashes: Sequence[bytes], nodes: Collection[str], *sources: HolderLookup
) -> dict[str, int]:
    """Per node, the length of the leading run of `hashes` that one of its ranks holds, by
    what the sources say (a source naming a node without ranks counts for all of them). One
    dict lookup per block and source; stops as soon as no node is still matching."""
    result = dict.fromkeys(nodes, 0)
    alive = dict.fromkeys(nodes, ALL_RANKS)  # node -> its ranks still matching
    for i, h in enumerate(hashes):
        held: dict[str, int] = {}
        for source in sources:
            found = source(h)
            if isinstance(found, Mapping):
                for node, mask in found.items():
                    held[node] = held.get(node, 0) | mask
            else:
                for node in found:
                    held[node] = ALL_RANKS
        for node, mask in list(alive.items()):
            mask &= held.get(node, 0)
            if mask:
                alive[node] = mask
            else:
                result[node] = i
                del alive[node]
        if not alive:
            return result
    for node in alive:
        result[node] = len(hashes)
    return result
