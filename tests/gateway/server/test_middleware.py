"""The error middleware on its own: what a failing dependency looks like to a client."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from redis.exceptions import ConnectionError as RedisConnectionError

from gateway.server.middleware import add_request_id, error_middleware


async def _redis_down(request: web.Request) -> web.Response:
    raise RedisConnectionError("Connection refused")


async def _bug(request: web.Request) -> web.Response:
    raise KeyError("oops")


@pytest.fixture
async def client() -> AsyncIterator[TestClient[web.Request, web.Application]]:
    app = web.Application(middlewares=[error_middleware])
    app.on_response_prepare.append(add_request_id)
    app.router.add_get("/redis", _redis_down)
    app.router.add_get("/bug", _bug)
    async with TestClient(TestServer(app)) as test_client:
        yield test_client


async def test_redis_outage_is_503_with_retry_after(
    client: TestClient[web.Request, web.Application],
) -> None:
    resp = await client.get("/redis")
    assert resp.status == 503 and resp.headers["Retry-After"] == "1"
    error = (await resp.json())["error"]
    assert error["code"] == "state_store_unavailable" and "Connection refused" not in str(error)
    assert resp.headers["x-request-id"]


async def test_a_bug_is_a_500_in_openai_error_json_without_details(
    client: TestClient[web.Request, web.Application],
) -> None:
    resp = await client.get("/bug")
    assert resp.status == 500
    assert (await resp.json())["error"] == {
        "message": "Internal server error.",
        "type": "api_error",
        "param": None,
        "code": "internal_error",
    }
