"""The Messages wire format on the upstream side, on plain data."""

from __future__ import annotations

from providers.types import (
    ChatRequest,
    Event,
    Finish,
    Message,
    ReasoningDelta,
    Sampling,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    Usage,
)
from providers.upstream.anthropic_wire import MessagesDecoder, build_messages_body
from providers.upstream.openai_wire import ChunkDecoder


def _request(**kw: object) -> ChatRequest:
    base: dict[str, object] = {
        "model": "m",
        "messages": (Message(role="user", content="hi"),),
        "sampling": Sampling(max_tokens=2000),
    }
    return ChatRequest(**{**base, **kw})  # type: ignore[arg-type]


def test_a_client_budget_is_fitted_to_the_granted_max_tokens() -> None:
    own = {
        "model": "x",
        "max_tokens": 32000,
        "messages": [],
        "thinking": {"type": "enabled", "budget_tokens": 31999},
    }
    body = build_messages_body(_request(anthropic_body=own), stream=True)
    assert body["max_tokens"] == 2000 and body["thinking"]["budget_tokens"] == 1999
    small = _request(anthropic_body=own, sampling=Sampling(max_tokens=500))
    assert build_messages_body(small, stream=True)["thinking"] == {"type": "disabled"}
    assert own["max_tokens"] == 32000  # the client's body is not changed


def test_translation_merges_roles_and_maps_images_and_choices() -> None:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    request = _request(
        messages=(
            Message(role="user", content=[{"type": "text", "text": "see"}, image]),
            Message(role="assistant", tool_calls=(ToolCall("c1", "f", "not json"),)),
            Message(role="tool", content="r1", tool_call_id="c1"),
            Message(role="user", content="next"),
        ),
        tool_choice="none",
        parallel_tool_calls=False,
        tools=(),
        thinking=False,
    )
    body = build_messages_body(request, stream=False)
    assert [m["role"] for m in body["messages"]] == ["user", "assistant", "user"]
    assert body["messages"][0]["content"][1] == {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"},
    }
    assert body["messages"][1]["content"][0]["input"] == {}
    assert [b["type"] for b in body["messages"][2]["content"]] == ["tool_result", "text"]
    assert body["thinking"] == {"type": "disabled"} and "tool_choice" not in body


def test_a_whole_message_decodes_to_events() -> None:
    decoder = MessagesDecoder("anth")
    out: list[Event] = []
    message = {
        "type": "message",
        "content": [
            {"type": "thinking", "thinking": "hmm", "signature": "sig"},
            {"type": "text", "text": "hi"},
            {"type": "tool_use", "id": "t", "name": "f", "input": {"a": 1}},
        ],
        "stop_reason": "end_turn",
        "usage": {"input_tokens": 3, "cache_read_input_tokens": 4, "output_tokens": 5},
    }
    decoder.feed(message, out)
    decoder.end(out)
    assert out == [
        ReasoningDelta("hmm", "sig"),
        TextDelta("hi"),
        ToolCallDelta(0, "t", "f"),
        ToolCallDelta(0, arguments_fragment='{"a": 1}'),
        Finish("tool_calls"),
        Usage(prompt_tokens=7, completion_tokens=5, cached_prompt_tokens=4),
    ]


def test_the_matched_stop_sequence_comes_through() -> None:
    decoder = MessagesDecoder("anth")
    out: list[Event] = []
    delta = {"stop_reason": "stop_sequence", "stop_sequence": "END"}
    decoder.feed({"type": "message_delta", "delta": delta, "usage": {}}, out)
    decoder.feed({"type": "message_stop"}, out)
    decoder.end(out)
    assert Finish("stop", "END") in out
    chunks = ChunkDecoder("vllm")
    chunk = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop", "stop_reason": "END"}]}
    chunks.feed(chunk, out := [])
    assert out == [Finish("stop", "END")]
