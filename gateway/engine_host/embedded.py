"""Open the embedded engine as a provider (this module imports torch; the provider factory
imports it only when a provider of kind "local" is configured).

The provider is yielded at once, loading (`providers.local.deferred`): the gateway listens and
serves its upstream routes while the engine's checkpoint is built (the demo, under its lock) or
loaded in the background; local routes answer 503 `engine_loading` and /readyz says how far the
load is. A load that fails is logged (`engine_load_failed`), reported by /readyz's
`engines_down`, and handed to `on_failure` (the serving process stops on it).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial

import structlog

from gateway.cluster.join import serve_engine
from gateway.cluster.node import ClusterNode
from gateway.config.engine import EngineSettings
from gateway.observability.engine_metrics import register_engine_metrics
from gateway.observability.metrics import Metrics
from providers.local.deferred import DeferredLocalProvider
from providers.local.demo_build import BuildCancelled
from providers.local.setup import check_checkpoint, load_local_provider

log = structlog.get_logger("gateway.engine_host")


@asynccontextmanager
async def open_embedded_engine(
    name: str,
    engine: EngineSettings,
    metrics: Metrics,
    cluster: ClusterNode | None = None,
    *,
    bar: bool | None = None,
    on_failure: Callable[[BaseException], None] | None = None,
) -> AsyncIterator[DeferredLocalProvider]:
    """The local provider, loading until its engine is up (see the module); its engine stats
    are exported as Prometheus gauges; with a cluster node, its blocks are published and
    prompts go where their prefix is cached. A bad model path or preset is refused here, at
    once. `bar`: the demo training's progress bar (default: where stderr is a terminal)."""
    check_checkpoint(engine.model_path, engine.demo_preset)
    provider = DeferredLocalProvider(name)
    stop = asyncio.Event()
    cancelled = threading.Event()
    task = asyncio.create_task(
        _serve(
            provider,
            engine,
            metrics,
            cluster,
            stop,
            cancelled,
            sys.stderr.isatty() if bar is None else bar,
            on_failure,
        ),
        name=f"engine-load-{name}",
    )
    try:
        yield provider
    finally:
        cancelled.set()  # a demo still training gives up at its next step
        stop.set()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _serve(
    provider: DeferredLocalProvider,
    engine: EngineSettings,
    metrics: Metrics,
    cluster: ClusterNode | None,
    stop: asyncio.Event,
    cancelled: threading.Event,
    bar: bool,
    on_failure: Callable[[BaseException], None] | None,
) -> None:
    """Load the engine, serve it through `provider` until `stop`, then stop it."""
    name = provider.name
    try:
        async with load_local_provider(
            name,
            engine.config,
            model_path=engine.model_path,
            demo_dir=engine.demo_dir,
            demo_preset=engine.demo_preset,
            demo_trained=engine.demo_weights == "trained",
            on_block_event=cluster.buffer.push if cluster else None,
            open_placer=partial(serve_engine, cluster) if cluster else None,
            progress=provider.progress,
            cancelled=cancelled,
            bar=bar,
        ) as local:
            unregister = register_engine_metrics(metrics.registry, name, local.engine_stats)
            provider.set_local(local)
            log.info("engine_ready", provider=name)
            try:
                await stop.wait()
            finally:
                unregister()
    except BuildCancelled:
        log.info("engine_load_given_up", provider=name)
    except Exception as exc:  # a failed load is reported, and stops the process
        provider.fail(f"{type(exc).__name__}: {exc}")
        log.error("engine_load_failed", provider=name, error=f"{type(exc).__name__}: {exc}")
        if on_failure is not None:
            on_failure(exc)
