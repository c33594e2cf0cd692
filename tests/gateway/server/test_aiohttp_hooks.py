"""Each hook of gateway/server/aiohttp_hooks.py against the installed aiohttp: the private
attribute it touches is still there and still does what the gateway relies on."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from gateway.server.aiohttp_hooks import (
    Handle,
    HookedRunner,
    dispatch,
    match_info,
    response_started,
    set_match_info,
)


class RecordingRunner(HookedRunner):
    """Counts wrapped transports and handled requests; renders parser errors as 499 + a mark."""

    def __init__(self, app: web.Application) -> None:
        super().__init__(app)
        self.transports = 0
        self.requests = 0

    def wrap_handler(self, app: web.Application) -> Handle:
        async def handle(request: web.BaseRequest) -> web.StreamResponse:
            self.requests += 1
            return await dispatch(app, request)

        return handle

    def render_error(self, status: int, exc: BaseException | None) -> web.StreamResponse:
        return web.Response(status=status, text=f"shaped {status} {type(exc).__name__}")

    def wrap_transport(self, transport: asyncio.Transport) -> asyncio.Transport:
        self.transports += 1
        return transport


async def _route_name(request: web.Request) -> web.Response:
    return web.Response(text=request.match_info.route.name or "")


async def _started(request: web.Request) -> web.StreamResponse:
    before = response_started(request)
    response = web.StreamResponse()
    await response.prepare(request)
    await response.write(b"x" * 10)
    after = response_started(request)
    await response.write(f" {before} {after}".encode())
    return response


@pytest.fixture
async def served() -> AsyncIterator[tuple[RecordingRunner, str]]:
    app = web.Application()
    app.router.add_get("/name", _route_name, name="named")
    app.router.add_get("/started", _started)
    runner = RecordingRunner(app)
    await runner.setup()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    await web.SockSite(runner, sock).start()
    yield runner, f"http://127.0.0.1:{sock.getsockname()[1]}"
    await runner.cleanup()


async def test_every_connection_goes_through_wrap_transport_and_every_request_wrap_handler(
    served: tuple[RecordingRunner, str],
) -> None:
    runner, root = served
    for _ in range(2):
        async with aiohttp.ClientSession() as session, session.get(f"{root}/name") as answer:
            assert answer.status == 200
    assert runner.transports == 2
    assert runner.requests == 2


async def test_dispatch_routes_through_the_apps_router(served: tuple[RecordingRunner, str]) -> None:
    _, root = served
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{root}/name") as answer:
            assert await answer.text() == "named"
        async with session.get(f"{root}/missing") as answer:
            assert answer.status == 404


async def test_a_request_aiohttps_parser_rejects_is_answered_by_render_error(
    served: tuple[RecordingRunner, str],
) -> None:
    _, root = served
    host, port = root.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"NOT A REQUEST LINE\r\n\r\n")
    answer = await asyncio.wait_for(reader.read(), timeout=10)  # closed after the answer
    writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.split(b" ")[1] == b"400"
    assert body.startswith(b"shaped 400 ")


async def test_response_started_turns_true_once_bytes_went_out(
    served: tuple[RecordingRunner, str],
) -> None:
    _, root = served
    async with aiohttp.ClientSession() as session, session.get(f"{root}/started") as answer:
        assert (await answer.text()).endswith(" False True")


async def test_set_match_info_gives_a_request_its_routes_match_info() -> None:
    app = web.Application()
    route = app.router.add_get("/fixed", _route_name, name="fixed")
    info = match_info(app, route)
    seen: list[str | None] = []

    async def handle(request: web.BaseRequest) -> web.StreamResponse:
        set_match_info(request, info)
        seen.append(request.match_info.route.name)  # type: ignore[attr-defined]
        assert request.match_info.apps == (app,)  # type: ignore[attr-defined]
        return web.Response()

    class Direct(HookedRunner):
        def wrap_handler(self, app: web.Application) -> Handle:
            return handle

    runner = Direct(app)
    await runner.setup()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    await web.SockSite(runner, sock).start()
    try:
        async with aiohttp.ClientSession() as session:
            url = f"http://127.0.0.1:{sock.getsockname()[1]}/anything"
            async with session.get(url) as answer:
                assert answer.status == 200
    finally:
        await runner.cleanup()
    assert seen == ["fixed"]
