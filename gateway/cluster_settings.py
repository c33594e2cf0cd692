"""Settings of a node in a cluster (`[cluster]`). Part of the one settings object
(gateway/settings.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

_FROZEN = ConfigDict(frozen=True, extra="forbid")


class ClusterSettings(BaseModel):
    """Several nodes (gateway + engine) sharing one Redis; see gateway/cluster/.

    Routing cost of serving a prompt on node n, in prompt-token units (lowest wins, ties stay
    on this node): uncached prompt tokens on n + `waiting_cost_tokens` x requests waiting on n
    + `running_token_weight` x tokens held by n's running requests + `forward_cost_tokens` when
    n is a peer. A node without free blocks for the uncached part is skipped.
    """

    model_config = _FROZEN
    enabled: bool = False
    node_id: str = ""  # default: the host name
    # How peers reach this node's internal engine endpoint (http://host:port); default
    # http://<host name>:<server.port>.
    internal_url: str = ""
    # Also serve on this unix socket: processes on the same host reach the engine there
    # (their internal_url "unix:<path>"), without a copy of the model or a TCP hop.
    internal_socket: Path | None = None
    # Shared by every node, environment only: GATEWAY_CLUSTER__SECRET.
    secret: SecretStr | None = None
    # "prefix": serve where the prompt's prefix is cached; "local": publish blocks, never forward.
    routing: Literal["prefix", "local"] = "prefix"
    heartbeat_s: float = Field(
        default=0.5, gt=0, description="How often a node writes its liveness record and load."
    )
    liveness_ttl_s: float = Field(
        default=3.0,
        gt=0,
        description="A node whose liveness record is older than this is out of the cluster: "
        "peers stop placing prompts on it and drop its cached blocks from their index.",
    )
    flush_s: float = Field(default=0.02, gt=0)
    snapshot_interval_s: float = Field(default=5.0, gt=0)
    stream_maxlen: int = Field(default=100_000, gt=0)
    pending_s: float = Field(default=3.0, ge=0)
    waiting_cost_tokens: float = Field(default=512.0, ge=0)
    running_token_weight: float = Field(default=0.02, ge=0)
    forward_cost_tokens: float = Field(default=64.0, ge=0)
    forward_connect_timeout_s: float = Field(
        default=2.0, gt=0, description="Connecting to a peer for a forward, at most this."
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
