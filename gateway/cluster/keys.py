"""Redis key names of the cluster, under the gateway's key prefix, and the liveness record."""

from __future__ import annotations

import json
from dataclasses import asdict

from plumbing.record import record


@record
class ClusterKeys:
    prefix: str

    @property
    def members(self) -> str:
        """A set of node ids that ever announced themselves (liveness decides who counts)."""
        return f"{self.prefix}cluster:nodes"

    def live(self, node: str) -> str:
        """The node's liveness record (JSON `NodeRecord`), with a short TTL."""
        return f"{self.prefix}cluster:node:{node}:live"

    def stream(self, node: str) -> str:
        """The node's block events: entries `<epoch>-<seq>` with field `d` (events.py)."""
        return f"{self.prefix}cluster:node:{node}:events"

    def snapshot(self, node: str) -> str:
        """A hash: `epoch`, `seq` (the last event it reflects), `hashes` (the distinct cached
        hashes, concatenated) and, in index format 2, `ranks`: one byte giving a width w, then
        per hash of `hashes`, in order, a w-byte little-endian mask of the ranks holding it."""
        return f"{self.prefix}cluster:node:{node}:snapshot"


# Index formats: 1, a node of one block pool (events without ranks); 2, one pool per
# data-parallel attention rank (events and snapshot with ranks). A format 2 node publishes its
# cache root as `<root hex>+ranked`, so a reader of format 1 alone (which compares cache roots
# as strings) sees another model cache and refuses the node, instead of misreading its stream.
FORMATS = (1, 2)
_RANKED = "+ranked"


def published_root(root_hex: str, *, ranked: bool) -> str:
    """The `cache_root` a node publishes: its chain root, marked when its index is ranked."""
    return root_hex + _RANKED if ranked else root_hex


def parse_root(cache_root: str) -> tuple[str, int]:
    """(chain root hex, index format) of a published `cache_root`; a suffix this node does not
    know gives format 0 (unreadable here)."""
    root, plus, tail = cache_root.partition("+")
    if not plus:
        return root, 1
    return root, 2 if plus + tail == _RANKED else 0


def encode_masks(masks: list[int]) -> bytes:
    """The snapshot's `ranks` field for these rank masks (see `ClusterKeys.snapshot`)."""
    width = max(1, -(-max(masks, default=0).bit_length() // 8))
    return bytes([width]) + b"".join(m.to_bytes(width, "little") for m in masks)


def decode_masks(raw: bytes, count: int) -> list[int]:
    """`count` rank masks from a snapshot's `ranks` field; ValueError when it does not hold
    exactly that many."""
    if not raw:
        raise ValueError("an empty ranks field")
    width = raw[0]
    if width == 0 or len(raw) != 1 + width * count:
        raise ValueError(f"a ranks field of {len(raw)} bytes for {count} hashes")
    return [
        int.from_bytes(raw[1 + i * width : 1 + (i + 1) * width], "little") for i in range(count)
    ]


@record
class NodeRecord:
    """What a node publishes under its liveness key: where to reach it, which model cache it
    holds (`cache_root`: hex of its hash chain root, so only nodes of one checkpoint and block
    size are compared, marked with its index format, `published_root`; `block_size`, so a node
    can say which of the two differs), and its load."""

    url: str
    cache_root: str
    epoch: int
    waiting: int
    running_tokens: int
    free_blocks: int
    total_blocks: int
    block_size: int = 0  # 0: not published

    def dumps(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def loads(cls, raw: bytes | str) -> NodeRecord:
        data = json.loads(raw)
        return cls(
            url=str(data["url"]),
            cache_root=str(data["cache_root"]),
            epoch=int(data["epoch"]),
            waiting=int(data["waiting"]),
            running_tokens=int(data["running_tokens"]),
            free_blocks=int(data["free_blocks"]),
            total_blocks=int(data["total_blocks"]),
            block_size=int(data.get("block_size", 0)),
        )
