"""Open the configured providers for the life of the app, and close them on exit.

`open_providers` yields one Provider per live provider in settings (`Settings.live_providers`):
kind "openai" -> `OpenAIUpstream`, kind "local" -> the embedded engine (`open_local_provider`,
whose engine stats also become Prometheus gauges in the app's registry).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import structlog

from backend.engine_config import EngineConfig
from gateway.engine_metrics import register_engine_metrics
from gateway.metrics import Metrics
from gateway.settings import EngineSettings, ProviderSettings, Settings
from providers.base import Provider
from providers.local_setup import default_device, open_local_provider
from providers.openai_upstream import OpenAIUpstream, UpstreamConfig

log = structlog.get_logger("gateway.providers")


def upstream_config(name: str, settings: ProviderSettings) -> UpstreamConfig:
    return UpstreamConfig(
        name=name,
        base_url=settings.base_url,
        api_key=settings.api_key(),
        thinking_style=settings.thinking_style,
        send_reasoning_history=settings.send_reasoning_history,
        connect_timeout_s=settings.connect_timeout_s,
        first_byte_timeout_s=settings.first_byte_timeout_s,
        idle_timeout_s=settings.idle_timeout_s,
        max_connections=settings.max_connections,
        headers=dict(settings.headers),
    )


def engine_config(engine: EngineSettings, device: str) -> EngineConfig:
    return EngineConfig(
        max_num_seqs=engine.max_num_seqs,
        max_batch_tokens=engine.max_batch_tokens,
        block_size=engine.block_size,
        cache_memory_bytes=engine.cache_memory_mb * 1024 * 1024,
        chunked_prefill=engine.chunked_prefill,
        max_waiting=engine.max_waiting,
        dtype=engine.dtype,
        device=device,
        num_threads=engine.num_threads,
    )


@asynccontextmanager
async def open_providers(
    settings: Settings, metrics: Metrics
) -> AsyncIterator[dict[str, Provider]]:
    """One opened Provider per live provider, by name; all are closed when the context exits
    (a local engine is stopped, its metrics collector removed)."""
    live, skipped = settings.live_providers()
    log.info(
        "providers_live",
        live={name: p.kind for name, p in live.items()},
        skipped=skipped,
    )
    providers: dict[str, Provider] = {}
    async with AsyncExitStack() as stack:
        for name, provider_settings in live.items():
            if provider_settings.kind == "local":
                engine = settings.engine
                local = await stack.enter_async_context(
                    open_local_provider(
                        name,
                        engine_config(engine, default_device()),
                        model_path=engine.model_path,
                        demo_dir=engine.demo_dir,
                        demo_preset=engine.demo_preset,
                    )
                )
                stack.callback(register_engine_metrics(metrics.registry, name, local.engine_stats))
                providers[name] = local
            else:
                upstream = OpenAIUpstream(upstream_config(name, provider_settings))
                stack.push_async_callback(upstream.close)
                await upstream.open()
                providers[name] = upstream
        yield providers
