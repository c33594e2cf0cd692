"""Settings of a node in a cluster (`[cluster]`). Part of the one settings object
(gateway/config/settings.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, SecretStr, model_validator

from gateway.config.frozen import FROZEN


class ClusterSettings(BaseModel):
    """Several nodes (gateway + engine) sharing one Redis; see gateway/cluster/.

    Routing cost of serving a prompt on node n, in prompt-token units (lowest wins, ties stay
    on this node): uncached prompt tokens on n + `waiting_cost_tokens` x requests waiting on n
    + `running_token_weight` x tokens held by n's running requests + `forward_cost_tokens` when
    n is a peer. A node without free blocks for the uncached part is skipped.
    """

    model_config = FROZEN
    enabled: bool = Field(
        default=False,
        description="Join the cluster: publish this engine's cached blocks and place requests "
        "on the node that holds their prefix. Needs `secret`; not with `server.workers` > 1.",
    )
    node_id: str = Field(default="", description="This node's name; default: the host name.")
    internal_url: str = Field(
        default="",
        description="How peers reach this node's internal engine endpoint (http://host:port); "
        "default: http://<host name>:<server.port>.",
    )
    internal_socket: Path | None = Field(
        default=None,
        description="Also serve the internal engine endpoint on this unix socket: processes on "
        'the same host reach the engine there (their internal_url "unix:<path>") without a copy '
        "of the model or a TCP hop. With `server.workers` > 1, where worker 0 serves its engine.",
    )
    secret: SecretStr | None = Field(
        default=None,
        description="Opens the internal endpoint (`x-node-secret`); the same on every node, 16 "
        "characters or more, environment only: `GATEWAY_CLUSTER__SECRET`.",
    )
    routing: Literal["prefix", "local"] = Field(
        default="prefix",
        description="`prefix`: serve where the prompt's prefix is cached; `local`: publish "
        "blocks, never forward.",
    )
    heartbeat_s: float = Field(
        default=0.5, gt=0, description="How often the node writes its liveness and load."
    )
    liveness_ttl_s: float = Field(
        default=3.0,
        gt=0,
        description="TTL of the liveness key (more than `heartbeat_s`): a node silent this long "
        "is dropped from the index.",
    )
    flush_s: float = Field(
        default=0.02,
        gt=0,
        description="How often stored and evicted blocks are appended to the node's event stream.",
    )
    snapshot_interval_s: float = Field(
        default=5.0,
        gt=0,
        description="How often the node writes a snapshot of its cached blocks, for nodes that "
        "join late or fall behind the trimmed stream.",
    )
    stream_maxlen: int = Field(
        default=100_000,
        gt=0,
        description="Entries the node's event stream keeps (approximately: older ones are "
        "trimmed).",
    )
    pending_s: float = Field(
        default=3.0,
        ge=0,
        description="The chosen node's blocks count as held there this long, so a burst of one "
        "new prefix is not scattered.",
    )
    waiting_cost_tokens: float = Field(
        default=512.0,
        ge=0,
        description="Placement cost of each request waiting on a node, in prompt tokens.",
    )
    running_token_weight: float = Field(
        default=0.02,
        ge=0,
        description="Placement cost of each token held by a node's running requests.",
    )
    forward_cost_tokens: float = Field(
        default=64.0, ge=0, description="Placement cost of forwarding to a peer, in prompt tokens."
    )
    forward_connect_timeout_s: float = Field(
        default=2.0,
        gt=0,
        description="Seconds to connect to a peer; one that cannot be reached is skipped and "
        "the request served here.",
    )
    forward_first_byte_timeout_s: float = Field(
        default=5.0,
        gt=0,
        description="A peer that sent nothing this long after a forward was sent (a frozen "
        "or partitioned peer, even on a kept-alive connection) is abandoned: the request is "
        "served here, and the peer is left out for liveness_ttl_s.",
    )
    forward_idle_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="A forwarded answer from which nothing came for this long (not even a "
        "keep-alive line) is abandoned: served here if nothing was generated yet, else the "
        "client's answer ends with an error in its protocol's format.",
    )
    forward_keepalive_s: float = Field(
        default=1.0,
        gt=0,
        description="The internal engine endpoint answers within this, then writes a "
        "keep-alive line whenever it wrote nothing for this long (a long prefill or a queue "
        "wait is not a silent peer). Below both forward deadlines.",
    )

    @model_validator(mode="after")
    def _check(self) -> ClusterSettings:
        if self.enabled and (self.secret is None or len(self.secret.get_secret_value()) < 16):
            raise ValueError("cluster.enabled needs GATEWAY_CLUSTER__SECRET (16+ characters)")
        if self.liveness_ttl_s <= self.heartbeat_s:
            raise ValueError("cluster.liveness_ttl_s must exceed cluster.heartbeat_s")
        deadline = min(self.forward_first_byte_timeout_s, self.forward_idle_timeout_s)
        if self.forward_keepalive_s >= deadline:
            raise ValueError(
                "cluster.forward_keepalive_s must be below cluster.forward_first_byte_timeout_s "
                "and cluster.forward_idle_timeout_s (a healthy peer would look silent)"
            )
        return self
