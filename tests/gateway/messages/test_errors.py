"""Errors on the Messages API in Anthropic's shape, through the real app and the anthropic SDK: the
gateway's one exception hierarchy, a failure mid-stream, a client that leaves mid-stream."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import pytest
from redis.asyncio import Redis

from gateway.keys.records import KeyCreate
from gateway.keys.store import KeyStore
from testkit.gateway_app import REDIS_URL
from tests.support.messages_gateway import (
    USER,
    MessagesGateway,
    post,
    raw_stream,
    usage_records,
)


def _error(body: bytes) -> dict[str, Any]:
    payload = json.loads(body)
    assert payload["type"] == "error" and set(payload["error"]) == {"type", "message"}
    return dict(payload["error"])


async def test_every_error_in_anthropic_shape(gw: MessagesGateway) -> None:
    c = gw.client()
    with pytest.raises(anthropic.AuthenticationError) as auth:
        await gw.client(api_key="sk-wrong").messages.create(
            model="echo-model", max_tokens=5, messages=USER
        )
    assert auth.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]
    with pytest.raises(anthropic.NotFoundError) as missing:
        await c.messages.create(model="no-such-model", max_tokens=5, messages=USER)
    assert missing.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    with pytest.raises(anthropic.RateLimitError) as limited:
        await c.messages.create(model="mock/fail-429", max_tokens=5, messages=USER)
    assert limited.value.response.headers["retry-after"] == "7"
    assert limited.value.body["error"]["type"] == "rate_limit_error"  # type: ignore[index]
    with pytest.raises(anthropic.InternalServerError) as failed:
        await c.messages.create(model="mock/fail-500", max_tokens=5, messages=USER)
    assert failed.value.status_code == 502
    assert failed.value.body["error"]["type"] == "api_error"  # type: ignore[index]
    with pytest.raises(anthropic.BadRequestError) as bad:
        await c.messages.create(model="mock/fail-400", max_tokens=5, messages=USER)
    assert bad.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]

    for body, named in (
        ({"model": "echo-model", "messages": USER}, "max_tokens"),
        ({"model": "echo-model", "max_tokens": 5, "messages": [{"role": "tool"}]}, "messages"),
        ({"model": "echo-model", "max_tokens": 5, "messages": USER, "temperature": 3}, "temp"),
        (
            {
                "model": "echo-model",
                "max_tokens": 5,
                "messages": [{"role": "user", "content": [{"type": "document"}]}],
            },
            "document",
        ),
        (
            {
                "model": "echo-model",
                "max_tokens": 100,
                "messages": USER,
                "thinking": {"type": "enabled", "budget_tokens": 100},
            },
            "budget_tokens",
        ),
        ({"model": "echo-model", "max_tokens": 2**60, "messages": USER}, "max_tokens"),
        (
            {
                "model": "echo-model",
                "max_tokens": 5,
                "messages": USER,
                "thinking": {"type": "enabled", "budget_tokens": 10**30},
            },
            "budget_tokens",
        ),
        ({"model": "echo-model", "max_tokens": 5, "messages": USER, "top_k": 2**40}, "top_k"),
    ):
        resp = await post(gw, json.dumps(body).encode())
        assert resp.status == 400, body
        error = _error(resp.body)
        assert error["type"] == "invalid_request_error" and named in error["message"]
        assert resp.headers["request-id"]
    resp = await post(gw, b"{not json")
    assert resp.status == 400 and _error(resp.body)["type"] == "invalid_request_error"
    resp = await post(gw, b"x" * (gw.max_body_bytes + 1))
    assert resp.status == 413 and _error(resp.body)["type"] == "request_too_large"
    resp = await post(gw, b"{}", {})
    assert resp.status == 401 and _error(resp.body)["type"] == "authentication_error"

    redis = Redis.from_url(REDIS_URL)
    narrow, _ = await KeyStore(redis, prefix=gw.prefix).create(
        KeyCreate(name="narrow", models=["echo-model"])
    )
    await redis.aclose()
    with pytest.raises(anthropic.PermissionDeniedError) as denied:
        await gw.client(api_key=narrow).messages.create(
            model="claude-sonnet-4-7", max_tokens=5, messages=USER
        )
    assert denied.value.body["error"]["type"] == "permission_error"  # type: ignore[index]
    # the other protocols keep OpenAI error JSON
    resp = await gw.post_raw({"model": "no-such-model", "messages": USER})
    assert resp.status == 404 and json.loads(resp.body)["error"]["code"] == "model_not_found"


async def test_failure_mid_stream_is_an_error_event(gw: MessagesGateway) -> None:
    body = {"model": "mock/error-midstream", "max_tokens": 50, "messages": USER}
    raw = await raw_stream(gw, body)
    assert raw.error is not None and raw.error["type"] == "api_error"
    assert "message_stop" not in raw.names and "content_block_stop" not in raw.names
    with pytest.raises(anthropic.APIStatusError):
        async with gw.client().messages.stream(**body) as stream:  # type: ignore[arg-type]
            await stream.get_final_message()


async def test_client_leaving_mid_stream_is_settled(gw: MessagesGateway) -> None:
    c = gw.client()
    async with c.messages.stream(model="stall-model", max_tokens=50, messages=USER) as stream:
        async for event in stream:
            if event.type == "content_block_delta":
                break
    await gw.mock.wait_disconnect()
    entries = await usage_records(gw)
    assert len(entries) == 1 and entries[0][b"status"] == b"499"
    assert entries[0][b"error_code"] == b"client_disconnected"
    assert entries[0][b"completion_tokens"] == b"1"


async def test_a_body_that_does_not_match_its_encoding_is_a_400_in_anthropic_shape(
    gw: MessagesGateway,
) -> None:
    body = json.dumps({"model": "echo-model", "max_tokens": 5, "messages": USER}).encode()
    resp = await post(gw, body, {"x-api-key": gw.key, "Content-Encoding": "gzip"})
    assert resp.status == 400 and resp.headers["request-id"] == resp.headers["x-request-id"]
    assert _error(resp.body)["type"] == "invalid_request_error"
