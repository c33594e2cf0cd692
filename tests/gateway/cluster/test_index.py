"""The in-memory prefix index on plain data, and the event batch codec."""

from __future__ import annotations

import pytest

from backend.engine.block_hash import block_hash, chain_hashes, root_hash
from backend.engine.blocks import BlockEvicted, BlockStored
from gateway.cluster.events import (
    AllBlocksCleared,
    MalformedBatch,
    decode_batch,
    decode_entry,
    encode_batch,
    entry_fields,
)
from gateway.cluster.index import Applied, PrefixIndex, longest_prefixes
from gateway.cluster.keys import decode_masks, encode_masks, parse_root, published_root

SEED = b"fingerprint"
BS = 4


def stored(tokens: list[int], parent: bytes | None = None) -> BlockStored:
    parent = parent or root_hash(SEED, BS)
    return BlockStored(block_hash(parent, tokens), parent, tuple(tokens))


def chain(n: int, start: int = 0) -> list[BlockStored]:
    events, parent = [], root_hash(SEED, BS)
    for i in range(n):
        event = stored([start + 4 * i + j for j in range(4)], parent)
        events.append(event)
        parent = event.block_hash
    return events


def test_codec_roundtrip_and_recomputes_hashes() -> None:
    events = [AllBlocksCleared(), *chain(3), BlockEvicted(chain(1)[0].block_hash)]
    assert decode_batch(encode_batch(events)) == events
    forged = BlockStored(b"x" * 32, root_hash(SEED, BS), (1, 2, 3, 4))
    with pytest.raises(MalformedBatch):
        decode_batch(encode_batch([forged]))
    with pytest.raises(MalformedBatch):
        decode_batch(encode_batch(chain(1))[:-3])
    with pytest.raises(MalformedBatch):
        decode_batch(b"Z")


def test_ranked_codec_keeps_ranks_and_format_1_refuses_them() -> None:
    blocks = chain(2)
    events = [
        AllBlocksCleared(),
        BlockStored(blocks[0].block_hash, blocks[0].parent_hash, blocks[0].token_ids, 3),
        blocks[1],
        BlockEvicted(blocks[0].block_hash, 300),
    ]
    fields = entry_fields(events, ranked=True)
    assert list(fields) == ["r"]
    assert decode_entry({k.encode(): v for k, v in fields.items()}) == events
    plain = entry_fields(chain(2), ranked=False)
    assert list(plain) == ["d"] and plain["d"] == encode_batch(chain(2))  # format 1 as before
    assert decode_entry({b"d": plain["d"]}) == chain(2)
    with pytest.raises(ValueError, match="format 1 has no ranks"):
        encode_batch(events)
    with pytest.raises(MalformedBatch):
        decode_entry({b"x": b""})
    with pytest.raises(MalformedBatch):  # a format 2 batch read as format 1 does not decode
        decode_batch(fields["r"][1:])


def test_the_published_root_names_the_index_format() -> None:
    root = root_hash(SEED, BS).hex()
    assert published_root(root, ranked=False) == root
    assert parse_root(published_root(root, ranked=True)) == (root, 2)
    assert parse_root(root) == (root, 1)
    assert parse_root(root + "+columnar") == (root, 0)  # a format this node cannot read
    masks = [0b1, 0b1010, 1 << 9]
    raw = encode_masks(masks)
    assert raw[0] == 2 and decode_masks(raw, 3) == masks  # two bytes a mask for rank 9
    assert decode_masks(encode_masks([]), 0) == []
    with pytest.raises(ValueError):
        decode_masks(raw, 2)


def test_a_prefix_split_over_ranks_counts_its_longest_part_on_one_rank() -> None:
    index = PrefixIndex()
    blocks = chain(4)
    hashes = [b.block_hash for b in blocks]
    index.load_snapshot("a", 1, 0, hashes, [0b01, 0b01, 0b10, 0b10])
    assert index.prefix_blocks(hashes, ["a"]) == {"a": 2}
    ranked = [BlockStored(b.block_hash, b.parent_hash, b.token_ids, 1) for b in blocks[:2]]
    assert index.apply("a", 1, 1, ranked) is Applied.APPLIED
    assert index.prefix_blocks(hashes, ["a"]) == {"a": 4}  # rank 1 now holds all four
    assert index.apply("a", 1, 3, [BlockEvicted(hashes[1], 1)]) is Applied.APPLIED
    assert dict(index.holders(hashes[1])) == {"a": 0b01}
    assert index.prefix_blocks(hashes, ["a"]) == {"a": 2}
    assert index.num_blocks("a") == 4
    # a source without ranks (pending marks, the node's own engine) counts for every rank
    pending = {hashes[2]: ["a"], hashes[3]: ["a"]}
    lookups = (index.holders, lambda h: pending.get(h, ()))
    found = longest_prefixes(hashes, ["a"], *lookups, ranked=index.ranked_nodes)
    assert found == {"a": 4}


def test_events_apply_in_order() -> None:
    index = PrefixIndex()
    blocks = chain(3)
    index.load_snapshot("a", epoch=5, seq=0, hashes=[])
    assert index.apply("a", 5, 1, blocks[:2]) is Applied.APPLIED
    assert (
        index.apply("a", 5, 3, [blocks[2], BlockEvicted(blocks[0].block_hash)]) is Applied.APPLIED
    )
    assert index.position("a") == (5, 4)
    assert not index.holders(blocks[0].block_hash)
    assert set(index.holders(blocks[1].block_hash)) == {"a"}
    hashes = [b.block_hash for b in blocks]
    assert index.prefix_blocks(hashes, ["a"]) == {"a": 0}  # block 0 is gone: no prefix


def test_replays_are_idempotent() -> None:
    index = PrefixIndex()
    blocks = chain(2)
    index.load_snapshot("a", 5, 0, [])
    assert index.apply("a", 5, 1, blocks) is Applied.APPLIED
    assert index.apply("a", 5, 1, blocks) is Applied.DUPLICATE
    assert index.apply("a", 5, 2, blocks[1:]) is Applied.DUPLICATE
    # an entry overlapping what was applied contributes only its new tail
    evict = BlockEvicted(blocks[1].block_hash)
    assert index.apply("a", 5, 2, [blocks[1], evict]) is Applied.APPLIED
    assert index.position("a") == (5, 3)
    assert index.num_blocks("a") == 1
    assert index.apply("a", 4, 9, chain(1, start=100)) is Applied.DUPLICATE  # an older epoch


def test_gap_is_detected_and_resync_from_snapshot_repairs_it() -> None:
    index = PrefixIndex()
    blocks = chain(4)
    index.load_snapshot("a", 5, 0, [])
    index.apply("a", 5, 1, blocks[:1])
    assert index.apply("a", 5, 3, blocks[2:3]) is Applied.GAP  # seq 2 never arrived
    assert index.position("a") == (5, 1)
    # the snapshot at seq 3 holds what the missing entry added
    index.load_snapshot("a", 5, 3, [b.block_hash for b in blocks[:3]])
    assert index.apply("a", 5, 4, blocks[3:]) is Applied.APPLIED
    assert index.prefix_blocks([b.block_hash for b in blocks], ["a"]) == {"a": 4}
    # a newer epoch that does not start from a clear is a gap too; an unknown node as well
    assert index.apply("a", 6, 1, chain(1, start=50)) is Applied.GAP
    assert index.apply("b", 5, 1, blocks[:1]) is Applied.GAP


def test_restart_clears_a_node() -> None:
    index = PrefixIndex()
    blocks = chain(2)
    index.load_snapshot("a", 5, 2, [b.block_hash for b in blocks])
    fresh = chain(1, start=200)
    assert index.apply("a", 6, 1, [AllBlocksCleared(), *fresh]) is Applied.APPLIED
    assert index.position("a") == (6, 2)
    assert not index.holders(blocks[0].block_hash)
    assert set(index.holders(fresh[0].block_hash)) == {"a"}


def test_dropping_a_node_removes_only_its_entries() -> None:
    index = PrefixIndex()
    blocks = chain(3)
    hashes = [b.block_hash for b in blocks]
    index.load_snapshot("a", 1, 3, hashes)
    index.load_snapshot("b", 1, 1, hashes[:1])
    assert index.prefix_blocks(hashes, ["a", "b", "c"]) == {"a": 3, "b": 1, "c": 0}
    index.drop("a")  # its liveness expired
    assert index.position("a") is None
    assert index.prefix_blocks(hashes, ["a", "b"]) == {"a": 0, "b": 1}
    assert set(index.holders(hashes[0])) == {"b"}
    assert not index.holders(hashes[1])


def test_prefix_is_consecutive_from_the_first_block() -> None:
    index = PrefixIndex()
    hashes = chain_hashes(SEED, list(range(20)), BS)
    index.load_snapshot("a", 1, 1, [hashes[0], hashes[2], hashes[3]])
    assert index.prefix_blocks(hashes, ["a"]) == {"a": 1}
