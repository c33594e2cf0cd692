"""Typed keys for the resources the app factory opens in `cleanup_ctx` (no module singletons)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

from aiohttp import web
from redis.asyncio import Redis

from gateway.access.contract import AccessControl
from gateway.cluster.node import ClusterNode
from gateway.config.settings import Settings
from gateway.observability.metrics import Metrics
from gateway.pipeline.pipeline import Pipeline
from gateway.routing import Router
from gateway.routing.breaker import Breakers
from gateway.usage_store.store import UsageStore
from gateway.wire.thinking_signature import ThinkingSigner
from providers.local.engine_client import EngineClient


class EngineHost(Protocol):
    """Whoever serves this process's engine on the internal endpoint (gateway/cluster/
    internal.py): the cluster node, or worker 0 of `[server] workers`
    (gateway/engine_host/worker_share.py).
    """

    @property
    def secret(self) -> str: ...

    @property
    def engine(self) -> EngineClient | None: ...

    @property
    def unix_only(self) -> bool:
        """Answer on the unix socket only (the public TCP port says 404)."""
        ...


SETTINGS = web.AppKey("settings", Settings)
REDIS = web.AppKey("redis", Redis)
ACCESS = web.AppKey("access", AccessControl)
ROUTER = web.AppKey("router", Router)
METRICS = web.AppKey("metrics", Metrics)
PIPELINE = web.AppKey("pipeline", Pipeline)
BREAKERS = web.AppKey("breakers", Breakers)
SIGNER = web.AppKey("thinking_signer", ThinkingSigner)
CLUSTER = web.AppKey("cluster", ClusterNode)
WORKER = web.AppKey("worker", int)  # which serving process this is (gateway/server/workers.py)
ENGINE_HOST = web.AppKey[EngineHost]("engine_host")
USAGE_STORE = web.AppKey("usage_store", UsageStore)  # only with `[usage] enabled`
# What the serving process does when a resource fails after it started listening (a local
# engine's load): it stops, with a failure status (gateway/server/serve.py). Absent: logged only.
ON_FATAL = web.AppKey[Callable[[BaseException], None]]("on_fatal")
# Set when the serving process was told to stop: /readyz answers 503 from then on.
DRAINING = web.AppKey("draining", asyncio.Event)
