"""One serving process: the app on its port until SIGINT/SIGTERM, then a graceful stop."""

from __future__ import annotations

import asyncio
import gc
import signal
from collections.abc import Callable

import structlog
from aiohttp import web

from gateway.app import create_app
from gateway.config.settings import Settings
from gateway.observability.logging import configure_logging
from gateway.resources import DRAINING, ON_FATAL
from gateway.server.http_server import GatewayRunner

log = structlog.get_logger("gateway.server.serve")


async def run_server(settings: Settings, *, worker: int = 0, reuse_port: bool = False) -> None:
    """Serve until SIGINT/SIGTERM; then stop accepting, let streams finish within the grace
    period, and close every resource. `reuse_port`: bind with SO_REUSEPORT, beside the other
    workers on the same port. The process listens before its local engine is loaded; an
    engine that fails to load stops it with a failure status."""
    stop = asyncio.Event()
    failed: list[BaseException] = []

    def fatal(exc: BaseException) -> None:
        failed.append(exc)
        stop.set()

    app = create_app(settings, worker=worker)
    app[ON_FATAL] = fatal
    runner = GatewayRunner(
        app,
        handle_signals=False,
        handler_cancellation=True,
        shutdown_timeout=settings.server.grace_period_s,
        access_log=None,
    )
    await runner.setup()
    host, port = settings.server.host, settings.server.port
    site = web.TCPSite(runner, host, port, reuse_port=reuse_port or None)
    await site.start()
    log.info("listening", host=host, port=port, worker=worker)
    # A cluster node's socket, or the one where worker 0 serves its engine to the other workers.
    serves_engine = settings.cluster.enabled or settings.shares_engine
    unix_path = settings.cluster.internal_socket if serves_engine else None
    if unix_path is not None and worker == 0:  # one process per node answers the node socket
        unix_path.unlink(missing_ok=True)  # left by a process that was killed
        await web.UnixSite(runner, str(unix_path)).start()
        log.info("listening", unix_socket=str(unix_path))
    settle_heap(settings.server.gc_young_threshold)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
        app[DRAINING].set()
        log.info("shutting_down", grace_period_s=settings.server.grace_period_s, worker=worker)
    finally:
        await runner.cleanup()
    if failed:
        raise SystemExit(f"stopped: a local engine failed to load ({failed[0]})")


def settle_heap(young_threshold: int) -> None:
    """Freeze what startup built out of the collector's scans; collect the young generation
    every `young_threshold` net allocations (`server.gc_young_threshold`)."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(young_threshold, middle, old)


def serve_process(settings: Settings, *, worker: int = 0, reuse_port: bool = False) -> None:
    """This process serves until it is told to stop (logging configured, uvloop if present)."""
    configure_logging(
        settings.logging, cache=True, worker=worker if settings.server.workers > 1 else None
    )
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        runner.run(run_server(settings, worker=worker, reuse_port=reuse_port))


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop where it is installed (Linux, macOS): roughly twice the HTTP throughput."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop
