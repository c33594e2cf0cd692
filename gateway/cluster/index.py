"""The in-memory prefix index: block hash -> the nodes that hold it. Pure data, no I/O.

Fed only from Redis (`gateway.cluster.follower`): a node's snapshot, then its stream entries in
order. Each node's position is (epoch, seq of its last applied event). An entry that repeats
applied events is skipped (replays are idempotent); one that starts past the next expected seq,
or in a newer epoch without an `AllBlocksCleared` at seq 1, is a gap: the caller resyncs that
node from its snapshot. Dropping a node (its liveness expired) removes all its entries.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field

from backend.engine.blocks import BlockEvicted, BlockStored
from gateway.cluster.events import AllBlocksCleared, IndexEvent

# block hash -> the nodes that hold it (the index, or pending marks)
HolderLookup = Callable[[bytes], Collection[str]]


class Applied(enum.Enum):
    APPLIED = "applied"
    DUPLICATE = "duplicate"  # nothing new: already applied, or from an older epoch
    GAP = "gap"  # events are missing: resync the node from its snapshot


@dataclass(slots=True)
class _NodeState:
    epoch: int
    seq: int
    hashes: set[bytes] = field(default_factory=set)


class PrefixIndex:
    def __init__(self) -> None:
        self._holders: dict[bytes, set[str]] = {}
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
        return 0 if state is None else len(state.hashes)

    def holders(self, block: bytes) -> Collection[str]:
        return self._holders.get(block, ())

    def load_snapshot(self, node: str, epoch: int, seq: int, hashes: Iterable[bytes]) -> None:
        """Replace what the index knows of `node` by its snapshot taken at (epoch, seq)."""
        self.drop(node)
        state = _NodeState(epoch, seq)
        self._nodes[node] = state
        for h in hashes:
            self._add(node, state, h)

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
                self._add(node, state, event.block_hash)
            elif isinstance(event, BlockEvicted):
                self._remove(node, state, event.block_hash)
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
        """For each of `nodes`, how many of `hashes` (a prompt's chain) it holds from the first
        block on, without a hole."""
        return longest_prefixes(hashes, nodes, self.holders)

    def _add(self, node: str, state: _NodeState, h: bytes) -> None:
        state.hashes.add(h)
        self._holders.setdefault(h, set()).add(node)

    def _remove(self, node: str, state: _NodeState, h: bytes) -> None:
        state.hashes.discard(h)
        holders = self._holders.get(h)
        if holders is not None:
            holders.discard(node)
            if not holders:
                del self._holders[h]

    def _clear(self, node: str, state: _NodeState) -> None:
        for h in list(state.hashes):
            self._remove(node, state, h)


def longest_prefixes(
    hashes: Sequence[bytes], nodes: Collection[str], *sources: HolderLookup
) -> dict[str, int]:
    """Per node, the length of the leading run of `hashes` that some source says it holds.
    One dict lookup per block and source; stops as soon as no node is still matching."""
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
            return result
    for node in alive:
        result[node] = len(hashes)
    return result
