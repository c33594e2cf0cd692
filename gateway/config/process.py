"""The serving process's own sections: `[server]` (address, slow-client timeouts, streams,
workers), `[redis]` and `[logging]`."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from gateway.config.frozen import FROZEN
from plumbing.busy_wait import Spin


class ServerSettings(BaseModel):
    model_config = FROZEN
    host: str = Field(default="127.0.0.1", description="Address to listen on.")
    port: int = Field(default=8000, ge=0, le=65535, description="TCP port to listen on.")
    grace_period_s: float = Field(
        default=10.0,
        ge=0,
        description="On SIGTERM or SIGINT, streams in progress may finish within this many "
        "seconds before the process stops.",
    )
    max_body_bytes: int = Field(
        default=8 * 1024 * 1024,
        gt=0,
        description="Largest request body accepted; a larger one is a 413, refused by its "
        "declared Content-Length before any of it is read.",
    )
    stream_headers_after_s: float = Field(
        default=2.0,
        gt=0,
        description="A stream with no first event after this many seconds gets its headers and "
        "opening frames at once. Before that, a failing route falls back unseen and an error "
        "keeps its HTTP status; after it, errors arrive in the stream (routes still fall back "
        "until the first token).",
    )
    keepalive_s: float = Field(
        default=5.0,
        gt=0,
        description="A stream silent for this many seconds gets a keep-alive frame (an SSE "
        "comment; a `response.in_progress` event on /v1/responses; `ping` on /v1/messages). "
        "Keep it below clients' read timeouts.",
    )
    workers: int = Field(
        default=1,
        ge=1,
        le=256,
        description="Serving processes on one port (SO_REUSEPORT). With a local engine, worker 0 "
        "loads it and the others reach it over a unix socket. Not with `cluster.enabled`.",
    )
    run_dir: Path = Field(
        default=Path(".data/run"),
        description="With workers > 1: where worker 0's engine socket (`engine-<port>.sock`) "
        "goes, unless `cluster.internal_socket` names one.",
    )
    engine_poll_s: float = Field(
        default=0.1,
        gt=0,
        description="With workers > 1: how often workers 1..N-1 ask worker 0's engine for its "
        "load and liveness (routing's queue signal and /readyz read the latest answer).",
    )
    request_head_timeout_s: float = Field(
        default=60.0,
        gt=0,
        description="A connection that has not sent a whole request head this long after it "
        "opened, or after its last answer, is closed without an answer (idle keep-alive "
        "connections too).",
    )
    request_body_timeout_s: float = Field(
        default=60.0,
        gt=0,
        description="A request's body must arrive within this many seconds of its head, "
        "else a 408 `request_timeout`.",
    )
    write_stall_timeout_s: float = Field(
        default=60.0,
        gt=0,
        description="A client that reads nothing of a stream for this long is disconnected; its "
        "request is recorded as 499 and its slot and reservation freed.",
    )
    busy_wait_us: int = Field(
        default=200,
        ge=0,
        le=10_000,
        description="While at most `busy_wait_max_waiting` answers are awaited (Redis's replies "
        "to admissions and settlements; the answers of upstreams whose provider sets "
        "`busy_wait`), the event loop polls for each this many microseconds instead of "
        "sleeping: an idle virtual CPU takes longer to wake than Redis or a nearby upstream "
        "takes to answer. 0: always sleep. Never in the process "
        "that runs the embedded engine (its threads want the CPU).",
    )
    busy_wait_max_waiting: int = Field(
        default=4,
        ge=1,
        description="The most answers awaited at once for which the event loop still polls "
        "(`busy_wait_us`); with more, the loop is busy anyway. Every upstream's answers count, "
        "polled for or not.",
    )
    gc_young_threshold: int = Field(
        default=10_000,
        ge=100,
        description="Once a serving process is up, what it built to start is frozen out of the "
        "garbage collector's scans (gc.freeze), and a young collection runs after this many more "
        "container objects were allocated than freed (Python's default is 700, which under "
        "dozens of requests in flight collects every few requests).",
    )

    @property
    def spin(self) -> Spin:
        """busy_wait_us and busy_wait_max_waiting as `BusyWait` takes them."""
        return Spin(self.busy_wait_us / 1e6, self.busy_wait_max_waiting)


class RedisSettings(BaseModel):
    model_config = FROZEN
    url: str = Field(
        default="redis://127.0.0.1:6379/0",
        description="The Redis every replica shares (keys, limits, usage, stickiness, the "
        "cluster index). Credentials in it are masked in logs and errors.",
    )
    embedded: bool = Field(
        default=True,
        description="Start a private redis-server (append-only persistence under `data_dir`) "
        "when `url` is unreachable, and stop it on exit.",
    )
    data_dir: Path = Field(
        default=Path(".data/redis"), description="Where the embedded redis-server keeps its data."
    )
    key_prefix: str = Field(
        default="gw:", description="Prefix of every Redis key the gateway uses."
    )
    max_connections: int = Field(
        default=128,
        gt=0,
        description="Pooled connections per process for key lookups and the admin API; callers "
        "wait for a free one up to `timeout_s`.",
    )
    timeout_s: float = Field(
        default=5.0,
        gt=0,
        description="Every call to Redis (key lookups, admission, settlement, the admin API) "
        "fails after this many seconds: the request gets a 503 `state_store_unavailable`.",
    )
    start_timeout_s: float = Field(
        default=60.0,
        gt=0,
        description="How long start-up waits for a Redis that is loading its data (a large "
        "append-only file).",
    )


class LoggingSettings(BaseModel):
    model_config = FROZEN
    format: Literal["json", "console"] = Field(
        default="console",
        description="`json`: one JSON object per line (production); `console`: for people.",
    )
    level: Literal["debug", "info", "warning", "error"] = Field(
        default="info", description="The least severe level written."
    )
