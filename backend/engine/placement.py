"""What a prompt costs where it may be served: its uncached tokens against the load there.
Pure arithmetic, no torch; the cluster's placer scores nodes with it (`gateway.cluster.scoring`)
and the data-parallel engine scores its attention ranks (`backend.engine.ranked_blocks`).

cost = uncached prompt tokens
     + waiting_cost_tokens  x requests waiting there
     + running_token_weight x tokens held by its running requests
     + forward_cost_tokens  where serving there means a forward (another node)

Cached prefix length counts blocks from the prompt's first block on, as the engine reuses them,
and never the block holding the prompt's last token (the engine always computes that one).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PlacementWeights:
    waiting_cost_tokens: float = 512.0
    running_token_weight: float = 0.02
    forward_cost_tokens: float = 64.0


def cacheable_blocks(num_prompt_tokens: int, block_size: int) -> int:
    """Leading full blocks the engine may take from its cache (not the last token's block)."""
    return max(0, (num_prompt_tokens - 1) // block_size)


def placement_cost(
    uncached_tokens: int,
    waiting: int,
    running_tokens: int,
    weights: PlacementWeights,
    *,
    forwarded: bool,
) -> float:
    """The cost of serving a prompt with `uncached_tokens` to compute on an engine (or rank)
    with `waiting` requests queued and `running_tokens` held by its running ones."""
    return (
        uncached_tokens
        + weights.waiting_cost_tokens * waiting
        + weights.running_token_weight * running_tokens
        + (weights.forward_cost_tokens if forwarded else 0.0)
    )
