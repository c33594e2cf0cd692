"""The fields every log line of a request carries (request_id, key_id, model, provider, ...).

One context variable holds one dict per request: `begin` gives a new request its own dict (so
nothing of an earlier request's is left to clear, whichever task ran it), `bind` adds to it in
place, and `merge`, the structlog processor `gateway/observability/logging.py` installs, adds the
fields to each line that is written. Work the request started in tasks of their own (its
settlement, a keep-alive timer) shares the dict, so what it binds shows on the request's later
lines too. Cheaper than structlog's contextvars (one variable per key, and a scan of the whole
context to clear them) on a path that logs nothing at the default level.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any

from structlog.typing import EventDict, WrappedLogger

_FIELDS: ContextVar[dict[str, Any] | None] = ContextVar("gateway_log_fields", default=None)


def begin(**fields: Any) -> None:
    """A request starts: `fields` are all its lines carry so far."""
    _FIELDS.set(fields)


def bind(**fields: Any) -> None:
    current = _FIELDS.get()
    if current is None:
        _FIELDS.set(fields)
    else:
        current.update(fields)


def merge(logger: WrappedLogger, method_name: str, event_dict: EventDict) -> EventDict:
    """structlog processor: the request's fields, where the call did not name them itself."""
    fields = _FIELDS.get()
    if fields:
        for key, value in fields.items():
            event_dict.setdefault(key, value)
    return event_dict
