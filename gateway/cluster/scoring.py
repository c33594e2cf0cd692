"""Where a prompt is cheapest to serve: cached prefix against load. Pure data, no I/O.

Each node costs `backend.engine.placement.placement_cost` (the engine scores its attention
ranks with the same function): its uncached prompt tokens, its waiting requests and running
tokens, and a forward's cost where it is not this node. The lowest cost wins; ties stay on
this node, then go to the smallest node id. A node whose free blocks cannot hold the uncached
part is skipped (this node is the fallback). Cached prefix length counts blocks from the
prompt's first block on, as the engine reuses them, and never the block holding the prompt's
last token (the engine always computes that one).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from backend.engine.placement import PlacementWeights as Weights
from backend.engine.placement import cacheable_blocks, placement_cost
from gateway.cluster.index import HolderLookup, longest_prefixes
from plumbing.record import record


@record
class NodeLoad:
    """What a node publishes beside its liveness."""

    waiting: int = 0
    running_tokens: int = 0
    free_blocks: int = 0


@record
class Placement:
    """The routing decision for one prompt, for the route explanation."""

    node_id: str
    local: bool
    cached_blocks: int
    prompt_blocks: int
    cost: float

    def __str__(self) -> str:
        """Fields of the route explanation (`x-gateway-route`)."""
        via = "local" if self.local else "forward"
        return f"node={self.node_id}; prefix={self.cached_blocks}/{self.prompt_blocks}; via={via}"


class PendingMarks:
    """Blocks a prompt was just sent to a node for, counted as held there for `ttl_s` seconds
    (so a burst of one new prefix is not scattered before the node's events arrive)."""

    def __init__(self, ttl_s: float) -> None:
        self._ttl_s = ttl_s
        self._until: dict[bytes, dict[str, float]] = {}

    def __len__(self) -> int:
        return len(self._until)

    def mark(self, hashes: Sequence[bytes], node: str, now: float) -> None:
        if self._ttl_s <= 0:
            return
        until = now + self._ttl_s
        for h in hashes:
            self._until.setdefault(h, {})[node] = until

    def lookup(self, now: float) -> HolderLookup:
        def holders(h: bytes) -> Collection[str]:
            marks = self._until.get(h)
            if not marks:
                return ()
            return [node for node, until in marks.items() if until > now]

        return holders

    def sweep(self, now: float) -> None:
        """Forget expired marks."""
        for h in list(self._until):
            marks = {n: u for n, u in self._until[h].items() if u > now}
            if marks:
                self._until[h] = marks
            else:
                del self._until[h]


def choose(
    self_id: str,
    num_prompt_tokens: int,
    block_size: int,
    prefix: dict[str, int],
    loads: dict[str, NodeLoad],
    weights: Weights,
) -> Placement:
    """The cheapest node among `loads` (live nodes; `self_id` is always a candidate); `prefix`
    is each node's cached prefix in blocks."""
    num_blocks = cacheable_blocks(num_prompt_tokens, block_size)
    best: tuple[float, int, str] | None = None
    for node, load in loads.items():
        cached = min(prefix.get(node, 0), num_blocks)
        uncached = num_prompt_tokens - cached * block_size
        is_self = node == self_id
        if not is_self and load.free_blocks * block_size < uncached:
            continue
        cost = placement_cost(
            uncached, load.waiting, load.running_tokens, weights, forwarded=not is_self
        )
        key = (cost, 0 if is_self else 1, node)
        if best is None or key < best:
            best = key
    if best is None:
        return Placement(self_id, True, min(prefix.get(self_id, 0), num_blocks), num_blocks, 0.0)
    cost, _, node = best
    return Placement(node, node == self_id, min(prefix.get(node, 0), num_blocks), num_blocks, cost)


def place(
    self_id: str,
    hashes: Sequence[bytes],
    num_prompt_tokens: int,
    block_size: int,
    loads: dict[str, NodeLoad],
    weights: Weights,
    *holders: HolderLookup,
    ranked: Collection[str] = (),
) -> Placement:
    """Score `hashes` (the prompt's full-block chain) on every node of `loads`; `ranked`: the
    nodes whose blocks may sit on several attention ranks (a prefix counts on one rank)."""
    candidates = dict(loads)
    candidates.setdefault(self_id, NodeLoad())
    chain = hashes[: cacheable_blocks(num_prompt_tokens, block_size)]
    prefix = longest_prefixes(chain, candidates, *holders, ranked=ranked)
    return choose(self_id, num_prompt_tokens, block_size, prefix, candidates, weights)
