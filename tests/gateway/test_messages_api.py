"""The Anthropic Messages API through the real app, with the official anthropic SDK as client, in
front of the mock OpenAI-compatible upstream."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import anthropic
import pytest
from pydantic import ValidationError
from redis.asyncio import Redis

from gateway.keys.records import KeyCreate
from gateway.keys.store import KeySpace, KeyStore
from gateway.settings import Settings
from gateway.tokens import estimate_prompt_tokens
from gateway.wire.messages_request import parse_count_tokens
from tests.gateway.conftest import (
    REDIS_URL,
    Gateway,
    RawResponse,
    gateway_settings,
    start_gateway,
)
from tests.messages_rules import check_messages_stream
from tests.mock_upstream import REASONING_TEXT, MockUpstream

USER = [{"role": "user", "content": "hello there world"}]
LOOKUP = {
    "name": "lookup",
    "description": "Look something up",
    "input_schema": {"type": "object", "properties": {"query": {"type": "string"}}},
}


@pytest.fixture
async def gw(mock_upstream: MockUpstream, redis_prefix: str) -> AsyncIterator[MessagesGateway]:
    mock = {"kind": "openai", "base_url": mock_upstream.base_url, "idle_timeout_s": 5}
    settings = gateway_settings(
        mock_upstream,
        redis_prefix,
        server={"host": "127.0.0.1", "port": 0, "max_body_bytes": 64 * 1024, "keepalive_s": 0.05},
        providers={"mock": mock, "history": {**mock, "send_reasoning_history": True}},
        models={
            "echo-model": {"routes": [{"provider": "mock", "model": "echo"}]},
            "reasoner-model": {"routes": [{"provider": "mock", "model": "echo", "thinking": True}]},
            "thinker": {"routes": [{"provider": "history", "model": "reasoning-content"}]},
            "tools-model": {"routes": [{"provider": "mock", "model": "tools"}]},
            "stall-model": {"routes": [{"provider": "mock", "model": "stall"}]},
        },
        model_patterns={"claude-*haiku*": "echo-model", "claude-*": "reasoner-model"},
        messages={"signing_secret": "test-signing-secret"},
    )
    runner, root = await start_gateway(settings)
    redis = Redis.from_url(REDIS_URL)
    secret, _ = await KeyStore(redis, prefix=redis_prefix).create(KeyCreate(name="tests"))
    await redis.aclose()
    gateway = MessagesGateway(root, secret, mock_upstream, runner.app, redis_prefix, 64 * 1024)
    try:
        yield gateway
    finally:
        for made in gateway.clients:
            await made.close()
        await runner.cleanup()


@dataclass
class MessagesGateway(Gateway):
    clients: list[anthropic.AsyncAnthropic] = field(default_factory=list)

    def client(self, **kw: Any) -> anthropic.AsyncAnthropic:
        """An anthropic SDK client of this gateway, closed with the fixture."""
        kw.setdefault("max_retries", 0)
        made = anthropic.AsyncAnthropic(
            base_url=self.root, api_key=kw.pop("api_key", self.key), **kw
        )
        self.clients.append(made)
        return made


async def post(
    gw: MessagesGateway, body: bytes, headers: dict[str, str] | None = None
) -> RawResponse:
    hdrs = {"x-api-key": gw.key} if headers is None else headers
    return await gw.post_bytes(body, path="/v1/messages", headers=hdrs)


async def raw_stream(gw: MessagesGateway, body: dict[str, Any], path: str = "/v1/messages") -> Any:
    resp = await gw.post_bytes(
        json.dumps({**body, "stream": True}).encode(), path=path, headers={"x-api-key": gw.key}
    )
    assert resp.status == 200, resp.body
    assert resp.headers["Content-Type"].startswith("text/event-stream")
    return check_messages_stream(resp.body)


async def test_create_answers_text_with_usage(gw: MessagesGateway) -> None:
    msg = await gw.client().messages.create(model="echo-model", max_tokens=100, messages=USER)
    assert [b.type for b in msg.content] == ["text"]
    assert msg.content[0].text == "hello there world"  # type: ignore[union-attr]
    assert msg.stop_reason == "end_turn" and msg.model == "echo-model"
    assert msg.usage.input_tokens == 4 and msg.usage.output_tokens == 3
    assert msg.usage.cache_read_input_tokens == 0
    assert msg._request_id and msg.id == "msg_" + msg._request_id
    sent = gw.mock.requests[-1].body
    assert sent["messages"] == USER and sent["max_tokens"] == 100


async def test_cached_prompt_tokens_are_cache_reads(gw: MessagesGateway) -> None:
    msg = await gw.client().messages.create(
        model="mock/echo-cached-3", max_tokens=100, messages=USER
    )
    assert msg.usage.input_tokens == 1 and msg.usage.cache_read_input_tokens == 3
    assert msg.usage.cache_creation_input_tokens == 0


async def test_tool_use_without_streaming(gw: MessagesGateway) -> None:
    msg = await gw.client().messages.create(
        model="mock/tools-calls-2",
        max_tokens=100,
        messages=[{"role": "user", "content": "find cats"}],
        tools=[LOOKUP],  # type: ignore[list-item]
    )
    assert msg.stop_reason == "tool_use"
    assert [(b.type, b.id, b.input) for b in msg.content] == [  # type: ignore[union-attr]
        ("tool_use", f"call_mock{i}", {"query": "find cats"}) for i in range(2)
    ]


async def test_claude_ids_map_by_pattern_and_are_echoed(gw: MessagesGateway) -> None:
    c = gw.client()
    msg = await c.messages.create(model="claude-sonnet-4-7-20260101", max_tokens=50, messages=USER)
    assert msg.model == "claude-sonnet-4-7-20260101"
    assert gw.mock.requests[-1].body["thinking"] == {"type": "enabled"}  # reasoner-model
    await c.messages.create(model="claude-3-5-haiku-20241022", max_tokens=50, messages=USER)
    assert "thinking" not in gw.mock.requests[-1].body  # echo-model: the client's choice
    await gw.settled()
    redis = Redis.from_url(REDIS_URL)
    entries = [f for _, f in await redis.xrange(KeySpace(gw.prefix).usage_log())]
    await redis.aclose()
    assert [e[b"model"] for e in entries] == [b"reasoner-model", b"echo-model"]


async def test_stream_helpers_and_event_protocol(gw: MessagesGateway) -> None:
    async with gw.client().messages.stream(
        model="echo-model", max_tokens=100, messages=USER
    ) as stream:
        texts = [text async for text in stream.text_stream]
        final = await stream.get_final_message()
    assert "".join(texts) == "hello there world"
    assert final.content[0].text == "hello there world"  # type: ignore[union-attr]
    assert final.stop_reason == "end_turn" and final.usage.output_tokens == 3
    raw = await raw_stream(gw, {"model": "echo-model", "max_tokens": 100, "messages": USER})
    assert raw.names[:2] == ["message_start", "ping"]
    assert raw.names[-2:] == ["message_delta", "message_stop"]
    assert raw.blocks == [{"type": "text", "text": "hello there world"}]
    assert raw.usage["input_tokens"] == 4 and raw.usage["output_tokens"] == 3


async def test_pings_fill_silences(gw: MessagesGateway) -> None:
    body = {"model": "mock/echo-chunks-3-gap-0.3", "max_tokens": 100, "messages": USER}
    raw = await raw_stream(gw, body, path="/messages?beta=true")
    between = raw.names[raw.names.index("content_block_start") : -2]
    assert "ping" in between and raw.blocks[0]["text"] == "hello there world"


async def test_system_blocks_and_system_role_messages_lead(gw: MessagesGateway) -> None:
    body = {
        "model": "echo-model",
        "max_tokens": 64,
        "system": [
            {"type": "text", "text": "First.", "cache_control": {"type": "ephemeral"}},
            {"type": "text", "text": "Second."},
        ],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "<r>note</r>"}, USER[0]]},
            {"role": "system", "content": "Late system."},
            {"role": "user", "content": "again"},
        ],
        "metadata": {"user_id": '{"session": "x"}'},
        "thinking": {"type": "adaptive"},
        "output_config": {"effort": "high"},
        "context_management": {"edits": []},
        "stop_sequences": ["zzz"],
        "temperature": 0.5,
        "top_k": 5,
    }
    body["messages"][0]["content"][1] = {"type": "text", "text": "hello there world"}
    resp = await gw.post_bytes(
        json.dumps(body).encode(),
        path="/v1/messages",
        headers={
            "Authorization": f"Bearer {gw.key}",
            "anthropic-version": "2023-06-01",
            "anthropic-beta": ",".join(f"feature-{i}-2025-01-01" for i in range(40)),
        },
    )
    assert resp.status == 200, resp.body
    sent = gw.mock.requests[-1].body
    assert sent["messages"] == [
        {"role": "system", "content": "First.\n\nSecond."},
        {"role": "system", "content": "Late system."},
        {"role": "user", "content": "<r>note</r>\n\nhello there world"},
        {"role": "user", "content": "again"},
    ]
    assert sent["stop"] == ["zzz"] and sent["temperature"] == 0.5 and sent["top_k"] == 5
    assert sent["user"] == '{"session": "x"}' and "thinking" not in sent
    assert resp.headers["request-id"] == resp.headers["x-request-id"]


async def test_tool_use_across_two_turns(gw: MessagesGateway) -> None:
    c = gw.client()
    ask = [{"role": "user", "content": "find cats"}]
    async with c.messages.stream(
        model="tools-model",
        max_tokens=100,
        messages=ask,  # type: ignore[arg-type]
        tools=[LOOKUP],  # type: ignore[list-item]
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
    ) as stream:
        first = await stream.get_final_message()
    sent = gw.mock.requests[-1].body
    assert sent["tool_choice"] == "required" and sent["parallel_tool_calls"] is False
    assert sent["tools"][0]["function"]["parameters"] == LOOKUP["input_schema"]
    assert first.stop_reason == "tool_use"
    call = first.content[0]
    assert call.type == "tool_use" and call.name == "lookup"
    assert call.input == {"query": "find cats"} and call.id == "call_mock0"
    raw = await raw_stream(
        gw, {"model": "tools-model", "max_tokens": 100, "messages": ask, "tools": [LOOKUP]}
    )
    assert raw.blocks[0]["input"] == {"query": "find cats"} and raw.stop_reason == "tool_use"

    history = [
        *ask,
        {"role": "assistant", "content": [b.model_dump() for b in first.content]},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": call.id, "content": "3 cats"},
                {"type": "text", "text": "thanks"},
            ],
        },
    ]
    second = await c.messages.create(
        model="echo-model",
        max_tokens=100,
        messages=history,  # type: ignore[arg-type]
        tools=[LOOKUP],  # type: ignore[list-item]
    )
    assert second.content[0].text == "thanks"  # type: ignore[union-attr]
    sent = gw.mock.requests[-1].body["messages"]
    assert sent[1]["tool_calls"] == [
        {
            "id": "call_mock0",
            "type": "function",
            "function": {"name": "lookup", "arguments": '{"query": "find cats"}'},
        }
    ]
    assert sent[2] == {"role": "tool", "content": "3 cats", "tool_call_id": "call_mock0"}
    assert sent[3] == {"role": "user", "content": "thanks"}


async def test_tool_result_error_and_blocks(gw: MessagesGateway) -> None:
    history = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "lookup"}]},
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "t1",
                    "is_error": True,
                    "content": [{"type": "text", "text": "boom"}],
                }
            ],
        },
    ]
    await gw.client().messages.create(
        model="echo-model",
        max_tokens=10,
        messages=history,  # type: ignore[arg-type]
        tools=[LOOKUP],  # type: ignore[list-item]
    )
    sent = gw.mock.requests[-1].body["messages"]
    assert sent[1]["tool_calls"][0]["function"]["arguments"] == "{}"
    assert sent[2] == {"role": "tool", "content": "Error: boom", "tool_call_id": "t1"}


async def test_thinking_is_signed_and_replayed_only_when_ours(gw: MessagesGateway) -> None:
    c = gw.client()
    ask = [{"role": "user", "content": "hello there world"}]
    thinking = {"type": "enabled", "budget_tokens": 1024}
    first = await c.messages.create(
        model="thinker",
        max_tokens=2000,
        messages=ask,  # type: ignore[arg-type]
        thinking=thinking,  # type: ignore[arg-type]
    )
    assert gw.mock.requests[-1].body["thinking"] == {"type": "enabled"}
    assert [b.type for b in first.content] == ["thinking", "text"]
    block = first.content[0]
    assert block.type == "thinking" and block.thinking == REASONING_TEXT
    assert block.signature.startswith("gwt1.")
    raw = await raw_stream(
        gw, {"model": "thinker", "max_tokens": 2000, "messages": ask, "thinking": thinking}
    )
    assert raw.blocks[0]["signature"] == block.signature

    async def replay(content: list[dict[str, Any]], api_key: str = gw.key) -> list[Any]:
        history = [
            *ask,
            {"role": "assistant", "content": content},
            {"role": "user", "content": "more"},
        ]
        await gw.client(api_key=api_key).messages.create(
            model="thinker",
            max_tokens=2000,
            messages=history,
            thinking=thinking,  # type: ignore[arg-type]
        )
        return list(gw.mock.requests[-1].body["messages"])

    ours = [b.model_dump() for b in first.content]
    sent = await replay(ours)
    assert sent[1]["reasoning_content"] == REASONING_TEXT
    forged = [{**ours[0], "signature": "gwt1.forged"}, ours[1]]
    assert "reasoning_content" not in (await replay(forged))[1]
    # a thinking-only assistant turn whose thinking is not trusted is left out, not refused
    sent = await replay([{**ours[0], "signature": ""}, {"type": "redacted_thinking", "data": "x"}])
    assert [m["role"] for m in sent] == ["user", "user"]
    redis = Redis.from_url(REDIS_URL)
    other, _ = await KeyStore(redis, prefix=gw.prefix).create(KeyCreate(name="other"))
    await redis.aclose()
    assert "reasoning_content" not in (await replay(ours, api_key=other))[1]

    await c.messages.create(
        model="echo-model",
        max_tokens=50,
        messages=ask,  # type: ignore[arg-type]
        thinking={"type": "disabled"},
    )
    assert gw.mock.requests[-1].body["thinking"] == {"type": "disabled"}


async def test_count_tokens_is_the_admission_estimate_upstream(gw: MessagesGateway) -> None:
    body: dict[str, Any] = {
        "model": "echo-model",
        "system": "Be brief.",
        "messages": USER,
        "tools": [LOOKUP],
    }
    counted = await gw.client().messages.count_tokens(**body)
    expected = estimate_prompt_tokens(parse_count_tokens(body, "r", lambda t, s: False))
    assert counted.input_tokens == expected > 0
    resp = await gw.post_bytes(
        json.dumps({"model": "claude-opus-4-1", "messages": USER, "tools": []}).encode(),
        path="/messages/count_tokens?beta=true",
        headers={"x-api-key": gw.key},
    )
    assert resp.status == 200 and json.loads(resp.body)["input_tokens"] > 0
    assert not [r for r in gw.mock.requests if r.path.endswith("/chat/completions")]


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
    await gw.settled()
    redis = Redis.from_url(REDIS_URL)
    entries = [f for _, f in await redis.xrange(KeySpace(gw.prefix).usage_log())]
    await redis.aclose()
    assert len(entries) == 1 and entries[0][b"status"] == b"499"
    assert entries[0][b"error_code"] == b"client_disconnected"
    assert entries[0][b"completion_tokens"] == b"1"


def test_a_model_pattern_must_name_a_configured_model() -> None:
    models = {"chat": {"routes": [{"provider": "mock", "model": "echo"}]}}
    providers = {"mock": {"kind": "openai", "base_url": "http://127.0.0.1:1/v1"}}
    Settings(use_presets=False, providers=providers, models=models, model_patterns={"c-*": "chat"})
    with pytest.raises(ValidationError, match="unknown model 'nope'"):
        Settings(
            use_presets=False, providers=providers, models=models, model_patterns={"c-*": "nope"}
        )
