"""Errors a provider raises. The gateway maps them to HTTP statuses and OpenAI error JSON.

`message` is what the client is told: one sentence in the user's terms that names the provider
once (`Provider 'deepseek' ...`) and is passed through unchanged. `detail` is for the logs only
(the library's exception, a malformed frame): never sent to the client.
`retryable` says whether the router may try the next route (only before any token reached the
client). `retry_after` is in whole seconds when the upstream told us.
"""

from __future__ import annotations


class ProviderError(Exception):
    """Base class. `provider` names the configured provider that failed."""

    status: int = 502
    code: str = "upstream_error"
    retryable: bool = True

    def __init__(
        self,
        message: str,
        *,
        provider: str = "",
        retry_after: int | None = None,
        upstream_status: int | None = None,
        detail: str = "",
    ) -> None:
        super().__init__(message)
        self.message = message
        self.detail = detail
        self.provider = provider
        self.retry_after = retry_after
        self.upstream_status = upstream_status


class UpstreamAuthError(ProviderError):
    """The upstream rejected our credentials (401/403): the operator's problem, not the client's."""

    status = 502
    code = "upstream_auth_failed"
    retryable = True


class UpstreamRateLimited(ProviderError):
    status = 429
    code = "upstream_rate_limited"
    retryable = True


class UpstreamBadRequest(ProviderError):
    """The upstream said the request itself is wrong (400/404/422): the same on every route."""

    status = 400
    code = "upstream_bad_request"
    retryable = False


class UpstreamUnavailable(ProviderError):
    """5xx, refused connection, broken stream."""

    status = 502
    code = "upstream_unavailable"
    retryable = True


class UpstreamDisconnected(UpstreamUnavailable):
    """The upstream broke off its answer before the end (the connection dropped or closed, or a
    stream ended without its end)."""

    code = "upstream_disconnected"


class UpstreamTimeout(ProviderError):
    status = 504
    code = "upstream_timeout"
    retryable = True


class Overloaded(ProviderError):
    """A local engine whose waiting queue is full. The gateway answers 503 with Retry-After."""

    status = 503
    code = "overloaded"
    retryable = True


class EngineLoading(ProviderError):
    """A local engine still training its demo checkpoint or loading its weights: 503 with
    Retry-After; the next route (an upstream) is tried, and no breaker counts it."""

    status = 503
    code = "engine_loading"
    retryable = True


class InvalidRequest(ProviderError):
    """The request cannot be served by this provider (prompt too long, bad parameter)."""

    status = 400
    code = "invalid_request"
    retryable = False

    def __init__(self, message: str, *, provider: str = "", param: str | None = None) -> None:
        super().__init__(message, provider=provider)
        self.param = param
