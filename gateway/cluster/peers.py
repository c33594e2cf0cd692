"""`PeerView`: one other node of the cluster as this node sees it (liveness, compatibility,
load, cached blocks), built by the follower and shown by `gateway.cluster.membership`."""

from __future__ import annotations

from typing import Any

from plumbing.record import record


@record
class PeerView:
    node: str
    url: str = ""
    live: bool = False
    compatible: bool = False
    incompatible: str = ""  # why not, in words ("block size 32 there, 16 here")
    left_out: bool = False
    waiting: int = 0
    running_tokens: int = 0
    free_blocks: int = 0
    total_blocks: int = 0
    cached_blocks: int = 0  # in this node's prefix index (compatible peers only)

    def as_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"node": self.node, "live": self.live}
        if not self.live:
            return body
        body.update(url=self.url, compatible=self.compatible, left_out=self.left_out)
        if self.incompatible:
            body["incompatible"] = self.incompatible
        body.update(
            waiting=self.waiting,
            running_tokens=self.running_tokens,
            free_blocks=self.free_blocks,
            total_blocks=self.total_blocks,
            cached_blocks=self.cached_blocks,
        )
        return body
