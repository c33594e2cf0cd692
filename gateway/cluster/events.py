"""Block events as they travel through Redis: a compact binary batch per stream entry.

One entry of a node's stream carries consecutive events; its stream id is `<epoch>-<seq>` where
`seq` numbers the entry's first event (1-based within the epoch), so readers detect gaps and a
snapshot names the exact stream position it reflects. Two index formats (`gateway.cluster.keys`):
format 1 (field `d`), for a node with one block pool, per event:
  b"S" hash(32) parent(32) n(uint16) n x uint32 token ids   (block stored)
  b"E" hash(32)                                             (block evicted)
  b"C"                                                      (all blocks cleared: a restart)
and format 2 (field `r`), for a node with one pool per data-parallel attention rank, the same
with the rank after the kind byte of a stored and an evicted event:
  b"S" rank(uint16) hash parent n tokens  |  b"E" rank(uint16) hash  |  b"C" (every rank)
A stored event carries its parent hash and token ids, so a reader can recompute its hash. A
format 1 event is read as rank 0's.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

from backend.engine.block_hash import HASH_SIZE, block_hash
from backend.engine.blocks import BlockEvicted, BlockStored
from plumbing.record import record

_STORED, _EVICTED, _CLEARED = b"S", b"E", b"C"


@record
class AllBlocksCleared:
    """Everything the node had cached is gone (it restarted)."""


IndexEvent = BlockStored | BlockEvicted | AllBlocksCleared


class MalformedBatch(ValueError):
    """A stream entry that does not decode (or whose stored hash does not recompute)."""


def encode_batch(events: Iterable[IndexEvent], *, ranked: bool = False) -> bytes:
    """Format 1, or with `ranked` format 2 (format 1 refuses an event of a rank other than 0:
    a reader of it could not tell the ranks apart)."""
    parts: list[bytes] = []
    for event in events:
        if isinstance(event, AllBlocksCleared):
            parts.append(_CLEARED)
            continue
        if ranked:
            rank = struct.pack("<H", event.rank)
        elif event.rank:
            raise ValueError(f"index format 1 has no ranks (an event of rank {event.rank})")
        else:
            rank = b""
        if isinstance(event, BlockStored):
            tokens = event.token_ids
            parts += [
                _STORED,
                rank,
                event.block_hash,
                event.parent_hash,
                struct.pack(f"<H{len(tokens)}I", len(tokens), *tokens),
            ]
        else:
            parts += [_EVICTED, rank, event.block_hash]
    return b"".join(parts)


def decode_batch(data: bytes, *, ranked: bool = False, verify: bool = True) -> list[IndexEvent]:
    """The events of one entry (format 2 with `ranked`); with `verify`, each stored hash is
    recomputed from its parent and tokens. Raises MalformedBatch."""
    events: list[IndexEvent] = []
    pos, end = 0, len(data)
    try:
        while pos < end:
            kind = data[pos : pos + 1]
            pos += 1
            rank = 0
            if ranked and kind in (_STORED, _EVICTED):
                (rank,) = struct.unpack_from("<H", data, pos)
                pos += 2
            if kind == _CLEARED:
                events.append(AllBlocksCleared())
            elif kind == _EVICTED:
                events.append(BlockEvicted(_take(data, pos, HASH_SIZE), rank))
                pos += HASH_SIZE
            elif kind == _STORED:
                h = _take(data, pos, HASH_SIZE)
                parent = _take(data, pos + HASH_SIZE, HASH_SIZE)
                pos += 2 * HASH_SIZE
                (n,) = struct.unpack_from("<H", data, pos)
                tokens = struct.unpack_from(f"<{n}I", data, pos + 2)
                pos += 2 + 4 * n
                if verify and block_hash(parent, tokens) != h:
                    raise MalformedBatch("a stored block's hash does not match its tokens")
                events.append(BlockStored(h, parent, tokens, rank))
            else:
                raise MalformedBatch(f"unknown event kind {kind!r}")
    except struct.error as exc:
        raise MalformedBatch(f"truncated batch: {exc}") from None
    return events


def _take(data: bytes, pos: int, size: int) -> bytes:
    chunk = data[pos : pos + size]
    if len(chunk) != size:
        raise MalformedBatch("truncated batch")
    return chunk


def decode_entry(fields: dict[bytes, bytes], *, verify: bool = True) -> list[IndexEvent]:
    """The events of a stream entry of either format (by its field). Raises MalformedBatch."""
    ranked = fields.get(b"r")
    if ranked is not None:
        return decode_batch(ranked, ranked=True, verify=verify)
    plain = fields.get(b"d")
    if plain is None:
        raise MalformedBatch(f"an entry without events (fields {sorted(fields)})")
    return decode_batch(plain, verify=verify)


def entry_fields(events: Iterable[IndexEvent], *, ranked: bool) -> dict[str, bytes]:
    """A stream entry's fields: `r` (format 2) with `ranked`, else `d` (format 1)."""
    return {"r" if ranked else "d": encode_batch(events, ranked=ranked)}
