"""The Anthropic Messages API's error shape for the gateway's one exception hierarchy:
`{"type": "error", "error": {"type", "message"}}`, the type chosen by HTTP status. A 503 (an
engine at capacity, a state store away) is Anthropic's 529 `overloaded_error`, which its clients
retry with backoff.
"""

from __future__ import annotations

from typing import Any

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    409: "invalid_request_error",
    413: "request_too_large",
    422: "invalid_request_error",
    429: "rate_limit_error",
    504: "timeout_error",
    529: "overloaded_error",
}
_STATUS = {503: 529}
MESSAGES_PATHS = ("/v1/messages", "/messages")


def is_messages_path(path: str) -> bool:
    """Whether `path` belongs to the Messages API (its errors take Anthropic's shape)."""
    return any(path == p or path.startswith(p + "/") for p in MESSAGES_PATHS)


def anthropic_status(status: int) -> int:
    return _STATUS.get(status, status)


def anthropic_error(status: int, message: str) -> dict[str, Any]:
    """The error body for an error of HTTP `status` (the gateway's, before `anthropic_status`)."""
    kind = _TYPES.get(anthropic_status(status), "api_error")
    return {"type": "error", "error": {"type": kind, "message": message}}
