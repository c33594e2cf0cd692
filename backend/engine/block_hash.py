"""Chained, seeded hashes of full KV blocks, stable across processes and machines.

The hash of block i is blake2b(hash of block i-1 || token ids of block i); block 0 chains from a
root derived from the caller's seed (a checkpoint fingerprint) and the block size, so caches of
different checkpoints or block sizes never match. Token ids are encoded as little-endian uint32.
Never uses Python's `hash()` (salted per process). The gateway's Redis index uses the same chain,
so a prompt's block hashes can be computed without the engine. Pure Python, no torch.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence

HASH_SIZE = 32
_PERSON_ROOT = b"dsv31-kv-root"
_PERSON_BLOCK = b"dsv31-kv-block"


def root_hash(seed: bytes, block_size: int) -> bytes:
    """The parent hash of a sequence's first block."""
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    h = hashlib.blake2b(digest_size=HASH_SIZE, person=_PERSON_ROOT)
    h.update(struct.pack("<Q", block_size))
    h.update(seed)
    return h.digest()


def block_hash(parent: bytes, token_ids: Sequence[int]) -> bytes:
    """Hash of one full block given its parent's hash; ids must fit in uint32."""
    h = hashlib.blake2b(parent, digest_size=HASH_SIZE, person=_PERSON_BLOCK)
    h.update(struct.pack(f"<{len(token_ids)}I", *token_ids))
    return h.digest()


def extend_chain(
    hashes: list[bytes], root: bytes, token_ids: Sequence[int], block_size: int
) -> None:
    """Append to `hashes` (the chain of the first len(hashes) blocks) every further full block."""
    for i in range(len(hashes), len(token_ids) // block_size):
        parent = hashes[i - 1] if i else root
        hashes.append(block_hash(parent, token_ids[i * block_size : (i + 1) * block_size]))


def chain_hashes(seed: bytes, token_ids: Sequence[int], block_size: int) -> list[bytes]:
    """Hashes of every full block of `token_ids` (a trailing partial block has none)."""
    hashes: list[bytes] = []
    extend_chain(hashes, root_hash(seed, block_size), token_ids, block_size)
    return hashes
