"""Open the configured providers for the life of the app, and close them on exit.

`open_providers` yields one Provider per live provider in settings (`Settings.live_providers`):
kind "openai" -> `OpenAIUpstream`, kind "anthropic" -> `AnthropicUpstream`, kind "local" -> the
embedded engine (`gateway.engine_host.embedded`, whose engine stats also become Prometheus gauges
in the app's registry), or, in workers 1..N-1 of `[server] workers`, worker 0's engine reached over
its socket (`gateway.engine_host.worker_share`). An upstream's egress proxy is resolved here, from
its settings or the environment; it polls for its answers with the process's `BusyWait` only when
its `busy_wait` setting says so (the Redis calls always do); the others' answers count toward
the wait's bound all the same (`plumbing.busy_wait.counting`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager

import structlog

from gateway.cluster.node import ClusterNode
from gateway.config.providers import ProviderSettings
from gateway.config.settings import Settings
from gateway.observability.metrics import Metrics
from plumbing.busy_wait import BusyWait, counting
from providers.base import Provider
from providers.upstream.anthropic import AnthropicUpstream
from providers.upstream.openai import OpenAIUpstream, UpstreamConfig

log = structlog.get_logger("gateway.providers")


def upstream_config(name: str, settings: ProviderSettings) -> UpstreamConfig:
    return UpstreamConfig(
        name=name,
        base_url=settings.base_url,
        api_key=settings.api_key(),
        accounts=settings.accounts(),
        thinking_style=settings.thinking_style,
        send_reasoning_history=settings.send_reasoning_history,
        connect_timeout_s=settings.connect_timeout_s,
        first_byte_timeout_s=settings.first_byte_timeout_s,
        idle_timeout_s=settings.idle_timeout_s,
        answer_timeout_s=settings.answer_timeout_s,
        stream_upstream=settings.stream_upstream,
        max_connections=settings.max_connections,
        headers=dict(settings.headers),
        max_answer_headers=settings.max_answer_headers,
        max_header_field_bytes=settings.max_header_field_bytes,
        max_answer_bytes=settings.max_answer_bytes,
        pool_idle_timeout_s=settings.pool_idle_timeout_s,
        tcp_keepalive_s=settings.tcp_keepalive_s,
        proxy=settings.proxy_url(os.environ),
        fim=settings.fim,
        total_timeout_s=settings.total_timeout_s,
        ca_file=None if settings.ca_file is None else str(settings.ca_file),
    )


@asynccontextmanager
async def open_providers(
    settings: Settings,
    metrics: Metrics,
    cluster: ClusterNode | None = None,
    *,
    worker: int = 0,
    busy: BusyWait | None = None,
    on_engine_failure: Callable[[BaseException], None] | None = None,
) -> AsyncIterator[dict[str, Provider]]:
    """One opened Provider per live provider, by name; all are closed when the context exits
    (a local engine is stopped, its metrics collector removed). `worker`: this serving
    process's index; only worker 0 loads a local engine. `busy`: the process's `BusyWait`,
    which the upstreams whose `busy_wait` is set wait for their answers with (the others'
    answers count toward its bound without polling). A local engine
    is yielded while it loads (gateway/engine_host/embedded.py); `on_engine_failure` hears of
    a load that failed."""
    live, skipped = settings.live_providers()
    log.info(
        "providers_live",
        live={name: p.kind for name, p in live.items()},
        skipped=skipped,
    )
    providers: dict[str, Provider] = {}
    async with AsyncExitStack() as stack:
        for name, provider_settings in live.items():
            if provider_settings.kind == "local" and settings.shares_engine and worker > 0:
                # Imported here: the tokenizer, which a gateway of upstreams never needs.
                from gateway.engine_host.worker_share import open_worker_engine_client

                providers[name] = await stack.enter_async_context(
                    open_worker_engine_client(name, settings, metrics)
                )
            elif provider_settings.kind == "local":
                # Imported here: it loads torch, which a gateway of upstreams never needs.
                from gateway.engine_host.embedded import open_embedded_engine

                providers[name] = await stack.enter_async_context(
                    open_embedded_engine(
                        name,
                        settings.engine,
                        metrics,
                        cluster,
                        bar=settings.logging.format == "console" and sys.stderr.isatty(),
                        on_failure=on_engine_failure,
                    )
                )
            else:
                config = upstream_config(name, provider_settings)
                anthropic = provider_settings.kind == "anthropic"
                # The others' answers count (a process awaiting many is busy) but start no spin.
                spin = busy if provider_settings.busy_wait or busy is None else counting(busy)
                upstream = (AnthropicUpstream if anthropic else OpenAIUpstream)(config, busy=spin)
                stack.push_async_callback(upstream.close)
                await upstream.open()
                providers[name] = upstream
        yield providers
