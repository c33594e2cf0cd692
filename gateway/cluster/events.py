"""Block events as they travel through Redis: a compact binary batch per stream entry.

One entry of a node's stream carries consecutive events; its stream id is `<epoch>-<seq>` where
`seq` numbers the entry's first event (1-based within the epoch), so readers detect gaps and a
snapshot names the exact stream position it reflects. Encoding, per event:
  b"S" hash(32) parent(32) n(uint16) n x uint32 token ids   (block stored)
  b"E" hash(32)                                             (block evicted)
  b"C"                                                      (all blocks cleared: a restart)
A stored event carries its parent hash and token ids, so a reader can recompute its hash.
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


def encode_batch(events: Iterable[IndexEvent]) -> bytes:
    parts: list[bytes] = []
    for event in events:
        if isinstance(event, BlockStored):
            tokens = event.token_ids
            parts += [
                _STORED,
                event.block_hash,
                event.parent_hash,
                struct.pack(f"<H{len(tokens)}I", len(tokens), *tokens),
            ]
        elif isinstance(event, BlockEvicted):
            parts += [_EVICTED, event.block_hash]
        else:
            parts.append(_CLEARED)
    return b"".join(parts)


def decode_batch(data: bytes, *, verify: bool = True) -> list[IndexEvent]:
    """The events of one entry; with `verify`, each stored hash is recomputed from its parent
    and tokens. Raises MalformedBatch."""
    events: list[IndexEvent] = []
    pos, end = 0, len(data)
    try:
        while pos < end:
            kind = data[pos : pos + 1]
            pos += 1
            if kind == _CLEARED:
                events.append(AllBlocksCleared())
            elif kind == _EVICTED:
                events.append(BlockEvicted(_take(data, pos, HASH_SIZE)))
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
                events.append(BlockStored(h, parent, tokens))
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
