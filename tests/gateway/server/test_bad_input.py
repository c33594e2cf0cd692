"""Hostile input over every route of a live gateway: each is a 4xx in OpenAI error JSON with an
`x-request-id`, never a 500 or silence."""

from __future__ import annotations

import gzip
import json
import uuid
import zlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from testkit.gateway_app import Gateway, gateway_settings, start_gateway
from testkit.mock_upstream import MockUpstream
from testkit.rawhttp import RawAnswer, exchange, request_bytes

ADMIN_KEY = "admin-" + uuid.uuid4().hex
CHAT = {"model": "echo-model", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
async def admin_gateway(mock_upstream: MockUpstream, redis_prefix: str) -> AsyncIterator[Gateway]:
    settings = gateway_settings(mock_upstream, redis_prefix, admin={"api_key": ADMIN_KEY})
    runner, root = await start_gateway(settings)
    try:
        yield Gateway(root, "", mock_upstream, runner.app, redis_prefix, 64 * 1024)
    finally:
        await runner.cleanup()


def assert_openai_error(answer: RawAnswer, status: int) -> dict[str, Any]:
    assert answer.status == status, answer.body[:300]
    assert answer.headers["x-request-id"]
    assert answer.headers["Content-Type"].startswith("application/json")
    error = answer.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    return dict(error)


NOT_UTF8 = b"Bearer sk-\xff\xfe\xc3("


@pytest.mark.parametrize(
    ("method", "path", "header", "value"),
    [
        ("POST", "/v1/chat/completions", "Authorization", NOT_UTF8),
        ("POST", "/v1/chat/completions", "x-api-key", b"sk-\xff\xfe"),
        ("POST", "/v1/responses", "Authorization", NOT_UTF8),
        ("GET", "/v1/models", "Authorization", NOT_UTF8),
        ("GET", "/v1/models", "x-api-key", b"\x80\x81"),
        ("GET", "/admin/keys", "Authorization", NOT_UTF8),
        ("GET", "/admin/keys", "Authorization", b"Bearer \xe9" + ADMIN_KEY.encode()),
    ],
)
async def test_credentials_that_are_not_utf8_are_401(
    admin_gateway: Gateway, method: str, path: str, header: str, value: bytes
) -> None:
    body = json.dumps(CHAT).encode() if method == "POST" else b""
    headers: dict[str, bytes | str] = {header: value, "Content-Type": "application/json"}
    headers["Content-Length"] = str(len(body))
    answer = await exchange(admin_gateway.root, request_bytes(method, path, headers, body))
    assert_openai_error(answer, 401)


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "br"])
async def test_a_body_that_does_not_match_its_content_encoding_is_400(
    gateway: Gateway, encoding: str, caplog: pytest.LogCaptureFixture
) -> None:
    resp = await gateway.post_bytes(
        json.dumps(CHAT).encode(), headers={**gateway.auth_headers(), "Content-Encoding": encoding}
    )
    assert resp.status == 400 and resp.headers["x-request-id"]
    assert json.loads(resp.body)["error"]["type"] == "invalid_request_error"
    # Answered, and not also logged as an unhandled error once the answer was out.
    assert not [r for r in caplog.records if r.name == "aiohttp.server"]


@pytest.mark.parametrize("compress", [gzip.compress, zlib.compress])
async def test_a_compressed_body_is_still_served(gateway: Gateway, compress: Any) -> None:
    encoding = "gzip" if compress is gzip.compress else "deflate"
    resp = await gateway.post_bytes(
        compress(json.dumps(CHAT).encode()),
        headers={**gateway.auth_headers(), "Content-Encoding": encoding},
    )
    assert resp.status == 200, resp.body


OUT_OF_RANGE = ["0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00"]


@pytest.mark.parametrize("moment", OUT_OF_RANGE)
async def test_out_of_range_datetimes_are_400_naming_the_field(
    admin_gateway: Gateway, moment: str
) -> None:
    auth = {"Authorization": f"Bearer {ADMIN_KEY}"}
    root = admin_gateway.root
    created = await admin_gateway.post_bytes(
        json.dumps({"name": "k", "expires_at": moment}).encode(), path="/admin/keys", headers=auth
    )
    assert created.status == 400 and json.loads(created.body)["error"]["param"] == "expires_at"
    ok = await admin_gateway.post_bytes(b'{"name": "k"}', path="/admin/keys", headers=auth)
    key_id = json.loads(ok.body)["id"]
    patch = json.dumps({"expires_at": moment}).encode()
    headers: dict[str, bytes | str] = {**auth, "Content-Length": str(len(patch))}
    patched = await exchange(root, request_bytes("PATCH", f"/admin/keys/{key_id}", headers, patch))
    assert assert_openai_error(patched, 400)["param"] == "expires_at"
    for field in ("start", "end"):
        query = f"/admin/usage?{field}={moment.replace('+', '%2B')}"
        answer = await exchange(root, request_bytes("GET", query, auth))
        assert assert_openai_error(answer, 400)["param"] == field


@pytest.mark.parametrize(
    ("path", "field", "value"),
    [
        ("/v1/chat/completions", "max_tokens", 2**63),
        ("/v1/chat/completions", "max_tokens", 2**64),
        ("/v1/chat/completions", "max_completion_tokens", 2**63),
        ("/v1/chat/completions", "max_tokens", 2**31),
        ("/v1/chat/completions", "seed", 2**63),
        ("/v1/chat/completions", "seed", -(2**63) - 1),
        ("/v1/chat/completions", "top_k", 2**40),
        ("/v1/chat/completions", "n", 2**63),
        ("/v1/chat/completions", "top_logprobs", 2**63),
        ("/v1/completions", "max_tokens", 2**63),
        ("/v1/completions", "logprobs", 2**63),
        ("/v1/responses", "max_output_tokens", 2**63),
    ],
)
async def test_integers_beyond_what_the_model_and_lua_carry_are_400_naming_them(
    gateway: Gateway, path: str, field: str, value: int
) -> None:
    base: dict[str, Any] = {"model": "echo-model"}
    if path == "/v1/chat/completions":
        base["messages"] = CHAT["messages"]
    else:
        base["prompt" if path == "/v1/completions" else "input"] = "hi"
    seen = len(gateway.mock.requests)
    resp = await gateway.post_raw({**base, field: value}, path=path)
    assert resp.status == 400, resp.body
    assert json.loads(resp.body)["error"]["param"] == field
    assert len(gateway.mock.requests) == seen  # nothing reached the upstream


async def test_the_largest_allowed_max_tokens_reaches_the_upstream_intact(
    gateway: Gateway,
) -> None:
    resp = await gateway.post_raw({**CHAT, "max_tokens": 2**24, "seed": 2**63 - 1})
    assert resp.status == 200, resp.body
    sent = gateway.mock.requests[-1].body
    assert sent["max_tokens"] == 2**24 and sent["seed"] == 2**63 - 1


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/responses", "/v1/completions"])
async def test_a_declared_length_beyond_the_limit_is_413_before_any_body(
    gateway: Gateway, path: str
) -> None:
    headers: dict[str, bytes | str] = {
        **gateway.auth_headers(),
        "Content-Type": "application/json",
        "Content-Length": str(10 * 2**30),
    }
    answer = await exchange(gateway.root, request_bytes("POST", path, headers), deadline_s=5)
    assert_openai_error(answer, 413)


def _chunked(body: bytes, size: int) -> bytes:
    pieces = [body[i : i + size] for i in range(0, len(body), size)]
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"


async def test_a_chunked_body_is_held_to_the_limit_that_declares_no_length(
    mock_upstream: MockUpstream, redis_prefix: str
) -> None:
    """A body with no Content-Length that arrives whole with its head, and one that does not:
    beyond `max_body_bytes` each is a 413, within it each is served."""
    settings = gateway_settings(
        mock_upstream, redis_prefix, server={"max_body_bytes": 4096}, auth={"enabled": False}
    )
    runner, root = await start_gateway(settings)
    try:
        headers: dict[str, bytes | str] = {
            "Content-Type": "application/json",
            "Transfer-Encoding": "chunked",
        }
        small = json.dumps(CHAT).encode()
        big = json.dumps({**CHAT, "user": "u" * 6000}).encode()
        for body, status in ((small, 200), (big, 413)):
            raw = request_bytes("POST", "/v1/chat/completions", headers, _chunked(body, 1000))
            answer = await exchange(root, raw)
            if status == 200:
                assert answer.status == 200, answer.body[:300]
            else:
                assert assert_openai_error(answer, 413)["code"] == "payload_too_large"
    finally:
        await runner.cleanup()
