"""Who this node sees in the cluster, for operators: `/readyz`'s `cluster` detail and the
`gateway_cluster_peer_*` gauges of `/metrics`, one series per peer, read at scrape time.

A peer is any other node in the cluster's member set: `live` while its liveness record exists
(and Redis could be read within the liveness TTL), `compatible` when it serves the same model
cache (checkpoint and block size) as this node, and `left_out` while a forward to it failed
recently (it is not placed on until its liveness would have expired). Load and cached blocks
are what it last published; a peer that is not live reports none.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.cluster.node import ClusterNode
from gateway.cluster.peers import PeerView


def peer_views(node: ClusterNode) -> list[PeerView]:
    """This node's peers now, by id (none before the local engine joined the cluster)."""
    placer = node.placer
    if placer is None:
        return []
    now = time.monotonic()
    left_out = placer.left_out(now)
    views = placer.follower.peers(now)
    return [replace(v, left_out=True) if v.node in left_out else v for v in views]


def cluster_detail(node: ClusterNode) -> dict[str, Any]:
    """`/readyz`'s `cluster` field: this node and the peers it sees."""
    return {
        "node": node.node_id,
        "url": node.url,
        "joined": node.placer is not None,
        "peers": [view.as_json() for view in peer_views(node)],
    }


_GAUGES: tuple[tuple[str, str, Callable[[PeerView], float]], ...] = (
    ("live", "1 while the peer's liveness record exists", lambda v: v.live),
    ("compatible", "1 when the peer serves this node's model cache", lambda v: v.compatible),
    ("left_out", "1 while a failed forward keeps prompts off the peer", lambda v: v.left_out),
    ("waiting_requests", "Requests waiting on the peer's engine", lambda v: v.waiting),
    ("running_tokens", "Tokens held by the peer's running requests", lambda v: v.running_tokens),
    ("free_blocks", "Free KV cache blocks on the peer", lambda v: v.free_blocks),
    ("cached_blocks", "The peer's cached blocks in this node's index", lambda v: v.cached_blocks),
)


class ClusterCollector(Collector):
    """`gateway_cluster_peer_<name>{peer}`; a peer that is not live has `live` 0 only."""

    def __init__(self, node: ClusterNode) -> None:
        self._node = node

    def collect(self) -> Iterator[Metric]:
        views = peer_views(self._node)
        live = [v for v in views if v.live]
        count = GaugeMetricFamily("gateway_cluster_peers", "Live compatible peers")
        count.add_metric([], sum(1 for v in live if v.compatible))
        yield count
        for name, doc, value in _GAUGES:
            family = GaugeMetricFamily(f"gateway_cluster_peer_{name}", doc, labels=["peer"])
            for view in views if name == "live" else live:
                family.add_metric([view.node], float(value(view)))
            yield family


def register_cluster_metrics(registry: CollectorRegistry, node: ClusterNode) -> None:
    """Add the peers' gauges to `registry` (read from `node` at every scrape)."""
    registry.register(ClusterCollector(node))
