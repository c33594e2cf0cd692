"""structlog setup: JSON lines in production, console in development; per-request context is
bound with `structlog.contextvars` by the middleware. Never log secrets or prompt text."""

from __future__ import annotations

import logging
import sys
from typing import TextIO

import structlog

from gateway.settings import LoggingSettings


def configure_logging(settings: LoggingSettings, stream: TextIO | None = None) -> None:
    level = getattr(logging, settings.level.upper())
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer()
        if settings.format == "json"
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(stream or sys.stderr),
        cache_logger_on_first_use=False,
    )
    logging.basicConfig(level=level, stream=stream or sys.stderr, format="%(name)s %(message)s")
