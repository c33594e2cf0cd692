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
        """A hash: `epoch`, `seq` (the last event it reflects), `hashes` (concatenated)."""
        return f"{self.prefix}cluster:node:{node}:snapshot"


@record
class NodeRecord:
    """What a node publishes under its liveness key: where to reach it, which model cache it
    holds (`cache_root`: hex of its hash chain root, so only nodes of one checkpoint and block
    size are compared; `block_size`, so a node can say which of the two differs), and its
    load."""

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
