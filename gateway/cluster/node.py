"""This gateway process as a member of the cluster: its id, address, and, once the local engine
is up, the publisher, the index follower and the placer around that engine."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

import aiohttp
from redis.asyncio import Redis

from gateway.cluster.keys import ClusterKeys
from gateway.cluster.publisher import BlockEventBuffer
from gateway.config.cluster import ClusterSettings
from gateway.config.settings import Settings

if TYPE_CHECKING:
    from backend.engine.async_engine import AsyncEngine
    from gateway.cluster.placer import ClusterPlacer


class ClusterNode:
    """Opened by the app when `cluster.enabled`; `serve_engine` joins with the local engine.
    The engine's block events go to `buffer.push` (pass it as the engine's `on_block_event`)."""

    unix_only = False  # peers reach the internal endpoint over TCP

    def __init__(self, redis: Redis, settings: Settings, session: aiohttp.ClientSession) -> None:
        cluster = settings.cluster
        host = socket.gethostname()
        self.node_id = cluster.node_id or host
        self.url = cluster.internal_url or f"http://{host}:{settings.server.port}"
        self.settings: ClusterSettings = cluster
        self.secret = cluster.secret.get_secret_value() if cluster.secret else ""
        self.buffer = BlockEventBuffer()
        self.engine: AsyncEngine | None = None
        self.placer: ClusterPlacer | None = None
        self._redis = redis
        self._keys = ClusterKeys(settings.redis.key_prefix)
        self._session = session

    @asynccontextmanager
    async def serve_engine(self, engine: AsyncEngine) -> AsyncIterator[ClusterPlacer]:
        """Publish the engine's blocks, follow everyone's, and place prompts, until exit."""
        if self.engine is not None:
            raise RuntimeError("a cluster node serves one local engine")
        # Imported here: the placer reaches engines (torch), which an upstream-only gateway
        # never loads.
        from gateway.cluster.join import join_cluster

        async with join_cluster(self, engine, self._redis, self._keys, self._session) as placer:
            self.engine, self.placer = engine, placer
            try:
                yield placer
            finally:
                self.engine = self.placer = None


@asynccontextmanager
async def open_cluster(redis: Redis, settings: Settings) -> AsyncIterator[ClusterNode | None]:
    """This process's cluster membership when `cluster.enabled` (None otherwise), with the
    HTTP session its forwards use."""
    if not settings.cluster.enabled:
        yield None
        return
    timeout = aiohttp.ClientTimeout(
        total=None, sock_connect=settings.cluster.forward_connect_timeout_s
    )
    async with aiohttp.ClientSession(timeout=timeout) as session:
        yield ClusterNode(redis, settings, session)
