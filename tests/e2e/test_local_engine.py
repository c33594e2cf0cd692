"""End to end: the openai SDK -> the real gateway app -> LocalProvider -> the engine on a tiny
checkpoint (random weights; a scripted one for tool calls), on the real Redis."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiohttp
import openai
import pytest

from tests.support.local_engine import WEATHER_TOOL, wait_idle
from tests.support.local_gateway import (
    TOOL_ARGUMENTS,
    TOOL_NAME,
    LocalGateway,
    open_local_gateway,
)

pytestmark = pytest.mark.asyncio(loop_scope="module")

USER = [{"role": "user", "content": "Say something about the sea."}]


def client(gateway: LocalGateway) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=gateway.base_url, api_key=gateway.key, max_retries=0)


async def test_non_streaming_without_thinking(local_gateway: LocalGateway) -> None:
    resp = await client(local_gateway).chat.completions.create(
        model="deepseek-chat", messages=USER, max_tokens=6, temperature=0
    )
    message = resp.choices[0].message
    assert message.content
    assert getattr(message, "reasoning_content", None) in (None, "")
    assert resp.choices[0].finish_reason == "length"
    assert resp.usage is not None and resp.usage.completion_tokens == 6


async def test_streaming_with_thinking_sends_reasoning(local_gateway: LocalGateway) -> None:
    stream = await client(local_gateway).chat.completions.create(
        model="deepseek-reasoner",
        messages=USER,
        max_tokens=6,
        stream=True,
        stream_options={"include_usage": True},
    )
    reasoning, finishes, usage = "", [], None
    async for chunk in stream:
        if chunk.choices:
            reasoning += getattr(chunk.choices[0].delta, "reasoning_content", None) or ""
            if chunk.choices[0].finish_reason:
                finishes.append(chunk.choices[0].finish_reason)
        usage = chunk.usage or usage
    assert reasoning
    assert finishes == ["length"]
    assert usage is not None and usage.completion_tokens == 6
    details = usage.completion_tokens_details
    assert details is not None and details.reasoning_tokens


async def test_client_chooses_thinking_on_an_open_route(local_gateway: LocalGateway) -> None:
    sdk = client(local_gateway)
    on = await sdk.chat.completions.create(
        model="deepseek-v3.1",
        messages=USER,
        max_tokens=4,
        extra_body={"thinking": {"type": "enabled"}},
    )
    off = await sdk.chat.completions.create(model="deepseek-v3.1", messages=USER, max_tokens=4)
    assert getattr(on.choices[0].message, "reasoning_content", None)
    assert not getattr(off.choices[0].message, "reasoning_content", None)
    assert off.choices[0].message.content


async def test_repeated_prompt_reports_cached_tokens(local_gateway: LocalGateway) -> None:
    messages = [{"role": "user", "content": "A long shared preamble, " * 10}]
    sdk = client(local_gateway)
    first = await sdk.chat.completions.create(
        model="deepseek-chat", messages=messages, max_tokens=1
    )
    second = await sdk.chat.completions.create(
        model="deepseek-chat", messages=messages, max_tokens=1
    )
    assert first.usage is not None and second.usage is not None
    cached = second.usage.prompt_tokens_details
    assert cached is not None and cached.cached_tokens and cached.cached_tokens >= 16


async def test_stop_string_cuts_the_answer(local_gateway: LocalGateway) -> None:
    sdk = client(local_gateway)
    full = await sdk.chat.completions.create(
        model="deepseek-chat", messages=USER, max_tokens=20, temperature=0
    )
    text = full.choices[0].message.content or ""
    assert len(text) > 6
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    cut = await sdk.chat.completions.create(
        model="deepseek-chat", messages=USER, max_tokens=20, temperature=0, stop=[stop]
    )
    assert cut.choices[0].message.content == text[: text.index(stop)]
    assert cut.choices[0].finish_reason == "stop"


async def test_legacy_completion(local_gateway: LocalGateway) -> None:
    resp = await client(local_gateway).completions.create(
        model="deepseek-v3.1", prompt="Once upon a time", max_tokens=4
    )
    assert resp.choices[0].text
    assert resp.choices[0].finish_reason == "length"
    assert resp.usage is not None and resp.usage.completion_tokens == 4


async def test_32_concurrent_streams(local_gateway: LocalGateway) -> None:
    sdk = client(local_gateway)

    async def one(i: int) -> tuple[str, str | None]:
        stream = await sdk.chat.completions.create(
            model="deepseek-chat",
            messages=[{"role": "user", "content": f"Request number {i}"}],
            max_tokens=8,
            stream=True,
        )
        text, finish = "", None
        async for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
                finish = chunk.choices[0].finish_reason or finish
        return text, finish

    results = await asyncio.gather(*(one(i) for i in range(32)))
    assert all(text and finish == "length" for text, finish in results)
    await wait_idle(local_gateway)


async def test_client_disconnect_frees_blocks(local_gateway: LocalGateway) -> None:
    await wait_idle(local_gateway)
    body = {"model": "deepseek-chat", "messages": USER, "max_tokens": 1500, "stream": True}
    async with aiohttp.ClientSession() as session:
        resp = await session.post(
            f"{local_gateway.base_url}/chat/completions",
            json=body,
            headers={"Authorization": f"Bearer {local_gateway.key}"},
        )
        assert resp.status == 200
        await resp.content.readline()
        for _ in range(300):
            if local_gateway.provider.engine_stats().num_running:
                break
            await asyncio.sleep(0.01)
        stats = local_gateway.provider.engine_stats()
        assert stats.num_free_blocks < stats.num_total_blocks
        resp.close()  # drop the connection mid-stream
    await wait_idle(local_gateway)


async def test_tool_call_is_parsed(scripted_gateway: LocalGateway) -> None:
    resp = await client(scripted_gateway).chat.completions.create(
        model="deepseek-chat",
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=[WEATHER_TOOL],
        max_tokens=40,
    )
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.tool_calls is not None
    (call,) = choice.message.tool_calls
    assert call.id.startswith("call_")
    assert call.function.name == TOOL_NAME
    assert json.loads(call.function.arguments) == json.loads(TOOL_ARGUMENTS)
    assert not choice.message.content


async def test_tool_call_streams_in_fragments(scripted_gateway: LocalGateway) -> None:
    stream = await client(scripted_gateway).chat.completions.create(
        model="deepseek-chat",
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=[WEATHER_TOOL],
        max_tokens=40,
        stream=True,
    )
    names, arguments, finish = [], "", None
    async for chunk in stream:
        if not chunk.choices:
            continue
        for call in chunk.choices[0].delta.tool_calls or []:
            if call.function and call.function.name:
                names.append(call.function.name)
            arguments += (call.function.arguments if call.function else None) or ""
        finish = chunk.choices[0].finish_reason or finish
    assert names == [TOOL_NAME]
    assert json.loads(arguments) == json.loads(TOOL_ARGUMENTS)
    assert finish == "tool_calls"


async def test_overload_answers_503_while_admitted_requests_complete(
    tiny_checkpoint: Path,
) -> None:
    async with open_local_gateway(
        tiny_checkpoint, max_num_seqs=1, max_waiting=1, max_batch_tokens=64
    ) as gateway:
        body = {"model": "deepseek-chat", "messages": USER, "max_tokens": 60}
        headers = {"Authorization": f"Bearer {gateway.key}"}
        async with aiohttp.ClientSession(headers=headers) as session:

            async def one() -> tuple[int, str | None, dict[str, object]]:
                async with session.post(f"{gateway.base_url}/chat/completions", json=body) as r:
                    return r.status, r.headers.get("Retry-After"), await r.json()

            results = await asyncio.gather(*(one() for _ in range(8)))
    served = [payload for status, _, payload in results if status == 200]
    refused = [(retry, payload) for status, retry, payload in results if status == 503]
    assert served and refused
    assert len(served) + len(refused) == 8
    for payload in served:
        assert payload["choices"][0]["finish_reason"] == "length"  # type: ignore[index]
    for retry, payload in refused:
        assert retry is not None and int(retry) >= 1
        assert payload["error"]["code"] == "overloaded"  # type: ignore[index]


async def test_metrics_expose_engine_gauges(local_gateway: LocalGateway) -> None:
    await wait_idle(local_gateway)
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{local_gateway.root}/metrics") as resp,
    ):
        text = await resp.text()
    total = local_gateway.provider.engine_stats().num_total_blocks
    assert f'engine_kv_blocks_total{{provider="local"}} {float(total)}' in text
    assert 'engine_kv_blocks_used{provider="local"} 0.0' in text
    assert 'engine_waiting_requests{provider="local"}' in text
    assert 'engine_prefix_cache_hit_rate{provider="local"}' in text
    assert 'engine_spec_proposed_tokens_total{provider="local"}' in text
    assert 'engine_spec_acceptance_rate{provider="local"}' in text
