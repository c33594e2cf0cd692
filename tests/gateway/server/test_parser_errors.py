"""Malformed HTTP that aiohttp's parser rejects before the app sees a request: the answer is
still OpenAI error JSON with an `x-request-id`, served by `GatewayRunner`."""

from __future__ import annotations

import pytest

from testkit.gateway_app import Gateway
from testkit.rawhttp import exchange

HOST = b"Host: 127.0.0.1\r\n"
BODY = b'{"model": "echo-model", "messages": [{"role": "user", "content": "hi"}]}'


def post(extra_headers: bytes, body: bytes = BODY) -> bytes:
    return b"POST /v1/chat/completions HTTP/1.1\r\n" + HOST + extra_headers + b"\r\n" + body


BIG = b"a" * 70000
MALFORMED = {
    "oversized header": b"GET /v1/models HTTP/1.1\r\n" + HOST + b"X-Big: " + BIG + b"\r\n\r\n",
    "oversized url": b"GET /v1/models?q=" + BIG + b" HTTP/1.1\r\n" + HOST + b"\r\n",
    "nul in a header": b"GET /v1/models HTTP/1.1\r\n" + HOST + b"X-Nul: a\x00b\r\n\r\n",
    "conflicting content-length": post(b"Content-Length: 5\r\nContent-Length: 7\r\n"),
    "content-length and chunked": post(
        b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n", b"5\r\nhello\r\n0\r\n\r\n"
    ),
    "bad chunk size": post(b"Transfer-Encoding: chunked\r\n", b"zz\r\nhello\r\n0\r\n\r\n"),
    "unknown method": b"FETCH\x01 /v1/models HTTP/1.1\r\n" + HOST + b"\r\n",
    "garbage request line": b"\x16\x03\x01 garbage garbage\r\n\r\n",
    "bad version": b"GET /v1/models HTTP/9.Z\r\n" + HOST + b"\r\n",
    "header without colon": b"GET /v1/models HTTP/1.1\r\n" + HOST + b"NoColonHere\r\n\r\n",
}


@pytest.mark.parametrize("raw", MALFORMED.values(), ids=MALFORMED.keys())
async def test_parser_errors_are_openai_error_json_with_a_request_id(
    gateway: Gateway, raw: bytes
) -> None:
    answer = await exchange(gateway.root, raw)
    assert 400 <= answer.status < 500, answer.body
    assert answer.headers["x-request-id"].startswith("req_")
    assert answer.headers["Content-Type"].startswith("application/json")
    error = answer.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"]
    assert b"aaaa" not in answer.body  # the offending line is not echoed back


async def test_the_gateway_serves_the_next_connection_after_a_parser_error(
    gateway: Gateway,
) -> None:
    await exchange(gateway.root, MALFORMED["garbage request line"])
    client = gateway.async_client()
    models = await client.models.list()
    assert [m.id for m in models.data]
