"""End to end: the anthropic SDK -> the real gateway's Messages API -> LocalProvider -> the
engine on a tiny checkpoint (random weights; a scripted one for tool calls), on the real Redis."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import anthropic
import pytest
from redis.asyncio import Redis

from gateway.keys.store import KeySpace
from gateway.resources import PIPELINE
from testkit.gateway_app import REDIS_URL
from tests.support.local_engine import wait_idle
from tests.support.local_gateway import TOOL_ARGUMENTS, TOOL_NAME, LocalGateway, open_local_gateway
from tests.support.messages_rules import check_messages_stream

pytestmark = pytest.mark.asyncio(loop_scope="module")

USER: list[Any] = [{"role": "user", "content": "Say something about the sea."}]
WEATHER = {
    "name": TOOL_NAME,
    "description": "Current weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}


def sdk(gateway: LocalGateway) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=gateway.root, api_key=gateway.key, max_retries=0)


async def raw_stream(gateway: LocalGateway, body: dict[str, Any]) -> Any:
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"{gateway.root}/v1/messages?beta=true",
            json={**body, "stream": True},
            headers={"x-api-key": gateway.key},
        ) as resp,
    ):
        assert resp.status == 200
        return check_messages_stream(await resp.read())


async def test_create_and_exact_count_tokens(local_gateway: LocalGateway) -> None:
    async with sdk(local_gateway) as client:
        counted = await client.messages.count_tokens(
            model="deepseek-chat", system="Be brief.", messages=USER, tools=[WEATHER]
        )
        msg = await client.messages.create(
            model="deepseek-chat",
            system="Be brief.",
            messages=USER,
            tools=[WEATHER],  # type: ignore[list-item]
            max_tokens=6,
        )
    assert msg.content and msg.content[0].type == "text" and msg.content[0].text
    assert msg.stop_reason == "max_tokens" and msg.usage.output_tokens == 6
    used = msg.usage.input_tokens + (msg.usage.cache_read_input_tokens or 0)
    assert counted.input_tokens == used  # the engine's own prompt length
    # thinking on changes the template's generation prompt: the count follows the route
    async with sdk(local_gateway) as client:
        on = await client.messages.count_tokens(model="deepseek-reasoner", messages=USER)
        off = await client.messages.count_tokens(model="deepseek-chat", messages=USER)
    assert on.input_tokens == off.input_tokens > 0


async def test_stream_with_thinking_is_signed_and_replayable(local_gateway: LocalGateway) -> None:
    async with sdk(local_gateway) as client:
        async with client.messages.stream(
            model="deepseek-reasoner", messages=USER, max_tokens=8
        ) as stream:
            final = await stream.get_final_message()
        assert final.content[0].type == "thinking" and final.content[0].thinking
        assert final.content[0].signature.startswith("gwt1.")
        assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 8
        history = [
            *USER,
            {"role": "assistant", "content": [b.model_dump() for b in final.content]},
            {"role": "user", "content": "And the mountains?"},
        ]
        again = await client.messages.create(
            model="deepseek-reasoner", messages=history, max_tokens=4
        )
    assert again.stop_reason == "max_tokens"
    raw = await raw_stream(
        local_gateway,
        {
            "model": "deepseek-v3.1",
            "messages": USER,
            "max_tokens": 5,
            "thinking": {"type": "enabled", "budget_tokens": 2},
        },
    )
    assert raw.names[:2] == ["message_start", "ping"] and raw.blocks[0]["type"] == "thinking"
    assert raw.usage["output_tokens"] == 5 and raw.stop_reason == "max_tokens"


async def test_budget_tokens_ends_thinking_and_the_answer_follows(
    local_gateway: LocalGateway,
) -> None:
    """`thinking.budget_tokens` is the local engine's reasoning budget: after it, the engine
    closes thinking itself and the rest of max_tokens goes to the answer."""
    async with sdk(local_gateway) as client:
        message = await client.messages.create(
            model="deepseek-v3.1",
            messages=USER,
            max_tokens=12,
            thinking={"type": "enabled", "budget_tokens": 3},
        )
    kinds = [block.type for block in message.content]
    assert kinds[0] == "thinking" and "text" in kinds, kinds
    assert message.usage.output_tokens == 12 and message.stop_reason == "max_tokens"


async def test_tool_use_across_two_turns(scripted_gateway: LocalGateway) -> None:
    ask = [{"role": "user", "content": "Weather in Paris?"}]
    async with sdk(scripted_gateway) as client:
        async with client.messages.stream(
            model="deepseek-chat",
            messages=ask,  # type: ignore[arg-type]
            tools=[WEATHER],  # type: ignore[list-item]
            max_tokens=40,
        ) as stream:
            first = await stream.get_final_message()
        assert first.stop_reason == "tool_use"
        (call,) = first.content
        assert call.type == "tool_use" and call.name == TOOL_NAME
        assert call.input == json.loads(TOOL_ARGUMENTS)
        history = [
            *ask,
            {"role": "assistant", "content": [call.model_dump()]},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "Sunny"}],
            },
        ]
        second = await client.messages.create(
            model="deepseek-chat",
            messages=history,  # type: ignore[arg-type]
            tools=[WEATHER],  # type: ignore[list-item]
            max_tokens=4,
        )
    assert second.stop_reason in ("max_tokens", "end_turn", "tool_use")
    raw = await raw_stream(
        scripted_gateway,
        {"model": "deepseek-chat", "messages": ask, "tools": [WEATHER], "max_tokens": 40},
    )
    assert [b["type"] for b in raw.blocks] == ["tool_use"] and raw.stop_reason == "tool_use"
    assert raw.blocks[0]["input"] == json.loads(TOOL_ARGUMENTS)


async def test_images_are_refused_with_a_400(local_gateway: LocalGateway) -> None:
    image = {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": "AA=="},
    }
    async with sdk(local_gateway) as client:
        with pytest.raises(anthropic.BadRequestError) as bad:
            await client.messages.create(
                model="deepseek-chat",
                messages=[{"role": "user", "content": [image, {"type": "text", "text": "what?"}]}],  # type: ignore[list-item]
                max_tokens=4,
            )
    assert bad.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    message = bad.value.body["error"]["message"]  # type: ignore[index]
    assert "images" in message and "image_url" not in message  # not in another API's terms


async def test_client_leaving_mid_stream_frees_blocks_and_is_settled(
    local_gateway: LocalGateway,
) -> None:
    await wait_idle(local_gateway)
    async with (
        sdk(local_gateway) as client,
        client.messages.stream(model="deepseek-chat", messages=USER, max_tokens=1500) as stream,
    ):
        async for event in stream:
            if event.type == "content_block_delta":
                break
    await wait_idle(local_gateway)
    await local_gateway.app[PIPELINE].drain()
    redis = Redis.from_url(REDIS_URL)
    entries = [f for _, f in await redis.xrange(KeySpace(local_gateway.prefix).usage_log())]
    await redis.aclose()
    left = [e for e in entries if e[b"error_code"] == b"client_disconnected"]
    assert len(left) == 1 and left[0][b"status"] == b"499"
    assert 0 < int(left[0][b"completion_tokens"]) < 1500


async def test_overload_is_529_overloaded_error(tiny_checkpoint: Path) -> None:
    async with (
        open_local_gateway(
            tiny_checkpoint, max_num_seqs=1, max_waiting=1, max_batch_tokens=64
        ) as gateway,
        sdk(gateway) as client,
    ):

        async def one() -> str:
            try:
                await client.messages.create(model="deepseek-chat", messages=USER, max_tokens=30)
            except anthropic.OverloadedError as exc:
                assert exc.response.headers["retry-after"]
                assert exc.body["error"]["type"] == "overloaded_error"  # type: ignore[index]
                return "overloaded"
            return "served"

        results = await asyncio.gather(*(one() for _ in range(6)))
    assert "served" in results and "overloaded" in results


async def test_a_stop_sequence_is_reported(local_gateway: LocalGateway) -> None:
    async with sdk(local_gateway) as client:
        full = await client.messages.create(
            model="deepseek-chat", messages=USER, max_tokens=20, extra_body={"top_k": 1}
        )
        text = full.content[0].text  # type: ignore[union-attr]
        assert len(text) > 6
        stop = text[len(text) // 2 : len(text) // 2 + 3]
        cut = await client.messages.create(
            model="deepseek-chat",
            messages=USER,
            max_tokens=20,
            extra_body={"top_k": 1},
            stop_sequences=[stop],
        )
    assert cut.content[0].text == text[: text.index(stop)]  # type: ignore[union-attr]
    assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == stop
