"""The OpenAI-compatible front door, driven by the official openai SDK and a raw SSE reader,
in front of the mock upstream (scenarios chosen by model name, see testkit/mock_upstream.py)."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import openai
import pytest

from testkit.gateway_app import Gateway
from testkit.mock_upstream import MockUpstream
from tests.support.sse_rules import check_chat_stream, sse_payloads

USER = [{"role": "user", "content": "alpha beta gamma delta epsilon"}]


async def test_non_stream_sync_sdk(gateway: Gateway) -> None:
    client = gateway.sync_client()
    resp = await asyncio.to_thread(
        client.chat.completions.create, model="echo-model", messages=USER
    )
    assert resp.choices[0].message.content == "alpha beta gamma delta epsilon"
    assert resp.choices[0].finish_reason == "stop"
    assert resp.model == "echo-model"
    assert resp.usage is not None and resp.usage.completion_tokens == 5
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + 5


async def test_stream_with_usage_async_sdk(gateway: Gateway) -> None:
    client = gateway.async_client()
    stream = await client.chat.completions.create(
        model="echo-model", messages=USER, stream=True, stream_options={"include_usage": True}
    )
    text, finishes, usage = "", [], None
    async for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            if chunk.choices[0].finish_reason:
                finishes.append(chunk.choices[0].finish_reason)
        if chunk.usage:
            usage = chunk.usage
    assert text == "alpha beta gamma delta epsilon"
    assert finishes == ["stop"]
    assert usage is not None and usage.completion_tokens == 5


async def test_raw_stream_obeys_every_client_rule(gateway: Gateway) -> None:
    raw = await gateway.post_raw(
        {
            "model": "echo-model",
            "messages": USER,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    )
    stream = check_chat_stream(raw.body, include_usage=True)
    assert raw.headers["Content-Type"].startswith("text/event-stream")
    assert raw.headers["x-request-id"]
    assert stream.content == "alpha beta gamma delta epsilon"
    assert stream.usage is not None and stream.usage["completion_tokens"] == 5
    assert "prompt_tokens_details" in stream.usage


async def test_stream_without_usage_has_no_usage_chunk(gateway: Gateway) -> None:
    raw = await gateway.post_raw({"model": "echo-model", "messages": USER, "stream": True})
    stream = check_chat_stream(raw.body, include_usage=False)
    assert stream.usage is None
    assert all(c["choices"] for c in stream.chunks)


async def test_tool_calls_stream_in_fragments(gateway: Gateway) -> None:
    tools = [
        {
            "type": "function",
            "function": {
                "name": "search",
                "parameters": {"type": "object", "properties": {"query": {"type": "string"}}},
            },
        }
    ]
    raw = await gateway.post_raw(
        {"model": "mock/tools-calls-2", "messages": USER, "tools": tools, "stream": True}
    )
    stream = check_chat_stream(raw.body, include_usage=False)
    assert stream.finish_reason == "tool_calls"
    assert len(stream.tool_calls) == 2
    for call in stream.tool_calls.values():
        assert call["name"] == "search"
        assert json.loads(call["arguments"]) == {"query": "alpha beta gamma delta epsilon"}
    fragments = sum(
        len(c["choices"][0]["delta"].get("tool_calls") or []) for c in stream.chunks if c["choices"]
    )
    assert fragments > 2, "arguments arrive in several fragments"

    client = gateway.async_client()
    resp = await client.chat.completions.create(model="mock/tools", messages=USER, tools=tools)
    calls = resp.choices[0].message.tool_calls
    assert resp.choices[0].finish_reason == "tool_calls"
    assert calls and calls[0].function.name == "search" and calls[0].id.startswith("call_")


@pytest.mark.parametrize("style", ["reasoning-content", "reasoning", "think-inline"])
async def test_reasoning_is_normalized_to_reasoning_content(gateway: Gateway, style: str) -> None:
    raw = await gateway.post_raw({"model": f"mock/{style}", "messages": USER, "stream": True})
    stream = check_chat_stream(raw.body, include_usage=False)
    assert "repeat them" in stream.reasoning
    assert "<think>" not in stream.content and "repeat them" not in stream.content
    assert stream.content.strip() == "alpha beta gamma delta epsilon"

    client = gateway.async_client()
    resp = await client.chat.completions.create(model=f"mock/{style}", messages=USER)
    message = resp.choices[0].message
    assert "repeat them" in (message.model_extra or {})["reasoning_content"]
    assert (message.content or "").strip() == "alpha beta gamma delta epsilon"


async def test_stop_and_max_tokens(gateway: Gateway) -> None:
    client = gateway.async_client()
    resp = await client.chat.completions.create(model="echo-model", messages=USER, max_tokens=2)
    assert resp.choices[0].finish_reason == "length"
    assert resp.choices[0].message.content.split() == ["alpha", "beta"]
    resp = await client.chat.completions.create(model="echo-model", messages=USER, stop=["gamma"])
    assert resp.choices[0].finish_reason == "stop"
    assert "gamma" not in (resp.choices[0].message.content or "")
    sent = gateway.mock.requests[-1].body
    assert sent["stop"] == ["gamma"]


async def test_legacy_completions(gateway: Gateway) -> None:
    client = gateway.async_client()
    resp = await client.completions.create(model="echo-model", prompt="one two three")
    assert resp.choices[0].text.split() == ["one", "two", "three"]
    stream = await client.completions.create(model="echo-model", prompt="one two", stream=True)
    texts = [c.choices[0].text async for c in stream if c.choices]
    assert "".join(texts).split() == ["one", "two"]


async def test_base_url_without_v1_works(gateway: Gateway) -> None:
    client = gateway.async_client(base_url=gateway.base_url.removesuffix("/v1"))
    resp = await client.chat.completions.create(model="echo-model", messages=USER)
    assert resp.choices[0].message.content
    models = await client.models.list()
    assert "echo-model" in [m.id for m in models.data]


async def test_models_list_and_get(gateway: Gateway) -> None:
    client = gateway.async_client()
    ids = [m.id async for m in client.models.list()]
    assert {"echo-model", "fallback-model"} <= set(ids)
    model = await client.models.retrieve("echo-model")
    assert model.id == "echo-model" and model.object == "model" and model.created > 0
    with pytest.raises(openai.NotFoundError):
        await client.models.retrieve("no-such-model")


@pytest.mark.parametrize(
    "body, status, param",
    [
        (b"{not json", 400, None),
        (b"[1, 2]", 400, None),
        (json.dumps({"model": "echo-model", "messages": "hi"}).encode(), 400, "messages"),
        (json.dumps({"model": "echo-model"}).encode(), 400, "messages"),
        (json.dumps({"model": "echo-model", "messages": []}).encode(), 400, "messages"),
        (json.dumps({"model": 5, "messages": USER}).encode(), 400, "model"),
        (
            json.dumps({"model": "echo-model", "messages": USER, "temperature": "hot"}).encode(),
            400,
            "temperature",
        ),
        (json.dumps({"model": "echo-model", "messages": USER, "n": 2}).encode(), 400, "n"),
        (
            json.dumps(
                {"model": "echo-model", "messages": [{"role": "wizard", "content": "x"}]}
            ).encode(),
            400,
            "messages.0.role",
        ),
        (json.dumps({"model": "no-such-model", "messages": USER}).encode(), 404, "model"),
    ],
)
async def test_bad_input_is_a_4xx_with_openai_error_json(
    gateway: Gateway, body: bytes, status: int, param: str | None
) -> None:
    resp = await gateway.post_bytes(body)
    assert resp.status == status
    err = json.loads(resp.body)["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert err["param"] == param
    assert resp.headers["x-request-id"]


async def test_oversized_body_is_413(gateway: Gateway) -> None:
    big = json.dumps(
        {
            "model": "echo-model",
            "messages": [{"role": "user", "content": "x" * (gateway.max_body_bytes + 10)}],
        }
    ).encode()
    resp = await gateway.post_bytes(big)
    assert resp.status == 413
    assert json.loads(resp.body)["error"]["type"] == "invalid_request_error"


async def test_unknown_fields_are_ignored(gateway: Gateway) -> None:
    raw = await gateway.post_raw(
        {
            "model": "echo-model",
            "messages": [
                {"role": "user", "content": "hi there", "prefix": True, "reasoning_content": "x"}
            ],
            "store": False,
            "metadata": {"a": 1},
            "some_future_field": [1],
        }
    )
    assert raw.status == 200


async def test_missing_key_is_401(gateway: Gateway) -> None:
    client = gateway.async_client(api_key="sk-wrong")
    with pytest.raises(openai.AuthenticationError):
        await client.chat.completions.create(model="echo-model", messages=USER)
    resp = await gateway.post_bytes(b"{}", headers={})
    assert resp.status == 401
    assert json.loads(resp.body)["error"]["code"] == "missing_api_key"


async def test_fallback_to_next_route_on_500(gateway: Gateway) -> None:
    client = gateway.async_client()
    resp = await client.chat.completions.create(model="fallback-model", messages=USER)
    assert resp.choices[0].message.content == "alpha beta gamma delta epsilon"
    scenarios = [r.body["model"] for r in gateway.mock.requests]
    assert scenarios[-2:] == ["fail-500", "echo"]


async def test_upstream_timeout_is_504(gateway: Gateway) -> None:
    client = gateway.async_client(max_retries=0)
    with pytest.raises(openai.APIStatusError) as info:
        await client.chat.completions.create(model="impatient/hang", messages=USER)
    assert info.value.status_code == 504


async def test_upstream_429_keeps_retry_after(gateway: Gateway) -> None:
    resp = await gateway.post_bytes(
        json.dumps({"model": "mock/fail-429", "messages": USER}).encode()
    )
    assert resp.status == 429
    assert resp.headers["Retry-After"] == "7"
    assert json.loads(resp.body)["error"]["type"] == "rate_limit_error"


async def test_upstream_auth_failure_is_502_naming_the_provider(gateway: Gateway) -> None:
    resp = await gateway.post_bytes(
        json.dumps({"model": "mock/fail-401", "messages": USER}).encode()
    )
    assert resp.status == 502
    assert "'mock'" in json.loads(resp.body)["error"]["message"]


async def test_connection_refused_is_502(gateway: Gateway) -> None:
    resp = await gateway.post_bytes(
        json.dumps({"model": "refused/echo", "messages": USER}).encode()
    )
    assert resp.status == 502
    assert json.loads(resp.body)["error"]["code"]


async def test_upstream_dying_mid_stream_gives_an_error_frame(gateway: Gateway) -> None:
    raw = await asyncio.wait_for(
        gateway.post_raw({"model": "mock/die-midstream-after-2", "messages": USER, "stream": True}),
        timeout=10,
    )
    payloads = sse_payloads(raw.body)
    last = json.loads(payloads[-1])
    assert "error" in last and last["error"]["message"]
    assert "[DONE]" not in payloads


async def test_client_disconnect_closes_the_upstream_request(
    gateway: Gateway, mock_upstream: MockUpstream
) -> None:
    body = {"model": "mock/stall-after-1", "messages": USER, "stream": True}
    async with aiohttp.ClientSession() as session:
        resp = await session.post(
            f"{gateway.base_url}/chat/completions", json=body, headers=gateway.auth_headers()
        )
        await resp.content.readuntil(b"\n\n")
        resp.close()
    gone = await mock_upstream.wait_disconnect(within_s=5)
    assert gone.body["model"] == "stall-after-1"


async def test_x_request_id_is_echoed_and_on_errors(gateway: Gateway) -> None:
    resp = await gateway.post_bytes(
        b"{bad", headers={**gateway.auth_headers(), "x-request-id": "my-req-42"}
    )
    assert resp.headers["x-request-id"] == "my-req-42"
    async with aiohttp.ClientSession() as session, session.get(f"{gateway.root}/nope") as r:
        assert r.status == 404 and r.headers["x-request-id"]
        assert (await r.json())["error"]["type"] == "invalid_request_error"


async def test_health_ready_metrics(gateway: Gateway) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{gateway.root}/healthz") as r:
            assert r.status == 200
        async with session.get(f"{gateway.root}/readyz") as r:
            body = await r.json()
            assert body["checks"] == {"redis": True, "accepting": True}
            assert set(body["providers"]) == {"mock", "impatient", "hasty", "refused"}
            assert r.status == 200
        await gateway.async_client().chat.completions.create(model="echo-model", messages=USER)
        await gateway.settled()  # metrics are recorded as the request is settled
        async with session.get(f"{gateway.root}/metrics") as r:
            text = await r.text()
            assert r.status == 200
            assert 'gateway_requests_total{endpoint="chat.completions",model="echo-model"' in text
            assert "gateway_time_to_first_token_seconds" in text


async def test_thinking_switch_is_mapped_for_the_upstream(gateway: Gateway) -> None:
    client = gateway.async_client()
    await client.chat.completions.create(model="reasoner-model", messages=USER)
    assert gateway.mock.requests[-1].body["thinking"] == {"type": "enabled"}
    await client.chat.completions.create(
        model="echo-model", messages=USER, extra_body={"thinking": {"type": "disabled"}}
    )
    assert gateway.mock.requests[-1].body["thinking"] == {"type": "disabled"}
    await client.chat.completions.create(
        model="echo-model", messages=USER, extra_body={"chat_template_kwargs": {"thinking": True}}
    )
    assert gateway.mock.requests[-1].body["thinking"] == {"type": "enabled"}
