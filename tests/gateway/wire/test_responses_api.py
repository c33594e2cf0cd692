"""The Responses API front door (`POST /v1/responses`, what Codex CLI speaks), driven by the
official openai SDK and a raw SSE reader, in front of the mock upstream (scenarios by model name,
see testkit/mock_upstream.py)."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

from gateway.wire.responses_request import decode_reasoning, encode_reasoning, parse_responses
from testkit.gateway_app import Gateway
from testkit.mock_scenarios import REASONING_TEXT
from tests.support.sse_events import check_stream, sse_events

WORDS = "alpha beta gamma delta epsilon"
TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "name": "search",
        "description": "Search the code.",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}},
    },
    {"type": "web_search"},
    {
        "type": "namespace",
        "name": "mcp",
        "description": "An MCP server.",
        "tools": [{"type": "function", "name": "lookup", "parameters": {"type": "object"}}],
    },
]


async def stream_raw(gateway: Gateway, body: dict[str, Any]) -> list[dict[str, Any]]:
    raw = await gateway.post_raw({**body, "stream": True}, path="/v1/responses")
    assert raw.status == 200, raw.body
    assert raw.headers["Content-Type"].startswith("text/event-stream")
    return sse_events(raw.body)


async def test_plain_text_non_stream(gateway: Gateway) -> None:
    client = gateway.async_client()
    resp = await client.responses.create(model="echo-model", input=WORDS)
    assert resp.output_text == WORDS
    assert resp.status == "completed" and resp.id.startswith("resp_")
    assert resp.model == "echo-model"
    assert [item.type for item in resp.output] == ["message"]
    assert resp.usage is not None and resp.usage.output_tokens == 5
    assert resp.usage.total_tokens == resp.usage.input_tokens + 5


async def test_sdk_stream_helper_accumulates_the_answer(gateway: Gateway) -> None:
    client = gateway.async_client()
    deltas: list[str] = []
    async with client.responses.stream(
        model="echo-model", input=WORDS, instructions="Repeat the words."
    ) as stream:
        async for event in stream:
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
        final = await stream.get_final_response()
    assert "".join(deltas) == WORDS == final.output_text
    assert final.status == "completed"
    assert final.usage is not None and final.usage.output_tokens == 5
    sent = gateway.mock.requests[-1].body["messages"]
    assert sent == [
        {"role": "system", "content": "Repeat the words."},
        {"role": "user", "content": WORDS},
    ]


async def test_raw_stream_event_order_and_usage(gateway: Gateway) -> None:
    events = await stream_raw(gateway, {"model": "mock/echo-cached-3", "input": WORDS})
    final = check_stream(events)
    kinds = [e["type"] for e in events]
    assert kinds[2:5] == [
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
    ]
    assert kinds[-5:] == [
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    message = final["output"][0]
    assert message["type"] == "message" and message["status"] == "completed"
    assert message["content"][0]["text"] == WORDS
    assert final["status"] == "completed" and final["incomplete_details"] is None
    usage = final["usage"]
    assert usage["output_tokens"] == 5
    assert usage["input_tokens_details"] == {"cached_tokens": 3}
    assert usage["output_tokens_details"] == {"reasoning_tokens": 0}
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]


async def test_tool_calls_are_function_call_items(gateway: Gateway) -> None:
    events = await stream_raw(
        gateway, {"model": "mock/tools-calls-2", "input": "find it", "tools": TOOLS}
    )
    final = check_stream(events)
    assert final["output"] == [
        {
            "id": final["output"][0]["id"],
            "type": "function_call",
            "status": "completed",
            "call_id": "call_mock0",
            "name": "search",
            "arguments": '{"query": "find it"}',
        },
        {
            "id": final["output"][1]["id"],
            "type": "function_call",
            "status": "completed",
            "call_id": "call_mock1",
            "name": "lookup",
            "arguments": '{"query": "find it"}',
            "namespace": "mcp",
        },
    ]
    assert final["output"][0]["id"].startswith("fc_")
    assert any(e["type"] == "response.function_call_arguments.delta" for e in events)
    upstream_tools = gateway.mock.requests[-1].body["tools"]
    assert [t["function"]["name"] for t in upstream_tools] == ["search", "lookup"]
    assert upstream_tools[0]["function"]["description"] == "Search the code."


async def test_follow_up_turn_reaches_upstream_as_tool_messages(gateway: Gateway) -> None:
    history: list[dict[str, Any]] = [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "go"}]},
        {"type": "function_call", "call_id": "call_a", "name": "search", "arguments": "{}"},
        {
            "type": "function_call",
            "call_id": "call_b",
            "name": "lookup",
            "namespace": "mcp",
            "arguments": '{"q": 1}',
        },
        {"type": "function_call_output", "call_id": "call_a", "output": "found"},
        {
            "type": "function_call_output",
            "call_id": "call_b",
            "output": [{"type": "input_text", "text": "looked up"}],
        },
        {"role": "user", "content": "thanks"},
    ]
    client = gateway.async_client()
    resp = await client.responses.create(
        model="echo-model", input=history, tools=TOOLS, instructions="Be brief."
    )
    assert resp.output_text == "thanks"
    assert gateway.mock.requests[-1].body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_a",
                    "type": "function",
                    "function": {"name": "search", "arguments": "{}"},
                },
                {
                    "id": "call_b",
                    "type": "function",
                    "function": {"name": "lookup", "arguments": '{"q": 1}'},
                },
            ],
        },
        {"role": "tool", "content": "found", "tool_call_id": "call_a"},
        {"role": "tool", "content": "looked up", "tool_call_id": "call_b"},
        {"role": "user", "content": "thanks"},
    ]


async def test_images_in_tool_outputs_follow_the_outputs_in_a_user_message(
    gateway: Gateway,
) -> None:
    """Tool messages carry text only: an output's images are not dropped but follow."""
    shot = {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo="}
    history: list[dict[str, Any]] = [
        {"role": "user", "content": "look"},
        {"type": "function_call", "call_id": "c1", "name": "search", "arguments": "{}"},
        {"type": "function_call", "call_id": "c2", "name": "search", "arguments": "{}"},
        {
            "type": "function_call_output",
            "call_id": "c1",
            "output": [{"type": "input_text", "text": "a screenshot"}, shot],
        },
        {"type": "function_call_output", "call_id": "c2", "output": "nothing"},
    ]
    await gateway.async_client().responses.create(model="echo-model", input=history, tools=TOOLS)
    sent = gateway.mock.requests[-1].body["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "tool", "tool", "user"]
    assert sent[2]["content"] == "a screenshot" and sent[3]["content"] == "nothing"
    assert sent[4]["content"] == [
        {"type": "text", "text": "Images returned by tool call c1:"},
        {"type": "image_url", "image_url": {"url": shot["image_url"]}},
    ]


async def test_reasoning_item_and_its_echo_next_turn(gateway: Gateway) -> None:
    body = {"model": "mock/reasoning-content", "input": WORDS, "reasoning": {"effort": "high"}}
    events = await stream_raw(gateway, body)
    final = check_stream(events)
    reasoning, message = final["output"]
    assert reasoning["type"] == "reasoning" and reasoning["id"].startswith("rs_")
    assert reasoning["summary"] == [{"type": "summary_text", "text": REASONING_TEXT}]
    assert decode_reasoning(reasoning["encrypted_content"]) == REASONING_TEXT
    assert message["content"][0]["text"] == WORDS
    kinds = [e["type"] for e in events]
    assert kinds.index("response.reasoning_summary_part.added") < kinds.index(
        "response.reasoning_summary_text.delta"
    )
    assert final["usage"]["output_tokens_details"]["reasoning_tokens"] > 0
    assert gateway.mock.requests[-1].body["thinking"] == {"type": "enabled"}

    echoed = {k: v for k, v in reasoning.items() if k != "id"}  # Codex drops ids on echo
    turn2 = [{"role": "user", "content": WORDS}, echoed, message, {"role": "user", "content": "ok"}]
    raw = await gateway.post_raw(
        {"model": "mock/reasoning-content", "input": turn2, "reasoning": {"effort": "minimal"}},
        path="/v1/responses",
    )
    assert raw.status == 200, raw.body
    upstream = gateway.mock.requests[-1].body
    assert upstream["thinking"] == {"type": "disabled"}
    assert upstream["messages"][1] == {"role": "assistant", "content": WORDS}


def test_echoed_reasoning_becomes_the_next_assistant_message_reasoning() -> None:
    ours = {"type": "reasoning", "summary": [], "encrypted_content": encode_reasoning("mine")}
    theirs = {
        "type": "reasoning",
        "summary": [{"type": "summary_text", "text": "a summary"}],
        "encrypted_content": "gAAAAABopaque",
    }
    opaque_only = {"type": "reasoning", "summary": [], "encrypted_content": "gAAAAABopaque"}
    items = [
        {"role": "user", "content": "q"},
        ours,
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "r"},
        theirs,
        {"role": "assistant", "content": [{"type": "output_text", "text": "a"}]},
        opaque_only,
        {"role": "assistant", "content": "b"},
    ]
    chat = parse_responses({"model": "m", "input": items}, "req").chat
    assistants = [m for m in chat.messages if m.role == "assistant"]
    assert [m.reasoning_content for m in assistants] == ["mine", "a summary", None]
    assert [m.content for m in assistants] == [None, "a", "b"]
    assert assistants[0].tool_calls[0].id == "c1"


async def test_max_output_tokens_gives_incomplete(gateway: Gateway) -> None:
    client = gateway.async_client()
    resp = await client.responses.create(model="echo-model", input=WORDS, max_output_tokens=2)
    assert resp.status == "incomplete"
    assert resp.incomplete_details is not None
    assert resp.incomplete_details.reason == "max_output_tokens"
    assert resp.output_text.split() == ["alpha", "beta"]
    events = await stream_raw(
        gateway, {"model": "echo-model", "input": WORDS, "max_output_tokens": 2}
    )
    final = check_stream(events)
    assert final["status"] == "incomplete"
    assert final["incomplete_details"] == {"reason": "max_output_tokens"}
    assert final["output"][0]["status"] == "incomplete"


async def test_unknown_fields_are_ignored_and_v1_is_optional(gateway: Gateway) -> None:
    body = {
        "model": "echo-model",
        "input": [{"type": "message", "role": "user", "content": "hi"}],
        "store": False,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "abc",
        "text": {"verbosity": "low"},
        "metadata": {"k": "v"},
        "service_tier": "auto",
        "tool_choice": "auto",
        "parallel_tool_calls": False,
        "something_new": {"x": 1},
    }
    raw = await gateway.post_raw(body, path="/responses")
    assert raw.status == 200, raw.body
    out = json.loads(raw.body)
    assert out["output"][0]["content"][0]["text"] == "hi"
    assert out["metadata"] == {"k": "v"}


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": "hi"}, "model"),
        ({"model": "echo-model"}, "input"),
        ({"model": "echo-model", "input": 5}, "input"),
        ({"model": "echo-model", "input": "hi", "temperature": "hot"}, "temperature"),
        ({"model": "echo-model", "input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
        ({"model": "echo-model", "input": [{"role": "robot", "content": "x"}]}, "input.0.role"),
        (
            {"model": "echo-model", "input": [{"type": "function_call", "name": "f"}]},
            "input.0.call_id",
        ),
        ({"model": "echo-model", "input": "hi", "tools": [{"type": "function"}]}, "tools.0.name"),
        (
            {"model": "echo-model", "input": "hi", "previous_response_id": "resp_1"},
            "previous_response_id",
        ),
    ],
)
async def test_bad_input_is_400_naming_the_param(
    gateway: Gateway, body: dict[str, Any], param: str
) -> None:
    raw = await gateway.post_raw(body, path="/v1/responses")
    assert raw.status == 400
    error = json.loads(raw.body)["error"]
    assert error["param"] == param
    assert error["type"] == "invalid_request_error" and error["message"]


async def test_sdk_raises_bad_request_on_bad_input(gateway: Gateway) -> None:
    client = gateway.async_client()
    with pytest.raises(openai.BadRequestError):
        await client.responses.create(model="echo-model", input="hi", temperature=9)


async def test_failure_mid_stream_is_response_failed(gateway: Gateway) -> None:
    events = await stream_raw(gateway, {"model": "mock/die-midstream-after-2", "input": WORDS})
    final = check_stream(events, last="response.failed")
    assert final["status"] == "failed"
    assert final["error"]["code"] and final["error"]["message"]
    assert final["output"][0]["status"] == "incomplete"
    assert final["output"][0]["content"][0]["text"] == "alpha beta "
    kinds = [e["type"] for e in events]
    assert "response.completed" not in kinds
    # Codex keeps every item it saw done, and resends it on each retry: a partial answer is not.
    assert not [k for k in kinds if k.endswith(".done")], kinds


async def test_sdk_sees_no_partial_item_done_before_response_failed(gateway: Gateway) -> None:
    client = gateway.async_client()
    stream = await client.responses.create(
        model="mock/die-midstream-after-2", input=WORDS, stream=True
    )
    events = [event async for event in stream]
    assert not [e for e in events if e.type == "response.output_item.done"]
    assert events[-1].type == "response.failed"
    assert [item.status for item in events[-1].response.output] == ["incomplete"]


async def test_failure_before_the_stream_is_an_http_error(gateway: Gateway) -> None:
    raw = await gateway.post_raw(
        {"model": "mock/fail-500", "input": "hi", "stream": True}, path="/v1/responses"
    )
    assert raw.status == 502
    assert json.loads(raw.body)["error"]["code"]
