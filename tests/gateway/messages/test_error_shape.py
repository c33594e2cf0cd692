"""The error middleware renders the one exception hierarchy in Anthropic's shape on the Messages
paths: what the anthropic SDK sees for failures the mock upstream cannot produce."""

from __future__ import annotations

from collections.abc import AsyncIterator

import anthropic
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from redis.exceptions import ConnectionError as RedisConnectionError

from gateway.errors import GatewayTimeout, QuotaExceeded, ServiceUnavailable
from gateway.server.middleware import add_request_id, error_middleware

FAILURES: dict[str, Exception] = {
    "redis": RedisConnectionError("Connection refused"),
    "overloaded": ServiceUnavailable(
        "engine full", code="overloaded", headers={"Retry-After": "2"}
    ),
    "timeout": GatewayTimeout("upstream slow"),
    "quota": QuotaExceeded("budget spent"),
    "bug": KeyError("oops"),
}


async def _fail(request: web.Request) -> web.Response:
    raise FAILURES[request.headers["x-fail"]]


@pytest.fixture
async def sdk() -> AsyncIterator[anthropic.AsyncAnthropic]:
    app = web.Application(middlewares=[error_middleware])
    app.on_response_prepare.append(add_request_id)
    app.router.add_post("/v1/messages", _fail)
    async with TestServer(app, host="127.0.0.1") as server:
        client = anthropic.AsyncAnthropic(
            base_url=str(server.make_url("")), api_key="k", max_retries=0
        )
        yield client
        await client.close()


async def _error(sdk: anthropic.AsyncAnthropic, failure: str) -> anthropic.APIStatusError:
    with pytest.raises(anthropic.APIStatusError) as caught:
        await sdk.messages.create(
            model="m",
            max_tokens=1,
            messages=[{"role": "user", "content": "hi"}],
            extra_headers={"x-fail": failure},
        )
    assert caught.value.response.headers["request-id"]
    return caught.value


@pytest.mark.parametrize("failure", ["redis", "overloaded"])
async def test_unavailable_is_529_overloaded(sdk: anthropic.AsyncAnthropic, failure: str) -> None:
    error = await _error(sdk, failure)
    assert isinstance(error, anthropic.OverloadedError) and error.status_code == 529
    assert error.body == {"type": "error", "error": {"type": "overloaded_error", "message": ANY}}
    assert error.response.headers["retry-after"]


@pytest.mark.parametrize(
    ("failure", "status", "kind"),
    [
        ("timeout", 504, "timeout_error"),
        ("quota", 429, "rate_limit_error"),
        ("bug", 500, "api_error"),
    ],
)
async def test_status_and_type(
    sdk: anthropic.AsyncAnthropic, failure: str, status: int, kind: str
) -> None:
    error = await _error(sdk, failure)
    assert error.status_code == status
    assert error.body["error"]["type"] == kind  # type: ignore[index]


class _Any:
    def __eq__(self, other: object) -> bool:
        return isinstance(other, str) and bool(other)


ANY = _Any()
