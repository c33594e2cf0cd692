"""Every place the gateway reaches into aiohttp below its public API, in one module.

aiohttp's server offers no public way to shape the answers its HTTP parser gives on its own,
to wrap a connection's transport, or to dispatch a request to a route the caller already
resolved. These hooks do, each in a few lines that name the private attribute they touch:

- `HookedHandler.connection_made`: the connection's transport is wrapped (`wrap_transport`)
  before aiohttp's handler sees it;
- `HookedHandler.handle_error`: the answer to a request aiohttp's parser rejected (or to an
  error raised before the app ran) is built by `render_error` instead of aiohttp's plain text;
- `HookedServer`: the `web.Server` whose handlers are `HookedHandler`s (its `_loop`, `_kwargs`);
- `HookedRunner._make_server`: a `web.AppRunner` that serves the app through `HookedServer`,
  with the app's handler wrapped by `wrap_handler` (aiohttp's `_make_server`, `server._kwargs`);
- `dispatch`: a request through the app's own router and middleware (`Application._handle`);
- `set_match_info`: a request given the match info its route would get (`_match_info`);
- `response_started`: whether any byte of an answer went out on the request's connection.

Each hook has a test against the installed aiohttp (tests/gateway/server/test_aiohttp_hooks.py),
and pyproject.toml bounds aiohttp's version above: an upgrade is a decision, taken with those
tests.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, cast

from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_urldispatcher import AbstractRoute, UrlMappingMatchInfo

Handle = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]
# (status, the parser's exception or None) -> the answer to send; the connection then closes.
RenderError = Callable[[int, BaseException | None], web.StreamResponse]
WrapTransport = Callable[[asyncio.Transport], asyncio.Transport]


class HookedHandler(RequestHandler):
    """One connection's aiohttp handler, with its transport wrapped and its own errors
    rendered by the server's callbacks."""

    __slots__ = ()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        server = cast(HookedServer, self._manager)
        super().connection_made(server.wrap_transport(cast(asyncio.Transport, transport)))

    def handle_error(
        self,
        request: Any,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if response_started(request):
            # Part of an answer is out already: aiohttp then drops the connection.
            raise ConnectionError("the response had started; the connection is broken")
        response = cast(HookedServer, self._manager).render_error(status, exc)
        response.force_close()
        return response


class HookedServer(web.Server):
    """`web.Server` whose connections are `HookedHandler`s."""

    def __init__(
        self,
        handler: Handle,
        *,
        render_error: RenderError,
        wrap_transport: WrapTransport,
        **kwargs: Any,
    ) -> None:
        super().__init__(handler, **kwargs)
        self.render_error = render_error
        self.wrap_transport = wrap_transport

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def __call__(self) -> RequestHandler:
        return HookedHandler(self, loop=self._loop, **self._kwargs)


class HookedRunner(web.AppRunner):
    """`web.AppRunner` serving through `HookedServer`; subclasses say how (the three hooks)."""

    def wrap_handler(self, app: web.Application) -> Handle:
        """The handler every request goes to (the app frozen by now); by default the app's."""
        return app._handle  # type: ignore[return-value]

    def render_error(self, status: int, exc: BaseException | None) -> web.StreamResponse:
        return web.Response(status=status)

    def wrap_transport(self, transport: asyncio.Transport) -> asyncio.Transport:
        return transport

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()  # freezes the app
        return HookedServer(
            self.wrap_handler(self._app),
            render_error=self.render_error,
            wrap_transport=self.wrap_transport,
            request_factory=server.request_factory,
            handler_cancellation=server.handler_cancellation,
            **server._kwargs,
        )


async def dispatch(app: web.Application, request: web.BaseRequest) -> web.StreamResponse:
    """`request` resolved by the app's router and run through its middleware, as aiohttp does."""
    return await app._handle(request)  # type: ignore[arg-type]


def match_info(app: web.Application, route: AbstractRoute) -> UrlMappingMatchInfo:
    """The frozen match info aiohttp's router gives a request of a fixed-path `route`."""
    info = UrlMappingMatchInfo({}, route)
    info.add_app(app)
    info.freeze()
    return info


def set_match_info(request: web.BaseRequest, info: UrlMappingMatchInfo) -> None:
    request._match_info = info  # type: ignore[attr-defined]


def response_started(request: web.BaseRequest) -> bool:
    """Whether any byte of an answer to `request` was written to its connection."""
    writer = request.writer
    return writer is not None and writer.output_size > 0
