"""The app factory: builds the aiohttp application and opens its resources in `cleanup_ctx`."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack

import structlog
from aiohttp import web

from gateway import handlers
from gateway.access.contract import AccessControl
from gateway.access.open import OpenAccess
from gateway.admin.api import setup_admin
from gateway.admin.console.web import setup_console
from gateway.cluster.membership import register_cluster_metrics
from gateway.cluster.node import open_cluster
from gateway.config.settings import Settings
from gateway.keys.redis_access import RedisAccessControl
from gateway.observability.metrics import Metrics
from gateway.openapi import setup_openapi
from gateway.pipeline.output_limits import OutputLimits
from gateway.pipeline.pipeline import Pipeline
from gateway.provider_factory import open_providers
from gateway.resources import (
    ACCESS,
    BREAKERS,
    CLUSTER,
    DRAINING,
    ENGINE_HOST,
    METRICS,
    ON_FATAL,
    PIPELINE,
    REDIS,
    ROUTER,
    SETTINGS,
    SIGNER,
    USAGE_STORE,
    WORKER,
)
from gateway.routing import Router
from gateway.routing.breaker import Breakers
from gateway.routing.decide import Decider
from gateway.routing.explain import add_route_header
from gateway.routing.plan import RoutePlanner
from gateway.routing.sticky import Stickiness
from gateway.server.middleware import add_request_id, error_middleware
from gateway.server.redis_server import open_redis
from gateway.server.sse_stream import KeepAlive
from gateway.usage_store.pricing import Pricing
from gateway.usage_store.service import open_usage_store
from gateway.wire.thinking_signature import ThinkingSigner
from plumbing.busy_wait import NO_SPIN, BusyWait, Spin

log = structlog.get_logger("gateway.app")


def create_app(settings: Settings, *, worker: int = 0) -> web.Application:
    """`worker`: this process's index among `server.workers` (reported by /healthz)."""
    app = web.Application(
        middlewares=[error_middleware], client_max_size=settings.server.max_body_bytes
    )
    app[SETTINGS] = settings
    app[WORKER] = worker
    app[METRICS] = Metrics()
    app[SIGNER] = thinking_signer(settings)
    app[DRAINING] = asyncio.Event()
    app.on_response_prepare.append(add_request_id)
    app.on_response_prepare.append(add_route_header)
    app.cleanup_ctx.append(_resources)
    app.add_routes(handlers.routes())
    shares_engine = settings.shares_engine and worker == 0
    if settings.cluster.enabled or shares_engine:
        # Imported here: the internal engine endpoint reaches the engine, which a gateway of
        # upstreams never loads.
        from gateway.cluster import internal

        app.add_routes(internal.routes())
    if shares_engine:
        from gateway.engine_host import worker_share as engine_share

        app.add_routes(engine_share.routes())
    setup_console(app, settings)
    setup_admin(app, settings)
    setup_openapi(app)
    return app


def thinking_signer(settings: Settings) -> ThinkingSigner:
    secret = settings.messages.signing_secret
    if secret is None:
        log.warning(
            "thinking_signing_secret_unset",
            hint="set GATEWAY_MESSAGES__SIGNING_SECRET so thinking signatures survive restarts",
        )
        return ThinkingSigner()
    return ThinkingSigner(secret.get_secret_value().encode())


def spin_for(settings: Settings, worker: int) -> Spin:
    """How a serving process waits for Redis's and the upstreams' answers (`[server]
    busy_wait_us`): polling, but not in the process that runs the embedded engine, whose
    threads want the CPU more and whose answers take far longer than Redis's."""
    if worker == 0 and settings.local_providers():
        return NO_SPIN
    return settings.server.spin


async def _resources(app: web.Application) -> AsyncIterator[None]:
    settings = app[SETTINGS]
    worker = app[WORKER]
    busy = BusyWait(spin_for(settings, worker))
    async with AsyncExitStack() as stack:
        redis = await stack.enter_async_context(open_redis(settings.redis))
        app[REDIS] = redis
        access: AccessControl
        local = frozenset(n for n, p in settings.live_providers()[0].items() if p.kind == "local")
        if settings.auth.enabled:
            usage = settings.usage
            pricing = Pricing(usage, local)
            keyed = RedisAccessControl(
                redis,
                prefix=settings.redis.key_prefix,
                # With a usage store its consumer trims the stream, after storing.
                usage_stream_maxlen=0 if usage.enabled else settings.limits.usage_stream_maxlen,
                slot_lease_s=settings.limits.slot_lease_s,
                spool_dir=settings.limits.spool_dir,
                timeout_s=settings.redis.timeout_s,
                busy=busy,
                pricing=None if pricing.free else pricing,  # no prices: nothing to look up
            )
            if usage.enabled:
                app[USAGE_STORE] = await stack.enter_async_context(
                    open_usage_store(
                        redis, usage, stream=keyed.store.space.usage_log(), local_providers=local
                    )
                )
            await keyed.start()
            stack.push_async_callback(keyed.aclose)  # runs after the pipeline's drain below
            access = keyed
        else:
            access = OpenAccess()
        app[ACCESS] = access
        cluster = await stack.enter_async_context(open_cluster(redis, settings))
        if cluster is not None:
            app[CLUSTER] = cluster
            app[ENGINE_HOST] = cluster
            register_cluster_metrics(app[METRICS].registry, cluster)
        providers = await stack.enter_async_context(
            open_providers(
                settings,
                app[METRICS],
                cluster,
                worker=worker,
                busy=busy,
                on_engine_failure=app.get(ON_FATAL),
            )
        )
        if settings.shares_engine and worker == 0:
            from gateway.engine_host.worker_share import engine_share

            app[ENGINE_HOST] = engine_share(settings, providers)
        direct = {name: p.direct_models for name, p in settings.live_providers()[0].items()}
        router = Router(providers, settings.models, direct, settings.model_patterns)
        app[ROUTER] = router
        limits = OutputLimits(settings.models, settings.limits.default_max_tokens)
        server = settings.server
        keepalive = KeepAlive(
            server.stream_headers_after_s, server.keepalive_s, server.write_stall_timeout_s
        )
        routing = settings.routing
        breakers = Breakers(routing.breaker)
        live = settings.live_providers()[0]
        for name, provider_settings in live.items():
            accounts = provider_settings.accounts() if provider_settings.kind != "local" else ()
            if len(accounts) > 1 and name in providers:
                breakers.accounts[name] = tuple(identity for identity, _ in accounts)
        app[BREAKERS] = breakers
        stickiness = Stickiness(redis, settings.redis.key_prefix, routing.sticky_ttl_s)
        stack.push_async_callback(stickiness.drain)  # its writes land before Redis closes
        decider = Decider(routing, local, providers, stickiness)
        planner = RoutePlanner(router, decider, app[METRICS])
        pipeline = Pipeline(
            router,
            access,
            app[METRICS],
            limits,
            keepalive,
            planner=planner,
            breakers=breakers,
        )
        stack.push_async_callback(pipeline.drain)  # settle everything before Redis closes
        app[PIPELINE] = pipeline
        log.info("gateway_ready", models=[c.id for c in router.cards()])
        yield
