"""Request id, per-request log context, access log, and the one place errors are rendered.

Every response carries `x-request-id`; every error is rendered in the shape of the request's
protocol: OpenAI error JSON, or Anthropic's on the Messages API paths (which also get
`request-id`, the header Anthropic's clients read).
"""

from __future__ import annotations

import asyncio
import re
import secrets
import time

import structlog
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.typedefs import Handler
from aiohttp.web_protocol import RequestPayloadError
from redis.exceptions import RedisError

from gateway.errors import (
    GatewayError,
    InvalidRequest,
    NotFound,
    PayloadTooLarge,
    ServiceUnavailable,
)
from gateway.observability import log_context
from gateway.wire.messages_errors import anthropic_error, anthropic_status, is_messages_path

log = structlog.get_logger("gateway.http")
REQUEST_ID = web.RequestKey("request_id", str)
# Set by a handler whose successful answers are routine (worker 0's engine polls, ten a
# second per worker): their access log line is at debug level.
QUIET = web.RequestKey("quiet_access_log", bool)
# The code logged for an error answer a handler returned itself (not raised).
_RESPONSE_CODES = {499: "client_disconnected", 503: "not_ready"}
_SAFE_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
_STATUS_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
}


def _error_response(
    status: int,
    message: str,
    type_: str,
    code: str | None,
    param: str | None = None,
    headers: dict[str, str] | None = None,
    path: str = "",
) -> web.Response:
    if is_messages_path(path):
        body = anthropic_error(status, message)
        return web.json_response(body, status=anthropic_status(status), headers=headers)
    body = {"error": {"message": message, "type": type_, "param": param, "code": code}}
    return web.json_response(body, status=status, headers=headers)


def render(exc: GatewayError, path: str = "") -> web.Response:
    """`exc` in the shape of the protocol that `path` belongs to."""
    return _error_response(
        exc.status, exc.message, exc.type, exc.code, exc.param, exc.headers, path
    )


def new_request_id() -> str:
    return f"req_{secrets.token_hex(16)}"  # 128 random bits, as uuid4's hex but cheaper


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    incoming = request.headers.get("x-request-id", "")
    request_id = incoming if _SAFE_ID.match(incoming) else new_request_id()
    request[REQUEST_ID] = request_id
    log_context.begin(request_id=request_id)
    started = time.perf_counter()
    status = 500
    code: str | None = "internal_error"  # the error code of a non-2xx answer, for the log
    try:
        _refuse_declared_oversize(request)
        response = await handler(request)
        status = response.status
        code = None if status < 400 else _RESPONSE_CODES.get(status, "error")
        return response
    except GatewayError as exc:
        status, code = exc.status, exc.code
        return render(exc, request.path)
    except asyncio.CancelledError:
        status, code = 499, "client_disconnected"  # the client went away
        raise
    except ConnectionResetError:
        status, code = 499, "client_disconnected"  # the client went away while we were writing
        return web.Response(status=499)
    except RedisError as exc:
        status, code = 503, "state_store_unavailable"
        log.error("redis_unavailable", error=str(exc))
        return render(
            ServiceUnavailable(
                "The gateway's state store is unavailable; try again shortly.",
                code="state_store_unavailable",
                headers={"Retry-After": "1"},
            ),
            request.path,
        )
    except (HttpProcessingError, RequestPayloadError):
        # The body could not be read as sent: a bad chunk, or a Content-Encoding that does not
        # match the bytes (gzip declared, plain text sent). Nothing more is read from it (aiohttp
        # would try once the answer is out, and log the same error as an unhandled one), and
        # the connection closes after the answer.
        status, code = 400, "unreadable_body"
        request.content.feed_eof()
        response = render(
            InvalidRequest(
                "The request body could not be read as sent: check that it matches its "
                "Content-Encoding and Transfer-Encoding.",
                code="unreadable_body",
            ),
            request.path,
        )
        response.force_close()
        return response
    except web.HTTPRequestEntityTooLarge:
        too_large = PayloadTooLarge("The request body is too large.")
        status, code = 413, too_large.code
        return render(too_large, request.path)
    except web.HTTPNotFound:
        not_found = NotFound(f"Unknown path {request.method} {request.path}.")
        status, code = 404, not_found.code
        return render(not_found, request.path)
    except web.HTTPException as exc:
        status = exc.status
        if exc.status < 400:
            code = None
            raise
        code = exc.reason.lower().replace(" ", "_")
        return _error_response(
            exc.status,
            exc.reason,
            _STATUS_TYPES.get(exc.status, "api_error"),
            None,
            headers={k: v for k, v in exc.headers.items() if k.lower() in ("allow", "retry-after")},
            path=request.path,
        )
    except Exception:
        log.exception("unhandled_error")
        return _error_response(
            500, "Internal server error.", "api_error", "internal_error", path=request.path
        )
    finally:
        ms = round((time.perf_counter() - started) * 1000, 2)
        if code is None:
            (log.debug if request.get(QUIET) else log.info)(
                "request", method=request.method, path=request.path, status=status, ms=ms
            )
        else:
            log.info(
                "request",
                method=request.method,
                path=request.path,
                status=status,
                ms=ms,
                code=code,
            )


def _refuse_declared_oversize(request: web.Request) -> None:
    """413 by the declared Content-Length, before a byte of the body is awaited (a client that
    declares 10 GiB and sends nothing gets its answer at once, not a hang)."""
    declared = request.content_length
    if declared is not None and declared > request.client_max_size:
        raise PayloadTooLarge(
            f"The request body ({declared} bytes) is larger than the gateway's limit of "
            f"{request.client_max_size} bytes."
        )


async def add_request_id(request: web.Request, response: web.StreamResponse) -> None:
    """on_response_prepare: stream responses get the header before their first byte too."""
    request_id = request.get(REQUEST_ID)
    if request_id:
        response.headers["x-request-id"] = request_id
        if is_messages_path(request.path):
            response.headers["request-id"] = request_id
