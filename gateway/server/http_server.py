"""The HTTP server runner: aiohttp's, with parser-level errors answered in the API's shape.

Requests that aiohttp's HTTP parser rejects (a garbage request line, an unknown method, an
oversized header or URL, a NUL in a header, conflicting Content-Length / Transfer-Encoding, a bad
chunk size) never reach the application or its middleware: aiohttp answers them itself from
`RequestHandler.handle_error`, as plain text. `GatewayRunner` serves the app with a handler whose
`handle_error` renders the same answers as OpenAI error JSON with an `x-request-id`, through the
middleware's one renderer. The connection is closed after such an answer, as aiohttp does.
An HTTP error aiohttp raises after parsing but before the app's middleware (an `Expect` other
than `100-continue`) is rendered the same way, in the shape of the path's protocol.

Requests to a fixed path (every API endpoint but `/v1/models/{model}`) skip aiohttp's URL
dispatch: `HotRoutes` looks the method and path up in one dict built when the app froze, and
calls the route's handler inside the app's middleware, with the match info aiohttp's router
would have made (made once per route; a fixed path matches nothing). Anything else (a request
with `Expect`, another method, a dynamic path, a miss) takes aiohttp's own dispatch.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import structlog
from aiohttp import web
from aiohttp.http_exceptions import (
    BadHttpMethod,
    BadStatusLine,
    ContentLengthError,
    HttpProcessingError,
    InvalidHeader,
    InvalidURLError,
    LineTooLong,
    TransferEncodingError,
)
from aiohttp.web_urldispatcher import MatchedSubAppResource, PlainResource, UrlMappingMatchInfo

from gateway.errors import GatewayError, GatewayTimeout, InvalidRequest
from gateway.resources import SETTINGS
from gateway.server.aiohttp_hooks import (
    Handle,
    HookedRunner,
    dispatch,
    match_info,
    set_match_info,
)
from gateway.server.middleware import new_request_id, render
from gateway.wire.messages_errors import is_messages_path
from plumbing.turn_writes import TurnWrites, WriteTurn

log = structlog.get_logger("gateway.http")

# What went wrong, in the client's terms (the parser's own text may quote whole header lines).
_Kinds = type[HttpProcessingError] | tuple[type[HttpProcessingError], ...]
_REASONS: tuple[tuple[_Kinds, str], ...] = (
    (LineTooLong, "The request line or a header line is longer than the gateway accepts."),
    (InvalidHeader, "A request header is malformed."),
    (BadHttpMethod, "The request's HTTP method is not valid."),
    (BadStatusLine, "The HTTP request line is malformed."),
    (InvalidURLError, "The request URL is malformed."),
    (
        (TransferEncodingError, ContentLengthError),
        "The request's Content-Length or Transfer-Encoding is invalid, or they conflict.",
    ),
)


def parser_error(status: int, exc: BaseException | None) -> GatewayError:
    """The gateway error standing for an answer aiohttp would give on its own."""
    if status == 504:
        return GatewayTimeout("The request took too long to handle.", code="handler_timeout")
    if status >= 500:
        error = GatewayError("Internal server error.", code="internal_error")
        error.status = status
        return error
    reason = "The HTTP request is malformed."
    for kinds, text in _REASONS:
        if isinstance(exc, kinds):
            reason = text
            break
    error = InvalidRequest(reason, code="malformed_http_request")
    error.status = status
    return error


def _render_parser_error(status: int, exc: BaseException | None) -> web.StreamResponse:
    request_id = new_request_id()
    log.warning(
        "http_error_before_app",
        request_id=request_id,
        status=status,
        error=type(exc).__name__ if exc is not None else None,
    )
    response = render(parser_error(status, exc))
    response.headers["x-request-id"] = request_id
    return response


def _shaped(handle: Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]) -> Any:
    """The app's handler, with an HTTP error raised before its middleware ran (aiohttp's own
    Expect handling: a 417 for anything but `100-continue`) answered in the API's shape."""

    async def handler(request: web.BaseRequest) -> web.StreamResponse:
        try:
            return await handle(request)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            error = InvalidRequest(exc.text or exc.reason, code="unsupported_http_feature")
            error.status = exc.status
            response = render(error, request.path)
            request_id = new_request_id()
            response.headers["x-request-id"] = request_id
            if is_messages_path(request.path):
                response.headers["request-id"] = request_id
            return response

    return handler


_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class HotRoutes:
    """(method, path) -> (match info, handler wrapped in the app's middleware), for the
    top-level app's fixed-path routes."""

    def __init__(self, app: web.Application) -> None:
        self._app = app
        self._table: dict[tuple[str, str], tuple[UrlMappingMatchInfo, _Handler]] = {}
        resources = list(app.router.resources())
        if any(isinstance(r, MatchedSubAppResource) for r in resources):
            return  # a domain-matched sub-app is resolved before any path: keep aiohttp's order
        for resource in resources:
            if not isinstance(resource, PlainResource):
                continue
            for route in resource:
                key = (route.method, resource.canonical)
                if route.method == "*" or key in self._table:
                    continue  # any-method routes, and later duplicates, resolve as aiohttp does
                info = match_info(app, route)
                handler: Any = route.handler
                for middleware in reversed(app.middlewares):
                    handler = partial(middleware, handler=handler)
                self._table[key] = (info, handler)

    async def __call__(self, request: web.BaseRequest) -> web.StreamResponse:
        found = self._table.get((request.method, request.rel_url.path_safe))
        if found is None or "Expect" in request.headers:
            return await dispatch(self._app, request)
        info, handler = found
        set_match_info(request, info)
        return await handler(request)  # type: ignore[arg-type]


class GatewayRunner(HookedRunner):
    """`web.AppRunner` whose connections answer parser-level errors as OpenAI error JSON, and
    close when no whole request head arrived within `server.request_head_timeout_s` of their
    opening or their last answer (aiohttp's keep-alive timeout, which it arms at both)."""

    def __init__(self, app: web.Application, **kwargs: Any) -> None:
        if SETTINGS in app:
            kwargs.setdefault("keepalive_timeout", app[SETTINGS].server.request_head_timeout_s)
        super().__init__(app, **kwargs)
        self._turn: WriteTurn | None = None  # its connections' writes, by loop turn

    def wrap_handler(self, app: web.Application) -> Handle:
        return _shaped(HotRoutes(app))

    def render_error(self, status: int, exc: BaseException | None) -> web.StreamResponse:
        return _render_parser_error(status, exc)

    def wrap_transport(self, transport: asyncio.Transport) -> asyncio.Transport:
        # Answers are sent once per loop turn, with the turn's others (plumbing/turn_writes.py).
        if self._turn is None:
            self._turn = WriteTurn(asyncio.get_running_loop())
        return TurnWrites(transport, self._turn)
