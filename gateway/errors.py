"""The gateway's one exception hierarchy, rendered by the error middleware as
`{"error": {"message", "type", "param", "code"}}` with the matching HTTP status. A message never
carries a URL's credentials (an upstream's error may quote its URL): they are masked here."""

from __future__ import annotations

from typing import Any

from gateway.redact import redact_text


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
