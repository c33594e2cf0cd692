"""The Anthropic Messages API through the real app, with the official anthropic SDK as client, in
front of the mock OpenAI-compatible upstream: answers, streams, tools, thinking, count_tokens."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError
from redis.asyncio import Redis

from gateway.config.settings import Settings
from gateway.keys.records import KeyCreate
from gateway.keys.store import KeyStore
from gateway.pipeline.prompt_estimates import estimate_prompt_tokens
from gateway.wire.messages_request import parse_count_tokens
from testkit.gateway_app import REDIS_URL
from testkit.mock_scenarios import REASONING_TEXT
from tests.support.messages_gateway import (
    LOOKUP,
    USER,
    MessagesGateway,
    raw_stream,
    usage_records,
)


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
    entries = await usage_records(gw)
    assert [e[b"model"] for e in entries] == [b"reasoner-model", b"echo-model"]
    card = await c.models.retrieve("claude-3-5-haiku-20241022")  # retrievable as asked for
    assert card.id == "claude-3-5-haiku-20241022"


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
    assert "ping" in between and raw.blocks[0]["text"] == "hello there world", raw.names


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


async def test_images_in_parallel_tool_results_follow_them_in_a_user_message(
    gw: MessagesGateway,
) -> None:
    """Claude Code's Read of an image file answers with an image inside the tool_result; tool
    messages carry text only, so the images open the user message after the results."""
    png = {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}
    calls = [{"type": "tool_use", "id": f"t{i}", "name": "lookup", "input": {}} for i in (1, 2)]
    history = [
        {"role": "user", "content": "look at both"},
        {"role": "assistant", "content": calls},
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "t1",
                    "content": [
                        {"type": "text", "text": "a cat"},
                        {"type": "image", "source": png},
                    ],
                },
                {"type": "tool_result", "tool_use_id": "t2", "content": "no image here"},
                {"type": "text", "text": "which is nicer?", "cache_control": {"type": "ephemeral"}},
            ],
        },
    ]
    answer = await gw.client().messages.create(
        model="echo-model",
        max_tokens=10,
        messages=history,  # type: ignore[arg-type]
        tools=[LOOKUP],  # type: ignore[list-item]
    )
    assert answer.stop_reason == "end_turn"
    sent = gw.mock.requests[-1].body["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "tool", "tool", "user"]
    assert sent[2] == {"role": "tool", "content": "a cat", "tool_call_id": "t1"}
    assert sent[3] == {"role": "tool", "content": "no image here", "tool_call_id": "t2"}
    assert sent[4]["content"] == [
        {"type": "text", "text": "Images returned by tool call t1:"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
        {"type": "text", "text": "which is nicer?"},
    ]


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


def test_a_model_pattern_must_name_a_configured_model() -> None:
    models = {"chat": {"routes": [{"provider": "mock", "model": "echo"}]}}
    providers = {"mock": {"kind": "openai", "base_url": "http://127.0.0.1:1/v1"}}
    Settings(use_presets=False, providers=providers, models=models, model_patterns={"c-*": "chat"})
    with pytest.raises(ValidationError, match="unknown model 'nope'"):
        Settings(
            use_presets=False, providers=providers, models=models, model_patterns={"c-*": "nope"}
        )
