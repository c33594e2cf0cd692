"""Picks the engine that serves a prompt: this node's, or the peer holding its prefix.

The prompt's full blocks are hashed with the engine's own chain (seed and block size), scored
on every live node from the in-memory index and pending marks (`scoring`), and the chosen
node's blocks are marked pending. A forward goes to the peer's internal engine endpoint; if
that peer cannot be reached before anything was generated, the request is served here instead
and the peer is left out until its liveness would have expired.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, Callable, Sequence

import aiohttp

from backend.engine.block_hash import extend_chain
from backend.engine.interface import EngineOverloaded, RequestOutput
from backend.engine.request import FinishReason
from backend.engine.sampling_params import SamplingParams
from gateway.cluster.follower import IndexFollower
from gateway.cluster.scoring import NodeLoad, PendingMarks, Placement, Weights, place
from gateway.cluster_settings import ClusterSettings
from providers.engine_client import EngineClient
from providers.remote_engine import PeerUnreachable, RemoteEngine, split_base
from providers.types import RouteTrace


class ClusterPlacer:
    """`root`: the engine's hash chain root (`block_hash.root_hash(seed, block_size)`);
    `local_load()`: this node's load now (fresher than its published record)."""

    def __init__(
        self,
        node_id: str,
        root: bytes,
        block_size: int,
        local: EngineClient,
        local_load: Callable[[], NodeLoad],
        follower: IndexFollower,
        session: aiohttp.ClientSession,
        settings: ClusterSettings,
    ) -> None:
        self._node = node_id
        self._root = root
        self._block_size = block_size
        self._local = local
        self._local_load = local_load
        self._follower = follower
        self._session = session
        self._settings = settings
        self._secret = settings.secret.get_secret_value() if settings.secret else ""
        self._weights = Weights(
            waiting_cost_tokens=settings.waiting_cost_tokens,
            running_token_weight=settings.running_token_weight,
            forward_cost_tokens=settings.forward_cost_tokens,
        )
        self.pending = PendingMarks(settings.pending_s)
        self._suspects: dict[str, float] = {}  # peer -> left out until
        self._unix_sessions: dict[str, aiohttp.ClientSession] = {}

    @property
    def follower(self) -> IndexFollower:
        return self._follower

    def decide(self, prompt_ids: Sequence[int]) -> Placement:
        """Where `prompt_ids` is cheapest to serve now; marks its blocks pending there."""
        now = time.monotonic()
        hashes: list[bytes] = []
        extend_chain(hashes, self._root, prompt_ids, self._block_size)
        loads = {
            n: load
            for n, load in self._follower.loads(now).items()
            if self._suspects.get(n, 0.0) <= now
        }
        loads[self._node] = self._local_load()
        index = self._follower.index
        placement = place(
            self._node,
            hashes,
            len(prompt_ids),
            self._block_size,
            loads,
            self._weights,
            index.holders,
            self.pending.lookup(now),
        )
        if self._settings.routing == "local" and not placement.local:
            cached = index.prefix_blocks(hashes[: placement.prompt_blocks], [self._node])
            placement = Placement(self._node, True, cached[self._node], placement.prompt_blocks, 0)
        self.pending.mark(hashes[: placement.prompt_blocks], placement.node_id, now)
        return placement

    def place(self, prompt_ids: Sequence[int], trace: RouteTrace) -> EngineClient:
        placement = self.decide(prompt_ids)
        trace.placement = str(placement)
        if placement.local:
            return self._local
        record = self._follower.live(time.monotonic()).get(placement.node_id)
        if record is None:  # gone between scoring and now
            trace.placement = f"node={self._node}; via=fallback; tried={placement.node_id}"
            return self._local

        def unreachable() -> None:
            self._suspect(placement.node_id)
            trace.placement = f"node={self._node}; via=fallback; tried={placement.node_id}"

        return _Forwarded(
            RemoteEngine(*self._session_for(record.url), self._secret), self._local, unreachable
        )

    async def aclose(self) -> None:
        for session in self._unix_sessions.values():
            await session.close()
        self._unix_sessions.clear()

    def _session_for(self, url: str) -> tuple[aiohttp.ClientSession, str]:
        """The shared session for http peers; one session per unix socket path."""
        root, path = split_base(url)
        if path is None:
            return self._session, root
        session = self._unix_sessions.get(path)
        if session is None:
            connector = aiohttp.UnixConnector(path=path)
            session = self._unix_sessions[path] = aiohttp.ClientSession(connector=connector)
        return session, root

    def sweep(self) -> None:
        """Forget expired pending marks and suspicions (called periodically)."""
        now = time.monotonic()
        self.pending.sweep(now)
        self._suspects = {n: t for n, t in self._suspects.items() if t > now}

    def _suspect(self, node: str) -> None:
        self._suspects[node] = time.monotonic() + self._settings.liveness_ttl_s


class _Forwarded:
    """The peer's engine, falling back to the local one when the peer is unreachable or its
    queue is full (nothing was generated there)."""

    def __init__(
        self, remote: RemoteEngine, local: EngineClient, on_unreachable: Callable[[], None]
    ) -> None:
        self._remote = remote
        self._local = local
        self._on_unreachable = on_unreachable
        self._served_by: EngineClient = remote

    async def generate(
        self, request_id: str, prompt_ids: Sequence[int], params: SamplingParams
    ) -> AsyncGenerator[RequestOutput, None]:
        outputs = self._remote.generate(request_id, prompt_ids, params)
        try:
            try:
                first = await anext(outputs)
            except (PeerUnreachable, EngineOverloaded):
                self._on_unreachable()
                self._served_by = self._local
                fallback = self._local.generate(request_id, prompt_ids, params)
                try:
                    async for output in fallback:
                        yield output
                finally:
                    await fallback.aclose()
                return
            yield first
            async for output in outputs:
                yield output
        finally:
            await outputs.aclose()

    def finish(self, request_id: str, reason: FinishReason = "stop") -> None:
        self._served_by.finish(request_id, reason)
