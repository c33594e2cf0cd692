"""Providers of kind "anthropic": a Messages request passes through with nothing lost, and chat
requests are translated both ways; through the real app, with the official SDKs as clients."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import anthropic
import openai
import pytest
from redis.asyncio import Redis

from gateway.keys.records import KeyCreate
from gateway.keys.store import KeyStore
from testkit.gateway_app import REDIS_URL, gateway_settings, start_gateway
from testkit.mock_anthropic import SIGNATURE, MockAnthropic
from testkit.mock_upstream import MockUpstream

KEY_ENV = "TEST_MOCK_ANTHROPIC_KEY"


@pytest.fixture
async def mock_anthropic() -> AsyncIterator[MockAnthropic]:
    mock = MockAnthropic()
    await mock.start()
    yield mock
    await mock.stop()


@pytest.fixture
async def live(
    mock_upstream: MockUpstream,
    mock_anthropic: MockAnthropic,
    redis_prefix: str,
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[tuple[str, str]]:
    monkeypatch.setenv(KEY_ENV, mock_anthropic.api_key)
    provider = {
        "kind": "anthropic",
        "base_url": mock_anthropic.base_url,
        "api_key_env": KEY_ENV,
        "direct_models": ["*"],
    }
    settings = gateway_settings(
        mock_upstream,
        redis_prefix,
        providers={"anth": provider},
        models={m: {"routes": [{"provider": "anth", "model": m}]} for m in ("think", "text")}
        | {"forced": {"routes": [{"provider": "anth", "model": "text", "thinking": True}]}},
        model_patterns={"claude-*": "think"},
    )
    runner, root = await start_gateway(settings)
    redis = Redis.from_url(REDIS_URL)
    secret, _ = await KeyStore(redis, prefix=redis_prefix).create(KeyCreate(name="tests"))
    await redis.aclose()
    try:
        yield root, secret
    finally:
        await runner.cleanup()


async def test_messages_pass_through_with_the_upstreams_signatures(
    live: tuple[str, str], mock_anthropic: MockAnthropic
) -> None:
    root, key = live
    body: dict[str, Any] = {
        "model": "claude-opus-4-7",
        "max_tokens": 2000,
        "system": [{"type": "text", "text": "Sys", "cache_control": {"type": "ephemeral"}}],
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [{"type": "web_search_20250305", "name": "web_search"}],
        "thinking": {"type": "enabled", "budget_tokens": 1024},
    }
    extra = {"context_management": {"edits": []}}  # a field this SDK version does not know
    async with anthropic.AsyncAnthropic(base_url=root, api_key=key, max_retries=0) as client:
        first = await client.messages.create(**body, extra_body=extra)
        headers, sent = mock_anthropic.requests[-1]
        assert headers["x-api-key"] == mock_anthropic.api_key
        assert headers["anthropic-version"] == "2023-06-01"
        # nothing lost; a JSON client's answer is asked for non-streamed (answer_timeout_s)
        assert sent == {**body, **extra, "model": "think", "stream": False}
        assert [b.type for b in first.content] == ["thinking", "text"]
        assert first.content[0].signature == SIGNATURE  # type: ignore[union-attr]
        assert first.usage.input_tokens == 10 and first.usage.cache_read_input_tokens == 2
        assert first.model == "claude-opus-4-7"

        ours = {"type": "thinking", "thinking": "older", "signature": "gwt1.abc"}
        history = [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": [ours]},
            {"role": "user", "content": "again"},
            {"role": "assistant", "content": [b.model_dump() for b in first.content]},
            {"role": "user", "content": "more"},
        ]
        async with client.messages.stream(**{**body, "messages": history}) as stream:
            final = await stream.get_final_message()
    replayed = mock_anthropic.requests[-1][1]["messages"]
    assert [m["role"] for m in replayed] == ["user", "user", "assistant", "user"]
    assert replayed[2]["content"][0]["signature"] == SIGNATURE  # the upstream's, intact
    assert final.content[0].signature == SIGNATURE  # type: ignore[union-attr]


async def test_chat_is_translated_both_ways(
    live: tuple[str, str], mock_anthropic: MockAnthropic
) -> None:
    root, key = live
    tool = {
        "type": "function",
        "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}},
    }
    async with openai.AsyncOpenAI(base_url=f"{root}/v1", api_key=key, max_retries=0) as client:
        resp = await client.chat.completions.create(
            model="anth/tool",
            messages=[
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "find x"},
            ],
            tools=[tool],  # type: ignore[list-item]
            tool_choice="required",
            max_tokens=100,
            stop=["END"],
        )
        _, sent = mock_anthropic.requests[-1]
        assert sent["system"] == "Be brief." and sent["stop_sequences"] == ["END"]
        assert sent["messages"] == [
            {"role": "user", "content": [{"type": "text", "text": "find x"}]}
        ]
        assert sent["tools"] == [{"name": "lookup", "input_schema": tool["function"]["parameters"]}]  # type: ignore[index]
        assert sent["tool_choice"] == {"type": "any"} and sent["max_tokens"] == 100
        choice = resp.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
        call = choice.message.tool_calls[0]
        assert call.id == "toolu_1" and json.loads(call.function.arguments) == {"q": "x"}  # type: ignore[union-attr]
        assert resp.usage is not None and resp.usage.prompt_tokens == 12

        stream = await client.chat.completions.create(
            model="forced",
            messages=[
                {"role": "user", "content": "q"},
                {
                    "role": "assistant",
                    "tool_calls": [
                        {
                            "id": "t1",
                            "type": "function",
                            "function": {"name": "lookup", "arguments": "{}"},
                        }
                    ],
                },  # type: ignore[list-item]
                {"role": "tool", "tool_call_id": "t1", "content": "r"},
            ],
            max_tokens=3000,
            stream=True,
        )
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert text == "Hello from Anthropic"
    _, sent = mock_anthropic.requests[-1]
    assert sent["thinking"] == {"type": "enabled", "budget_tokens": 1500}
    assert sent["messages"][1]["content"] == [
        {"type": "tool_use", "id": "t1", "name": "lookup", "input": {}}
    ]
    assert sent["messages"][2]["content"] == [
        {"type": "tool_result", "tool_use_id": "t1", "content": "r"}
    ]


async def test_upstream_errors_keep_their_meaning(live: tuple[str, str]) -> None:
    root, key = live
    async with openai.AsyncOpenAI(base_url=f"{root}/v1", api_key=key, max_retries=0) as client:
        with pytest.raises(openai.RateLimitError) as limited:
            await client.chat.completions.create(
                model="anth/fail-429", messages=[{"role": "user", "content": "x"}]
            )
        assert limited.value.response.headers["retry-after"] == "3"
        stream = await client.chat.completions.create(
            model="anth/overload", messages=[{"role": "user", "content": "x"}], stream=True
        )
        with pytest.raises(openai.APIError):
            async for _ in stream:
                pass
        with pytest.raises(openai.BadRequestError, match="legacy completions"):
            await client.completions.create(model="anth/text", prompt="x")
