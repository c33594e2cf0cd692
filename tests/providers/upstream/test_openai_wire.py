"""ChatRequest -> upstream JSON, and upstream chunks -> Events, without a network."""

from __future__ import annotations

from typing import Any

import pytest

from providers.errors import UpstreamUnavailable
from providers.types import (
    ChatRequest,
    Event,
    Finish,
    FinishReason,
    Message,
    ReasoningDelta,
    Sampling,
    TextDelta,
    Tool,
    ToolCall,
    ToolCallDelta,
    Usage,
)
from providers.upstream.openai_wire import (
    ChunkDecoder,
    ThinkingStyle,
    build_body,
    error_message,
    parse_usage,
)

PARTS: list[dict[str, Any]] = [
    {"type": "text", "text": "what is in"},
    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
]
HISTORY = (
    Message("developer", "be brief"),
    Message("user", PARTS, name="ann"),
    Message(
        "assistant",
        None,
        tool_calls=(ToolCall("call_1", "look", '{"x": 1}'),),
        reasoning_content="I should look.",
    ),
    Message("tool", "a cat", tool_call_id="call_1"),
    Message("assistant", "A cat.", reasoning_content="Easy."),
)


def body_of(request: ChatRequest, style: ThinkingStyle = "deepseek", **kw: Any) -> dict[str, Any]:
    kw.setdefault("send_reasoning_history", False)
    kw.setdefault("stream", True)
    return build_body(request, thinking_style=style, **kw)


def test_full_mapping() -> None:
    request = ChatRequest(
        model="deepseek-chat",
        messages=HISTORY,
        sampling=Sampling(
            max_tokens=50,
            temperature=0.3,
            top_p=0.9,
            top_k=20,
            seed=7,
            stop=("END",),
            presence_penalty=0.1,
            frequency_penalty=0.2,
            logprobs=True,
            top_logprobs=3,
        ),
        tools=(Tool("look", "look at it", {"type": "object", "properties": {}}),),
        tool_choice={"type": "function", "function": {"name": "look"}},
        parallel_tool_calls=False,
        response_format={"type": "json_object"},
        user="u-1",
        extra={"metadata": {"a": "b"}, "model": "overridden", "stream": False},
    )
    assert body_of(request) == {
        "metadata": {"a": "b"},
        "model": "deepseek-chat",
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": PARTS, "name": "ann"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "look", "arguments": '{"x": 1}'},
                    }
                ],
            },
            {"role": "tool", "content": "a cat", "tool_call_id": "call_1"},
            {"role": "assistant", "content": "A cat."},
        ],
        "logprobs": True,
        "top_logprobs": 3,
        "max_tokens": 50,
        "temperature": 0.3,
        "top_p": 0.9,
        "top_k": 20,
        "seed": 7,
        "presence_penalty": 0.1,
        "frequency_penalty": 0.2,
        "stop": ["END"],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "look",
                    "description": "look at it",
                    "parameters": {"type": "object", "properties": {}},
                },
            }
        ],
        "tool_choice": {"type": "function", "function": {"name": "look"}},
        "parallel_tool_calls": False,
        "response_format": {"type": "json_object"},
        "user": "u-1",
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def test_minimal_body_sends_no_defaults() -> None:
    request = ChatRequest(model="m", messages=(Message("user", "hi"),))
    assert body_of(request, stream=False) == {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "stream": False,
    }


def test_reasoning_history_only_when_asked() -> None:
    request = ChatRequest(model="m", messages=HISTORY)
    sent = body_of(request, send_reasoning_history=True)["messages"]
    assert [m.get("reasoning_content") for m in sent] == [
        None,
        None,
        "I should look.",
        None,
        "Easy.",
    ]
    dropped = body_of(request)["messages"]
    assert all("reasoning_content" not in m for m in dropped)


@pytest.mark.parametrize(
    ("style", "thinking", "expected"),
    [
        ("deepseek", True, {"thinking": {"type": "enabled"}}),
        ("deepseek", False, {"thinking": {"type": "disabled"}}),
        ("deepseek", None, {}),
        ("chat_template_kwargs", True, {"chat_template_kwargs": {"thinking": True}}),
        ("chat_template_kwargs", False, {"chat_template_kwargs": {"thinking": False}}),
        ("chat_template_kwargs", None, {}),
        ("reasoning_effort", True, {"reasoning_effort": "medium"}),
        ("reasoning_effort", False, {}),
        ("none", True, {}),
    ],
)
def test_thinking_styles(style: ThinkingStyle, thinking: bool | None, expected: dict) -> None:
    request = ChatRequest(model="m", messages=(), thinking=thinking)
    body = body_of(request, style)
    for key in ("model", "messages", "stream", "stream_options"):
        body.pop(key)
    assert body == expected


def test_thinking_keeps_the_clients_own_settings() -> None:
    extra = {"chat_template_kwargs": {"custom": 1}, "reasoning_effort": "high"}
    on = ChatRequest(model="m", messages=(), thinking=True, extra=extra)
    off = ChatRequest(model="m", messages=(), thinking=False, extra=extra)
    assert body_of(on, "chat_template_kwargs")["chat_template_kwargs"] == {
        "custom": 1,
        "thinking": True,
    }
    assert body_of(on, "reasoning_effort")["reasoning_effort"] == "high"
    assert "reasoning_effort" not in body_of(off, "reasoning_effort")


@pytest.mark.parametrize(
    ("budget", "client", "expected"),
    [(None, None, "medium"), (1000, None, "low"), (1000, "high", "low"),
     (20000, None, "medium"), (20000, "high", "high"), (5000, "minimal", "minimal")],
)  # fmt: skip
def test_a_reasoning_budget_caps_the_effort(
    budget: int | None, client: str | None, expected: str
) -> None:
    extra = {} if client is None else {"reasoning_effort": client}
    sampling = Sampling(max_reasoning_tokens=budget)
    request = ChatRequest(model="m", messages=(), thinking=True, sampling=sampling, extra=extra)
    assert body_of(request, "reasoning_effort")["reasoning_effort"] == expected
    assert "max_reasoning_tokens" not in body_of(request, "deepseek")


def test_openai_style_upstreams_get_max_completion_tokens() -> None:
    request = ChatRequest(model="m", messages=(), sampling=Sampling(max_tokens=9))
    body = body_of(request, "reasoning_effort")
    assert body["max_completion_tokens"] == 9
    assert "max_tokens" not in body


def test_legacy_prompt_body() -> None:
    request = ChatRequest(
        model="m", messages=(), prompt="abc", sampling=Sampling(logprobs=True, top_logprobs=2)
    )
    body = body_of(request, stream=False)
    assert body == {"model": "m", "prompt": "abc", "logprobs": 2, "stream": False}


def decode(*chunks: dict[str, Any]) -> list[Event]:
    decoder = ChunkDecoder("p")
    out: list[Event] = []
    for chunk in chunks:
        decoder.feed(chunk, out)
    decoder.end(out)
    return out


def delta(finish: str | None = None, **fields: Any) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": fields, "finish_reason": finish}]}


def test_tool_calls_get_ids_and_stop_becomes_tool_calls() -> None:
    events = decode(
        delta(tool_calls=[{"index": 0, "function": {"name": "f", "arguments": {"a": 1}}}]),
        delta(tool_calls=[{"index": 0, "id": "again", "function": {"arguments": ""}}]),
        delta(tool_calls=[{"index": 0, "id": "again", "function": {"arguments": "x"}}]),
        delta(
            tool_calls=[{"index": 0, "function": {"arguments": "y"}}, {"function": {"name": "g"}}]
        ),
        delta("stop"),
    )
    first, third = events[0], events[3]
    assert isinstance(first, ToolCallDelta) and isinstance(third, ToolCallDelta)
    assert first.id is not None and first.id.startswith("call_") and len(first.id) > 10
    assert (first.index, first.name, first.arguments_fragment) == (0, "f", '{"a": 1}')
    assert events[1:3] == [ToolCallDelta(0, None, None, "x"), ToolCallDelta(0, None, None, "y")]
    assert (third.index, third.name, third.arguments_fragment) == (1, "g", "")
    assert third.id is not None and third.id != first.id
    assert events[4:] == [Finish("tool_calls")]


@pytest.mark.parametrize(
    ("upstream", "ours"),
    [
        ("length", "length"),
        ("content_filter", "content_filter"),
        ("function_call", "tool_calls"),
        ("insufficient_system_resource", "length"),
        ("something_new", "stop"),
    ],
)
def test_finish_reasons(upstream: str, ours: FinishReason) -> None:
    assert decode(delta(content="x"), delta(upstream), delta("stop")) == [
        TextDelta("x"),
        Finish(ours),
    ]


def test_unclosed_inline_think_is_reasoning_and_held_text_is_flushed() -> None:
    assert decode(delta(content=" <think>hmm"), delta(content=" <"), delta("stop")) == [
        ReasoningDelta("hmm"),
        ReasoningDelta(" "),
        ReasoningDelta("<"),
        Finish("stop"),
    ]
    assert decode(delta(content="\n"), delta("stop")) == [TextDelta("\n"), Finish("stop")]


def test_think_inside_content_stays_content() -> None:
    events = decode(delta(content="a"), delta(content="<think>b</think>"))
    assert events == [TextDelta("a"), TextDelta("<think>b</think>"), Finish("stop")]


def test_full_response_message() -> None:
    full = {
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": "<think>r</think>ok",
                    "tool_calls": [
                        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": ""}}
                    ],
                },
                "finish_reason": "tool_calls",
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2},
    }
    assert decode(full) == [
        ReasoningDelta("r"),
        TextDelta("ok"),
        ToolCallDelta(0, "c1", "f", ""),
        Finish("tool_calls"),
        Usage(3, 2),
    ]


def test_only_the_last_usage_counts() -> None:
    events = decode(
        {"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 1}},
        {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 4}},
    )
    assert events == [Finish("stop"), Usage(5, 4)]


def test_usage_fields() -> None:
    openai = {
        "prompt_tokens": 10,
        "completion_tokens": 6,
        "total_tokens": 16,
        "prompt_tokens_details": {"cached_tokens": 4},
        "completion_tokens_details": {"reasoning_tokens": 5},
    }
    deepseek = {"prompt_tokens": 10, "completion_tokens": 6, "prompt_cache_hit_tokens": 8}
    assert parse_usage(openai) == Usage(10, 6, reasoning_tokens=5, cached_prompt_tokens=4)
    assert parse_usage(deepseek) == Usage(10, 6, cached_prompt_tokens=8)
    assert parse_usage({"prompt_tokens_details": None}) == Usage()


def test_error_chunk_raises() -> None:
    with pytest.raises(UpstreamUnavailable, match="reported an error while answering: overloaded"):
        decode({"error": {"message": "overloaded", "type": "server_error"}})


def test_legacy_text_and_logprobs() -> None:
    chunk = {
        "choices": [
            {
                "index": 0,
                "text": "hi",
                "logprobs": {
                    "tokens": ["hi"],
                    "token_logprobs": [-0.1],
                    "top_logprobs": [{"hi": -0.1, "ho": -2.0}],
                },
                "finish_reason": "length",
            }
        ]
    }
    entries = [
        {
            "token": "hi",
            "logprob": -0.1,
            "top_logprobs": [{"token": "hi", "logprob": -0.1}, {"token": "ho", "logprob": -2.0}],
        }
    ]
    assert decode(chunk) == [TextDelta("hi", entries), Finish("length")]


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ({"error": {"message": "bad model"}}, "bad model"),
        ({"error": "plain"}, "plain"),
        ({"object": "error", "message": "vllm says"}, "vllm says"),
        ({"detail": "fastapi says"}, "fastapi says"),
        ([1, 2], "[1, 2]"),
    ],
)
def test_error_message(payload: Any, message: str) -> None:
    assert error_message(payload) == message
