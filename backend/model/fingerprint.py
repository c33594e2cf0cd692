"""A checkpoint's fingerprint: the seed of its KV block hashes (``backend.engine.block_hash``).

Two directories share a fingerprint only when their config.json, their index and every
safetensors shard's header agree and the first bytes of each shard's data match; a header
names every tensor with its dtype, shape and offsets, and the leading data tells apart
checkpoints of one architecture with different weights. Reading it costs a few KiB per shard.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterator
from pathlib import Path

_HEADER_LEN = struct.Struct("<Q")
_DATA_SAMPLE_BYTES = 1 << 16


def checkpoint_fingerprint(model_dir: str | Path) -> bytes:
    """sha256 over config.json, model.safetensors.index.json (if any) and each shard's header
    and leading data, in file-name order. Raises FileNotFoundError without a config.json."""
    digest = hashlib.sha256()
    for name, content in _parts(Path(model_dir)):
        # length-prefixed, so no two file lists hash alike by concatenation
        for part in (name.encode(), content):
            digest.update(_HEADER_LEN.pack(len(part)))
            digest.update(part)
    return digest.digest()


def _parts(model_dir: Path) -> Iterator[tuple[str, bytes]]:
    """(file name, hashed bytes) of every file that identifies the checkpoint."""
    config = model_dir / "config.json"
    yield config.name, config.read_bytes()
    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        yield index.name, index.read_bytes()
    for shard in sorted(model_dir.glob("*.safetensors")):
        with shard.open("rb") as handle:
            prefix = handle.read(_HEADER_LEN.size)
            if len(prefix) < _HEADER_LEN.size:
                raise ValueError(f"{shard} is not a safetensors file")
            (header_len,) = _HEADER_LEN.unpack(prefix)
            yield shard.name, handle.read(header_len + _DATA_SAMPLE_BYTES)
