"""structlog setup: JSON lines in production, console in development; per-request context is
bound with `gateway.observability.log_context` by the middleware and the pipeline. Never log
secrets or prompt text; URL credentials are masked in every logged string.

One stream: the standard library's records (the engine in `backend/` logs through `logging`,
with its facts in `extra`) go through the same renderer, so in JSON mode every line is JSON and
those facts are fields.
"""

from __future__ import annotations

import logging
import sys
from typing import TextIO

import structlog

from gateway.config.process import LoggingSettings
from gateway.observability import log_context
from gateway.observability.redact import redact_event


class _WorkerField:
    """A processor adding `worker=<index>` to every event."""

    def __init__(self, worker: int) -> None:
        self._worker = worker

    def __call__(
        self, logger: object, method: str, event: structlog.typing.EventDict
    ) -> structlog.typing.EventDict:
        event.setdefault("worker", self._worker)
        return event


class _StructlogHandler(logging.StreamHandler):  # type: ignore[type-arg,unused-ignore]
    """The root handler this module installs (replaced, never stacked, on reconfiguration)."""


def configure_logging(
    settings: LoggingSettings,
    stream: TextIO | None = None,
    *,
    cache: bool = False,
    worker: int | None = None,
) -> None:
    """`cache`: each logger keeps the configuration it first logged with (a serving process,
    configured once: a log call then builds no logger; tests that reconfigure leave it off).
    `worker`: every line says which serving process wrote it (`[server] workers` > 1)."""
    level = getattr(logging, settings.level.upper())
    out = stream or sys.stderr
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer()
        if settings.format == "json"
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    shared: list[structlog.typing.Processor] = [
        log_context.merge,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    if worker is not None:
        shared.append(_WorkerField(worker))
    structlog.configure(
        # redact_event: no URL's password reaches a log line
        processors=[*shared, structlog.processors.format_exc_info, redact_event, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        # One write per line: workers share stderr, and with PYTHONUNBUFFERED each write is a
        # system call (print's text and newline are two, and lines of two workers interleave).
        logger_factory=structlog.WriteLoggerFactory(out),
        cache_logger_on_first_use=cache,
    )
    handler = _StructlogHandler(out)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[
                *shared,
                structlog.stdlib.add_logger_name,
                structlog.stdlib.ExtraAdder(),
            ],
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.format_exc_info,
                redact_event,
                renderer,
            ],
        )
    )
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _StructlogHandler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
