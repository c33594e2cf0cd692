"""Scoring: cached prefix against load, pending marks, and the placement's explanation."""

from __future__ import annotations

from backend.engine.block_hash import chain_hashes
from gateway.cluster.index import PrefixIndex
from gateway.cluster.scoring import (
    NodeLoad,
    PendingMarks,
    Weights,
    cacheable_blocks,
    choose,
    place,
)

BS = 16
W = Weights(waiting_cost_tokens=100.0, running_token_weight=0.1, forward_cost_tokens=10.0)
IDLE = NodeLoad(waiting=0, running_tokens=0, free_blocks=1000)


def test_the_node_holding_the_prefix_wins() -> None:
    # 161 tokens: 10 cacheable blocks (the last token's block is always computed)
    choice = choose("a", 161, BS, {"a": 0, "b": 10}, {"a": IDLE, "b": IDLE}, W)
    assert (choice.node_id, choice.local, choice.cached_blocks) == ("b", False, 10)
    assert choice.cost == 161 - 160 + 10
    assert str(choice) == "node=b; prefix=10/10; via=forward"


def test_ties_stay_local_and_forwarding_must_pay_for_itself() -> None:
    assert choose("a", 161, BS, {}, {"a": IDLE, "b": IDLE}, W).node_id == "a"
    # a cached block (16 tokens) beats the forward cost (10); under it, it does not
    assert choose("a", 161, BS, {"b": 1}, {"a": IDLE, "b": IDLE}, W).node_id == "b"
    cheap = Weights(100.0, 0.1, forward_cost_tokens=20.0)
    assert choose("a", 161, BS, {"b": 1}, {"a": IDLE, "b": IDLE}, cheap).node_id == "a"


def test_load_outweighs_a_cached_prefix() -> None:
    busy = NodeLoad(waiting=3, running_tokens=0, free_blocks=1000)
    choice = choose("a", 161, BS, {"b": 10}, {"a": IDLE, "b": busy}, W)
    assert choice.node_id == "a"  # 300 token-equivalents of queue > 160 cached tokens
    running = NodeLoad(waiting=0, running_tokens=2000, free_blocks=1000)
    assert choose("a", 161, BS, {"b": 10}, {"a": IDLE, "b": running}, W).node_id == "a"
    assert choose("a", 161, BS, {"b": 10}, {"a": running, "b": IDLE}, W).node_id == "b"


def test_a_peer_without_room_is_skipped() -> None:
    full = NodeLoad(waiting=0, running_tokens=0, free_blocks=0)
    choice = choose("a", 161, BS, {"b": 5}, {"a": IDLE, "b": full}, W)
    assert choice.node_id == "a"
    assert choose("a", 161, BS, {}, {"b": full}, W).node_id == "a"  # self is the fallback


def test_the_last_tokens_block_never_counts() -> None:
    assert cacheable_blocks(160, BS) == 9
    assert cacheable_blocks(161, BS) == 10
    assert cacheable_blocks(1, BS) == 0
    choice = choose("a", 160, BS, {"b": 10}, {"a": IDLE, "b": IDLE}, W)
    assert choice.cached_blocks == 9


def test_place_scores_from_the_index_and_pending_marks() -> None:
    ids = list(range(100))
    hashes = chain_hashes(b"seed", ids, BS)  # 6 full blocks; 6 cacheable
    index = PrefixIndex()
    index.load_snapshot("b", 1, 1, hashes[:3])
    index.load_snapshot("c", 1, 1, hashes[:5])
    pending = PendingMarks(ttl_s=3.0)
    loads = {"a": IDLE, "b": IDLE, "c": IDLE}
    choice = place("a", hashes, len(ids), BS, loads, W, index.holders, pending.lookup(0.0))
    assert (choice.node_id, choice.cached_blocks, choice.prompt_blocks) == ("c", 5, 6)
    # a burst: the prompt was just sent to b, so b counts as holding all of it for a while
    pending.mark(hashes, "b", now=10.0)
    choice = place("a", hashes, len(ids), BS, loads, W, index.holders, pending.lookup(11.0))
    assert (choice.node_id, choice.cached_blocks) == ("b", 6)
    choice = place("a", hashes, len(ids), BS, loads, W, index.holders, pending.lookup(13.5))
    assert choice.node_id == "c"  # the marks expired
    pending.sweep(13.5)
    assert len(pending) == 0


def test_a_dead_node_is_not_a_candidate() -> None:
    hashes = chain_hashes(b"seed", list(range(100)), BS)
    index = PrefixIndex()
    index.load_snapshot("b", 1, 1, hashes)
    # b is not among the live loads: its entries do not count
    choice = place("a", hashes, 100, BS, {"a": IDLE}, W, index.holders)
    assert choice.node_id == "a" and choice.local
