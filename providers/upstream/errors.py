"""Upstream HTTP failures as ProviderErrors: the status mapped to the error a client can act
on, the upstream's own message trimmed, and Retry-After in whole seconds."""

from __future__ import annotations

import math
import time
from email.utils import parsedate_to_datetime
from typing import Any

from providers.errors import (
    ProviderError,
    UpstreamAuthError,
    UpstreamBadRequest,
    UpstreamDisconnected,
    UpstreamRateLimited,
    UpstreamTimeout,
    UpstreamUnavailable,
)
from providers.transport.http1_bounds import CertificateError, Http1Refused


def http_error(provider: str, status: int, message: str, retry_after: str | None) -> ProviderError:
    """The ProviderError for an upstream HTTP error status."""
    seconds = parse_retry_after(retry_after)
    common: dict[str, Any] = {"provider": provider, "upstream_status": status}
    who, said = f"Provider '{provider}'", clip(message)
    if status in (401, 403):
        return UpstreamAuthError(
            f"{who} rejected the gateway's own credentials (HTTP {status}); the gateway's "
            "operator needs to fix its API key.",
            detail=said,
            **common,
        )
    if status == 429:
        return UpstreamRateLimited(
            f"{who} is rate limiting the gateway" + (f": {said}" if said else "."),
            retry_after=seconds,
            **common,
        )
    if status in (408, 504):
        return UpstreamTimeout(f"{who} timed out (HTTP {status}).", detail=said, **common)
    if status in (400, 404, 413, 422):
        return UpstreamBadRequest(
            f"{who} rejected the request: {said or f'HTTP {status}'}", **common
        )
    return UpstreamUnavailable(
        f"{who} failed with HTTP {status}" + (f": {said}" if said else "."),
        retry_after=seconds,
        **common,
    )


def clip(message: str, limit: int = 300) -> str:
    """An upstream's own message, trimmed for the client."""
    message = message.strip()
    return message if len(message) <= limit else message[: limit - 3] + "..."


def describe(exc: BaseException) -> str:
    """A library exception, for the logs."""
    return f"{type(exc).__name__}: {exc}"


# The longest wait passed on to clients: an upstream's "Retry-After: 1e12" (or "inf", or a date
# decades ahead) is garbage, and clients that honour it would never come back.
MAX_RETRY_AFTER_S = 3600


def parse_retry_after(value: str | None) -> int | None:
    """Whole seconds from a Retry-After header (seconds or an HTTP date), 0 to
    MAX_RETRY_AFTER_S; None if absent or unreadable."""
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = parsedate_to_datetime(value).timestamp() - time.time()
        except (TypeError, ValueError, OverflowError):
            return None
    if math.isnan(seconds):
        return None
    return math.ceil(min(max(seconds, 0.0), MAX_RETRY_AFTER_S))


def timeout_error(
    provider: str,
    what: str,
    connect_s: float,
    first_byte_s: float,
    idle_s: float,
    answer_s: float,
    *,
    total_s: float = 0.0,
) -> UpstreamTimeout:
    """The timeout `what` ("connect", "first byte", "idle", "answer", "total", or another
    step's name) in the words a client reads, with the limit that ran out."""
    who = f"Provider '{provider}'"
    message = {
        "connect": f"{who} could not be connected to within {connect_s:g} s.",
        "first byte": f"{who} did not start its answer within {first_byte_s:g} s "
        "(first byte timeout).",
        "idle": f"{who} sent no data for {idle_s:g} s in the middle of its answer (idle "
        "timeout; keep-alive comments do not count).",
        "total": f"{who} did not finish its answer within {total_s:g} s (total timeout).",
        "answer": f"{who} did not complete its answer within {answer_s:g} s (answer timeout).",
    }.get(what, f"{who} did not answer in time ({what}).")
    return UpstreamTimeout(message, provider=provider)


def unreachable_error(provider: str, exc: BaseException) -> UpstreamUnavailable:
    if isinstance(exc, CertificateError):  # the operator's to fix: said to the client as well
        return UpstreamUnavailable(
            f"Provider '{provider}' could not be reached: TLS certificate verification failed "
            f"({exc.reason}).",
            provider=provider,
            detail=describe(exc),
        )
    return UpstreamUnavailable(
        f"Provider '{provider}' could not be reached.", provider=provider, detail=describe(exc)
    )


def unreadable_error(provider: str, what: str, detail: str) -> UpstreamUnavailable:
    """A stream (`what` "stream") or an answer the gateway could not read."""
    return UpstreamUnavailable(
        f"Provider '{provider}' sent {'a stream' if what == 'stream' else 'an answer'} "
        "the gateway could not read.",
        provider=provider,
        detail=detail,
    )


def refused_error(provider: str, exc: Http1Refused) -> UpstreamUnavailable:
    """An answer the HTTP client will not read (too many or too long headers, a body beyond its
    bound, an encoding it does not decode)."""
    return UpstreamUnavailable(
        f"Provider '{provider}' sent an answer the gateway refuses to read: {exc}.",
        provider=provider,
        detail=describe(exc),
    )


def broken_error(provider: str, exc: BaseException | None) -> UpstreamUnavailable:
    """An answer that ended before its end (`exc` None: a stream without [DONE]); a refused
    one reads as `refused_error`."""
    if isinstance(exc, Http1Refused):
        return refused_error(provider, exc)
    return UpstreamDisconnected(
        f"Provider '{provider}' broke off its answer before the end.",
        provider=provider,
        detail=describe(exc) if exc is not None else "the body ended without [DONE]",
    )
