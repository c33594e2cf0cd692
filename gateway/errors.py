"""The gateway's one exception hierarchy, rendered by the error middleware as
`{"error": {"message", "type", "param", "code"}}` with the matching HTTP status, and how a
provider's failure maps into it (`provider_error_to_gateway`). A message never carries a URL's
credentials (an upstream's error may quote its URL): they are masked here."""

from __future__ import annotations

from typing import Any

from gateway.observability.redact import redact_text
from providers import errors as perr


class GatewayError(Exception):
    status: int = 500
    type: str = "api_error"
    code: str | None = None

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        message = redact_text(message)
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code
        self.headers: dict[str, str] = dict(headers or {})

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


class InvalidRequest(GatewayError):
    status = 400
    type = "invalid_request_error"
    code = "invalid_request"


class AuthenticationError(GatewayError):
    status = 401
    type = "authentication_error"
    code = "invalid_api_key"


class PermissionDenied(GatewayError):
    status = 403
    type = "permission_error"
    code = "permission_denied"


class NotFound(GatewayError):
    status = 404
    type = "invalid_request_error"
    code = "not_found"


class Conflict(GatewayError):
    status = 409
    type = "invalid_request_error"
    code = "conflict"


class RequestTimeout(GatewayError):
    """The client did not send its request in time (a slow or stalled body)."""

    status = 408
    type = "invalid_request_error"
    code = "request_timeout"


class PayloadTooLarge(GatewayError):
    status = 413
    type = "invalid_request_error"
    code = "payload_too_large"


class RateLimited(GatewayError):
    """429 with Retry-After (whole seconds)."""

    status = 429
    type = "rate_limit_error"
    code = "rate_limit_exceeded"

    def __init__(self, message: str, *, retry_after: int, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.retry_after = max(1, int(retry_after))
        self.headers.setdefault("Retry-After", str(self.retry_after))


class QuotaExceeded(GatewayError):
    status = 429
    type = "insufficient_quota"
    code = "insufficient_quota"


class UpstreamError(GatewayError):
    status = 502
    type = "api_error"
    code = "upstream_error"


class ServiceUnavailable(GatewayError):
    status = 503
    type = "api_error"
    code = "service_unavailable"


class GatewayTimeout(GatewayError):
    status = 504
    type = "api_error"
    code = "upstream_timeout"


def provider_error_to_gateway(exc: perr.ProviderError) -> GatewayError:
    """Map a provider failure to what the client sees: its status, and its message as is (a
    provider's message names it and is meant for the client; `detail` stays in the logs)."""
    message = exc.message
    if isinstance(exc, perr.UpstreamRateLimited):
        return RateLimited(message, retry_after=exc.retry_after or 1, code="upstream_rate_limited")
    if isinstance(exc, perr.Overloaded | perr.EngineLoading):
        retry = str(exc.retry_after or 1)
        return ServiceUnavailable(message, code=exc.code, headers={"Retry-After": retry})
    if isinstance(exc, perr.InvalidRequest):
        return InvalidRequest(message, param=exc.param)
    if isinstance(exc, perr.UpstreamBadRequest):
        return InvalidRequest(message, code="upstream_bad_request")
    if isinstance(exc, perr.UpstreamTimeout):
        return GatewayTimeout(message)
    return UpstreamError(message, code=exc.code)
