"""Open the embedded engine as a provider (this module imports torch; the provider factory
imports it only when a provider of kind "local" is configured)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

from backend.engine.engine_config import EngineConfig
from gateway.engine_metrics import register_engine_metrics
from gateway.metrics import Metrics
from gateway.settings import EngineSettings
from providers.local import LocalProvider
from providers.local_setup import default_device, open_local_provider


def engine_config(engine: EngineSettings) -> EngineConfig:
    return EngineConfig(
        max_num_seqs=engine.max_num_seqs,
        max_batch_tokens=engine.max_batch_tokens,
        block_size=engine.block_size,
        cache_memory_bytes=engine.cache_memory_mb * 1024 * 1024,
        chunked_prefill=engine.chunked_prefill,
        max_waiting=engine.max_waiting,
        dtype=engine.dtype,
        device=default_device() if engine.device == "auto" else engine.device,
        num_threads=engine.num_threads,
    )


@asynccontextmanager
async def open_local_engine(
    name: str, engine: EngineSettings, metrics: Metrics
) -> AsyncIterator[LocalProvider]:
    """The started local provider, its engine stats exported as Prometheus gauges."""
    async with AsyncExitStack() as stack:
        local = await stack.enter_async_context(
            open_local_provider(
                name,
                engine_config(engine),
                model_path=engine.model_path,
                demo_dir=engine.demo_dir,
                demo_preset=engine.demo_preset,
            )
        )
        stack.callback(register_engine_metrics(metrics.registry, name, local.engine_stats))
        yield local
