"""This gateway process as a member of the cluster: its id, address, and, once the local engine
is up, the publisher, the index follower and the placer around that engine."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
from redis.asyncio import Redis

from gateway.cluster.keys import ClusterKeys
from gateway.cluster.placer import ClusterPlacer
from gateway.cluster.publisher import BlockEventBuffer
from gateway.config.cluster import ClusterSettings
from gateway.config.settings import Settings
from providers.local.engine_client import ServedEngine


class ClusterNode:
    """Opened by the app when `cluster.enabled`; `gateway.cluster.join.serve_engine` joins it
    with the local engine. The engine's block events go to `buffer.push` (pass it as the
    engine's `on_block_event`)."""

    unix_only = False  # peers reach the internal endpoint over TCP

    def __init__(self, redis: Redis, settings: Settings, session: aiohttp.ClientSession) -> None:
        cluster = settings.cluster
        host = socket.gethostname()
        self.node_id = cluster.node_id or host
        self.url = cluster.internal_url or f"http://{host}:{settings.server.port}"
        self.settings: ClusterSettings = cluster
        self.secret = cluster.secret.get_secret_value() if cluster.secret else ""
        self.buffer = BlockEventBuffer()
        self.engine: ServedEngine | None = None  # set while gateway/cluster/join.py serves one
        self.placer: ClusterPlacer | None = None
        self.redis = redis
        self.keys = ClusterKeys(settings.redis.key_prefix)
        self.session = session


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
