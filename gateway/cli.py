"""`python -m gateway serve|keys|usage`: the operator's command line."""

from __future__ import annotations

import argparse
import asyncio
import signal
from collections.abc import Callable, Sequence

import structlog
from aiohttp import web

from gateway.admin import keys_cli
from gateway.app import create_app
from gateway.http_server import GatewayRunner
from gateway.logging import configure_logging
from gateway.settings import Settings, load_settings

log = structlog.get_logger("gateway.cli")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m gateway", description=__doc__)
    parser.add_argument("--config", help="settings TOML file (default: $GATEWAY_CONFIG)")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the gateway")
    serve.add_argument("--config", dest="serve_config", help="settings TOML file")
    serve.add_argument("--host")
    serve.add_argument("--port", type=int)
    serve.set_defaults(func=_serve)
    keys_cli.register(sub)
    return parser


async def run_server(settings: Settings) -> None:
    """Serve until SIGINT/SIGTERM; then stop accepting, let streams finish within the grace
    period, and close every resource."""
    app = create_app(settings)
    runner = GatewayRunner(
        app,
        handle_signals=False,
        handler_cancellation=True,
        shutdown_timeout=settings.server.grace_period_s,
        access_log=None,
    )
    await runner.setup()
    site = web.TCPSite(runner, settings.server.host, settings.server.port)
    await site.start()
    log.info("listening", host=settings.server.host, port=settings.server.port)
    unix_path = settings.cluster.internal_socket if settings.cluster.enabled else None
    if unix_path is not None:
        unix_path.unlink(missing_ok=True)  # left by a process that was killed
        await web.UnixSite(runner, str(unix_path)).start()
        log.info("listening", unix_socket=str(unix_path))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
        log.info("shutting_down", grace_period_s=settings.server.grace_period_s)
    finally:
        await runner.cleanup()


def _serve(args: argparse.Namespace) -> int:
    settings = load_settings(args.serve_config or args.config)
    flags = {k: v for k, v in (("host", args.host), ("port", args.port)) if v is not None}
    if flags:  # command-line flags beat the file and the environment
        settings = settings.model_copy(update={"server": settings.server.model_copy(update=flags)})
    configure_logging(settings.logging)
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        runner.run(run_server(settings))
    return 0


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop where it is installed (Linux, macOS): roughly twice the HTTP throughput."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))
