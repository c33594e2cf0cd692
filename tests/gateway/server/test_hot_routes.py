"""gateway/server/http_server.py's `HotRoutes`: a fixed-path request reaches the handler aiohttp's
router would pick, inside the app's middleware, with the same match info; everything else (a dynamic
path, another method, `Expect`, a miss) is answered by aiohttp's own dispatch, as before."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from gateway.server.http_server import GatewayRunner, HotRoutes

SEEN = web.AppKey("seen", list)


@web.middleware
async def outer(request: web.Request, handler: web.Handler) -> web.StreamResponse:
    request.app[SEEN].append("outer")
    response = await handler(request)
    response.headers["x-outer"] = "1"
    return response


@web.middleware
async def inner(request: web.Request, handler: web.Handler) -> web.StreamResponse:
    request.app[SEEN].append("inner")
    return await handler(request)


async def describe(request: web.Request) -> web.Response:
    info = request.match_info
    return web.json_response(
        {
            "route": info.route.resource.canonical if info.route.resource else None,
            "method": info.route.method,
            "match": dict(info),
            "same_app": request.app is request.config_dict[SELF],
            "apps": len(info.apps),
        }
    )


async def first(request: web.Request) -> web.Response:
    return web.json_response({"which": "first"})


async def second(request: web.Request) -> web.Response:
    return web.json_response({"which": "second"})


SELF = web.AppKey("self", web.Application)


def make_app() -> web.Application:
    app = web.Application(middlewares=[outer, inner])
    app[SEEN] = []
    app[SELF] = app
    app.router.add_post("/v1/fixed", describe)
    app.router.add_get("/v1/fixed", describe)
    app.router.add_get("/v1/items/{item}", describe)
    app.router.add_post("/dup", first)
    app.router.add_get("/between", first)
    # A second resource on the same path (a resource is reused only when it is the last one).
    app.router.add_resource("/dup").add_route("POST", second)
    return app


@pytest.fixture
async def served() -> AsyncIterator[tuple[str, web.Application]]:
    app = make_app()
    runner = GatewayRunner(app, access_log=None, shutdown_timeout=1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}", app
    finally:
        await runner.cleanup()


async def test_fixed_paths_are_in_the_table_and_dynamic_ones_are_not() -> None:
    app = make_app()
    app.freeze()
    table = HotRoutes(app)._table
    assert {key for key in table} >= {("POST", "/v1/fixed"), ("GET", "/v1/fixed")}
    assert ("HEAD", "/v1/fixed") in table  # aiohttp's automatic HEAD route of a GET
    assert not any(path.startswith("/v1/items") for _, path in table)


async def test_answers_match_aiohttps_own_dispatch(served: tuple[str, web.Application]) -> None:
    root, app = served
    async with aiohttp.ClientSession() as session:
        for method in ("POST", "GET"):
            app[SEEN].clear()
            async with session.request(method, f"{root}/v1/fixed") as resp:
                assert resp.status == 200 and resp.headers["x-outer"] == "1"
                body = await resp.json()
            assert body == {
                "route": "/v1/fixed",
                "method": method,
                "match": {},
                "same_app": True,
                "apps": 1,
            }
            assert app[SEEN] == ["outer", "inner"]  # the middleware, in the app's order
        async with session.get(f"{root}/v1/items/abc") as resp:
            assert (await resp.json())["match"] == {"item": "abc"}
        async with session.post(f"{root}/dup") as resp:
            assert (await resp.json()) == {"which": "first"}
        async with session.put(f"{root}/v1/fixed") as resp:
            assert resp.status == 405
        async with session.post(f"{root}/v1/missing") as resp:
            assert resp.status == 404
        # Encoded slashes are not the path's slashes: aiohttp's router decides, and misses.
        async with session.post(f"{root}/v1%2Ffixed") as resp:
            assert resp.status == 404
        async with session.post(
            f"{root}/v1/fixed", headers={"Expect": "100-continue"}, data=b"{}"
        ) as resp:
            assert resp.status == 200
