"""Picks the engine that serves a prompt: this node's, or the peer holding its prefix.

The prompt's reusable blocks, hashed with the engine's own chain when the prompt was prepared
(`PreparedPrompt.block_hashes`), are scored on every live node (`scoring`): this node's cached
prefix from its own engine's block manager (exact, and fresher than its events coming back
through Redis), a peer's from the in-memory index, and every node's pending marks; the chosen
node's blocks are marked pending. A node's cached prefix is its longest on any one attention
rank (`gateway.cluster.index`). A forward sends the prompt alone, not the rank: the peer's
engine places it on its ranks by the same cost against its own pools (exact, and fresher than
the index), so it finds the rank holding the prefix itself. `fit` scores the same way without
marking, for the router's local-or-upstream choice, so the router and the placer see the same
engine and prefix. A forward goes to the peer's internal engine endpoint; if that peer cannot be
reached, or sends nothing within `forward_first_byte_timeout_s` (or `forward_idle_timeout_s`
between lines) before anything was generated, the request is served here instead and the peer is
left out until its liveness would have expired. A peer silent for `forward_idle_timeout_s` after
it generated something ends the request with an engine error (the client's answer ends with an
error).
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, Callable, Collection, Sequence

import aiohttp
import structlog

from backend.engine.interface import EngineOverloaded, RequestOutput
from backend.engine.request import FinishReason
from backend.engine.sampling_params import SamplingParams
from gateway.cluster.follower import IndexFollower
from gateway.cluster.scoring import NodeLoad, PendingMarks, Placement, Weights, place
from gateway.config.cluster import ClusterSettings
from providers.local.engine_client import EngineClient, EngineFit
from providers.local.remote_engine import (
    ForwardDeadlines,
    PeerUnreachable,
    RemoteEngine,
    split_base,
)

log = structlog.get_logger("gateway.cluster.placer")


class ClusterPlacer:
    """`local_load()`: this node's load now (fresher than its published record);
    `cached_prefix(hashes)`: how many leading blocks of that chain this node's engine holds."""

    def __init__(
        self,
        node_id: str,
        block_size: int,
        local: EngineClient,
        local_load: Callable[[], NodeLoad],
        cached_prefix: Callable[[Sequence[bytes]], int],
        follower: IndexFollower,
        session: aiohttp.ClientSession,
        settings: ClusterSettings,
    ) -> None:
        self._node = node_id
        self._own = (node_id,)
        self._block_size = block_size
        self._local = local
        self._local_load = local_load
        self._cached_prefix = cached_prefix
        self._follower = follower
        self._session = session
        self._settings = settings
        self._secret = settings.secret.get_secret_value() if settings.secret else ""
        self._weights = Weights(
            waiting_cost_tokens=settings.waiting_cost_tokens,
            running_token_weight=settings.running_token_weight,
            forward_cost_tokens=settings.forward_cost_tokens,
        )
        self._deadlines = ForwardDeadlines(
            settings.forward_first_byte_timeout_s, settings.forward_idle_timeout_s
        )
        self.pending = PendingMarks(settings.pending_s)
        self._suspects: dict[str, float] = {}  # peer -> left out until
        self._unix_sessions: dict[str, aiohttp.ClientSession] = {}

    @property
    def follower(self) -> IndexFollower:
        return self._follower

    def decide(self, num_tokens: int, hashes: Sequence[bytes]) -> Placement:
        """Where a prompt of `num_tokens` whose reusable blocks hash to `hashes` is cheapest
        to serve now; marks its blocks pending there."""
        now = time.monotonic()
        placement = self._score(num_tokens, hashes, now)[0]
        self.pending.mark(hashes[: placement.prompt_blocks], placement.node_id, now)
        return placement

    def fit(self, num_tokens: int, block_hashes: Sequence[bytes]) -> EngineFit:
        """What `decide` would choose now, without marking anything."""
        placement, loads = self._score(num_tokens, block_hashes, time.monotonic())
        cached = placement.cached_blocks * self._block_size
        if placement.local:
            return EngineFit(cached)
        return EngineFit(cached, placement.node_id, loads[placement.node_id].waiting)

    def _score(
        self, num_tokens: int, hashes: Sequence[bytes], now: float
    ) -> tuple[Placement, dict[str, NodeLoad]]:
        """The cheapest placement, and the loads it was scored on (this node's alone when
        `cluster.routing` is "local": publish, never forward)."""
        loads: dict[str, NodeLoad] = {}
        if self._settings.routing != "local":
            loads = {
                n: load
                for n, load in self._follower.loads(now).items()
                if self._suspects.get(n, 0.0) <= now
            }
        loads[self._node] = self._local_load()
        own = frozenset(hashes[: self._cached_prefix(hashes)])

        def own_blocks(block: bytes) -> Collection[str]:
            return self._own if block in own else ()

        lookups = (own_blocks, self._peer_blocks, self.pending.lookup(now))
        size = self._block_size
        ranked = self._follower.index.ranked_nodes
        placement = place(
            self._node, hashes, num_tokens, size, loads, self._weights, *lookups, ranked=ranked
        )
        return placement, loads

    def _peer_blocks(self, block: bytes) -> dict[str, int]:
        """The index's holders (with their ranks) but this node (whose own engine answers for
        it: `cached_prefix` is its longest prefix on any one rank)."""
        holders = self._follower.index.holders(block)
        if self._node not in holders:
            return holders
        return {n: mask for n, mask in holders.items() if n != self._node}

    def place(
        self,
        prompt_ids: Sequence[int],
        block_hashes: Sequence[bytes],
        on_fallback: Callable[[str], None],
    ) -> tuple[EngineClient, str]:
        placement = self.decide(len(prompt_ids), block_hashes)
        if placement.local:
            return self._local, str(placement)
        fell_back = f"node={self._node}; via=fallback; tried={placement.node_id}"
        record = self._follower.live(time.monotonic()).get(placement.node_id)
        if record is None:  # gone between scoring and now
            return self._local, fell_back

        def unreachable(why: Exception) -> None:
            self._suspect(placement.node_id)
            on_fallback(fell_back)
            log.warning("cluster_forward_fell_back", peer=placement.node_id, error=str(why))

        session, root = self._session_for(record.url)
        remote = RemoteEngine(session, root, self._secret, self._deadlines)
        return _Forwarded(remote, self._local, unreachable), str(placement)

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

    def left_out(self, now: float) -> frozenset[str]:
        """The peers not placed on now: a forward to them failed within their liveness TTL."""
        return frozenset(n for n, until in self._suspects.items() if until > now)

    def _suspect(self, node: str) -> None:
        self._suspects[node] = time.monotonic() + self._settings.liveness_ttl_s


class _Forwarded:
    """The peer's engine, falling back to the local one when the peer is unreachable or its
    queue is full (nothing was generated there)."""

    def __init__(
        self,
        remote: RemoteEngine,
        local: EngineClient,
        on_unreachable: Callable[[Exception], None],
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
            except (PeerUnreachable, EngineOverloaded) as exc:
                self._on_unreachable(exc)
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
