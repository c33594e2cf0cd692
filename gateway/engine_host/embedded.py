"""Open the embedded engine as a provider (this module imports torch; the provider factory
imports it only when a provider of kind "local" is configured)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from functools import partial

from gateway.cluster.join import serve_engine
from gateway.cluster.node import ClusterNode
from gateway.config.engine import EngineSettings
from gateway.observability.engine_metrics import register_engine_metrics
from gateway.observability.metrics import Metrics
from providers.local.provider import LocalProvider
from providers.local.setup import load_local_provider


@asynccontextmanager
async def open_embedded_engine(
    name: str, engine: EngineSettings, metrics: Metrics, cluster: ClusterNode | None = None
) -> AsyncIterator[LocalProvider]:
    """The started local provider, its engine stats exported as Prometheus gauges; with a
    cluster node, its blocks are published and prompts go where their prefix is cached."""
    async with AsyncExitStack() as stack:
        local = await stack.enter_async_context(
            load_local_provider(
                name,
                engine.config,
                model_path=engine.model_path,
                demo_dir=engine.demo_dir,
                demo_preset=engine.demo_preset,
                demo_trained=engine.demo_weights == "trained",
                on_block_event=cluster.buffer.push if cluster else None,
                open_placer=partial(serve_engine, cluster) if cluster else None,
            )
        )
        stack.callback(register_engine_metrics(metrics.registry, name, local.engine_stats))
        yield local
