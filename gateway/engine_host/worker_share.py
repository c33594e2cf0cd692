"""One local engine for `[server] workers = N`: worker 0 loads it, the others reach it.

Worker 0 opens the engine as a single-process gateway does and serves it to the other workers
on the cluster's internal endpoint (gateway/cluster/internal.py: `POST /internal/engine/generate`,
prompt ids in, RequestOutputs out as JSON lines, authenticated by `cluster.secret`), bound to
the unix socket `cluster.internal_socket` only; `GET /internal/engine` (here) says what it
serves (checkpoint directory, limits) and how busy it is. The supervisor (gateway/server/workers.py)
draws the secret when none is set and names the socket under `server.run_dir`.

Workers 1..N-1 load no weights and import no torch: each tokenizes and renders the chat template
itself, off its event loop, from the checkpoint directory worker 0 announces, parses the output
and counts usage (`LocalProvider` over `providers.local.worker_engine.SharedEngine`); only prompt
ids and generated ids cross the socket. Load and liveness are polled every `server.engine_poll_s`.

Why this transport, and the engine in worker 0:
- The node-to-node path exists, is tested (aborts on disconnect, errors before and after the
  first token, overload as 503 with Retry-After) and is what cluster peers already use; over a
  unix socket it is a local hop (one connection and a JSON line per engine step), while the
  tokenizing, templating and parsing stay in the worker that got the request.
- Shared memory (a ring of ids per request) would save that hop but needs its own framing,
  wake-ups, abort and death detection; a closed socket gives all three for free (a dead worker
  0 is a reset connection, never a hang).
- The engine in the supervisor, or in a process of its own, would send every request over the
  socket (worker 0's own included) and add a process whose death must also stop the others;
  in worker 0 it keeps the one-process path for 1/N of the traffic and the supervisor's rule
  (one worker exits: all stop) already covers the engine's death.
The cost of that choice: worker 0's event loop shares a GIL with the engine's step thread, and
worker 0 also answers the other workers' engine calls. Measured on 2 CPU cores with the tiny
demo model (benchmarks/workers_engine.py), the engine's step thread is the bottleneck of short
local-engine requests, so a second worker does not raise their rate; it helps where the serving
work is (upstream traffic, long prompts to tokenize, an engine on a GPU).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

from aiohttp import web

from gateway.cluster.internal import engine_host
from gateway.config.settings import Settings
from gateway.errors import NotFound, ServiceUnavailable
from gateway.observability.engine_metrics import register_engine_metrics
from gateway.observability.metrics import Metrics
from gateway.server.middleware import QUIET
from plumbing.record import record
from providers.base import Provider
from providers.local.deferred import DeferredLocalProvider
from providers.local.engine_client import ServedEngine
from providers.local.worker_engine import (
    ENGINE_PATH,
    EngineInfo,
    SharedLocalProvider,
    connect_worker_engine,
)


@record
class EngineShare:
    """Worker 0's engine as the internal endpoint serves it (an `EngineHost`)."""

    secret: str
    provider: DeferredLocalProvider  # worker 0's own, loading until its engine is up
    unix_only: bool = True  # the other workers are on this host

    @property
    def engine(self) -> ServedEngine | None:
        local = self.provider.local
        return local.engine if local is not None else None


def engine_share(settings: Settings, providers: dict[str, Provider]) -> EngineShare:
    """Worker 0's share of its local provider's engine."""
    (name,) = settings.local_providers()
    provider = providers[name]
    if not isinstance(provider, DeferredLocalProvider):
        raise TypeError(f"provider {name!r} is not an in-process engine")
    return EngineShare(_secret(settings), provider)


@asynccontextmanager
async def open_worker_engine_client(
    name: str, settings: Settings, metrics: Metrics
) -> AsyncIterator[SharedLocalProvider]:
    """A worker's provider over worker 0's engine, its polled stats as Prometheus gauges."""
    socket_path = settings.cluster.internal_socket
    if socket_path is None:
        raise ValueError("workers without the engine need cluster.internal_socket")
    async with AsyncExitStack() as stack:
        provider = await stack.enter_async_context(
            connect_worker_engine(
                name, socket_path, _secret(settings), poll_s=settings.server.engine_poll_s
            )
        )
        stack.callback(register_engine_metrics(metrics.registry, name, provider.engine_stats))
        yield provider


def _secret(settings: Settings) -> str:
    secret = settings.cluster.secret
    if secret is None:
        raise ValueError("workers sharing an engine need cluster.secret (the supervisor sets it)")
    return secret.get_secret_value()


async def engine_info(request: web.Request) -> web.Response:
    """`GET /internal/engine`: the shared engine's checkpoint, limits, liveness and stats."""
    host = engine_host(request)
    if not isinstance(host, EngineShare):
        raise NotFound("Not found")
    request[QUIET] = True
    local = host.provider.local
    if local is None:
        loading = host.provider.loading() or "failed to load"
        raise ServiceUnavailable(f"The engine is not ready: {loading}.", code="engine_loading")
    body = EngineInfo.of(local).to_json()
    return web.Response(body=body, content_type="application/json")


def routes() -> list[web.RouteDef]:
    return [web.get(ENGINE_PATH, engine_info)]
