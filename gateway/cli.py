"""`python -m gateway serve|keys|usage|usage-store`: the operator's command line."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from gateway.admin import keys_cli
from gateway.config.settings import load_settings
from gateway.observability.logging import configure_logging
from gateway.server.serve import serve_process
from gateway.server.workers import serve_workers
from gateway.usage_store import cli as usage_store_cli


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
    usage_store_cli.register(sub)
    return parser


def _serve(args: argparse.Namespace) -> int:
    settings = load_settings(args.serve_config or args.config)
    flags = {k: v for k, v in (("host", args.host), ("port", args.port)) if v is not None}
    if flags:  # command-line flags beat the file and the environment
        settings = settings.model_copy(update={"server": settings.server.model_copy(update=flags)})
    if settings.server.workers > 1:
        configure_logging(settings.logging)
        return serve_workers(settings)
    serve_process(settings)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))
