"""OpenAIUpstream against the mock upstream: mapping, streaming, errors, timeouts, disconnects."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from typing import Any

import pytest

from plumbing.busy_wait import BusyWait, Spin
from providers.base import Provider
from providers.errors import (
    ProviderError,
    UpstreamAuthError,
    UpstreamBadRequest,
    UpstreamRateLimited,
    UpstreamTimeout,
    UpstreamUnavailable,
)
from providers.types import (
    ChatRequest,
    Event,
    Finish,
    Message,
    ReasoningDelta,
    Sampling,
    TextDelta,
    Tool,
    ToolCallDelta,
    Usage,
)
from providers.upstream.errors import parse_retry_after
from providers.upstream.openai import OpenAIUpstream, UpstreamConfig
from testkit.mock_scenarios import REASONING_TEXT, SCENARIOS, prompt_tokens
from testkit.mock_upstream import MockUpstream

Factory = Callable[..., OpenAIUpstream]
USER_TEXT = "tell me about the sea"


@pytest.fixture
async def make(mock_upstream: MockUpstream) -> AsyncIterator[Factory]:
    """Builds providers on the mock (fields of UpstreamConfig as keywords); closes them after."""
    made: list[OpenAIUpstream] = []
    busy = BusyWait(Spin(0.05, 4))

    def factory(**fields: Any) -> OpenAIUpstream:
        fields.setdefault("name", "mock")
        fields.setdefault("base_url", mock_upstream.base_url)
        provider = OpenAIUpstream(UpstreamConfig(**fields), busy=busy)
        made.append(provider)
        return provider

    yield factory
    # Every answer the test asked for was done with (read, failed, timed out or abandoned):
    # none is still counted as awaited, before closing could hide it.
    assert busy.waiting == 0
    for provider in made:
        await provider.close()


def chat(model: str, text: str = USER_TEXT, **fields: Any) -> ChatRequest:
    return ChatRequest(model=model, messages=(Message("user", text),), stream=True, **fields)


async def collect(provider: OpenAIUpstream, request: ChatRequest) -> list[Event]:
    async with asyncio.timeout(10):
        return [event async for event in provider.chat(request)]


def text_of(events: list[Event]) -> str:
    return "".join(e.text for e in events if isinstance(e, TextDelta))


def reasoning_of(events: list[Event]) -> str:
    return "".join(e.text for e in events if isinstance(e, ReasoningDelta))


async def test_is_a_provider(make: Factory) -> None:
    assert isinstance(make(), Provider)


async def test_echo_stream(make: Factory, mock_upstream: MockUpstream) -> None:
    events = await collect(make(), chat("echo"))
    body = mock_upstream.requests[-1].body
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert text_of(events) == USER_TEXT
    assert sum(isinstance(e, TextDelta) for e in events) == len(USER_TEXT.split())
    assert [e for e in events if isinstance(e, Finish | Usage)] == [
        Finish("stop"),
        Usage(prompt_tokens=prompt_tokens(body), completion_tokens=len(USER_TEXT.split())),
    ]


async def test_non_streaming_upstream(make: Factory, mock_upstream: MockUpstream) -> None:
    request = ChatRequest(model="echo", messages=(Message("user", USER_TEXT),))
    events = await collect(make(stream_upstream=False), request)
    body = mock_upstream.requests[-1].body
    assert body["stream"] is False
    assert "stream_options" not in body
    assert events == [
        TextDelta(USER_TEXT),
        Finish("stop"),
        Usage(prompt_tokens=prompt_tokens(body), completion_tokens=len(USER_TEXT.split())),
    ]


async def test_stream_upstream_streams_a_json_clients_answer_too(
    make: Factory, mock_upstream: MockUpstream
) -> None:
    request = ChatRequest(model="echo", messages=(Message("user", USER_TEXT),))
    events = await collect(make(stream_upstream=True), request)
    body = mock_upstream.requests[-1].body
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert text_of(events) == USER_TEXT


async def test_json_answer_to_a_stream_request(make: Factory) -> None:
    events = await collect(make(), chat("tools-json", tools=(Tool("search"),)))
    assert [e for e in events if isinstance(e, ToolCallDelta)] == [
        ToolCallDelta(0, "call_mock0", "search", json.dumps({"query": USER_TEXT}))
    ]
    assert Finish("tool_calls") in events


async def test_max_tokens_and_stop(make: Factory, mock_upstream: MockUpstream) -> None:
    provider = make()
    events = await collect(provider, chat("echo", sampling=Sampling(max_tokens=2)))
    assert text_of(events) == "tell me "
    assert Finish("length") in events
    events = await collect(provider, chat("echo", sampling=Sampling(stop=("the", "xyz"))))
    assert mock_upstream.requests[-1].body["stop"] == ["the", "xyz"]
    assert text_of(events) == "tell me about "
    assert Finish("stop") in events


async def test_many_chunks_and_logprobs(make: Factory) -> None:
    request = chat("echo-chunks-300", sampling=Sampling(logprobs=True, top_logprobs=2))
    events = await collect(make(), request)
    deltas = [e for e in events if isinstance(e, TextDelta)]
    assert len(deltas) == 300
    assert deltas[0].logprobs is not None
    assert deltas[0].logprobs[0]["token"] == deltas[0].text


async def test_tool_call_fragments(make: Factory, mock_upstream: MockUpstream) -> None:
    tools = (Tool("search", "find things", {"type": "object"}), Tool("fetch"))
    events = await collect(make(), chat("tools-calls-2", tools=tools, tool_choice="auto"))
    calls = [e for e in events if isinstance(e, ToolCallDelta)]
    heads = [c for c in calls if c.id is not None]
    assert [(c.index, c.id, c.name) for c in heads] == [
        (0, "call_mock0", "search"),
        (1, "call_mock1", "fetch"),
    ]
    assert all(c.name is None for c in calls if c.id is None)
    for index in (0, 1):
        arguments = "".join(c.arguments_fragment for c in calls if c.index == index)
        assert json.loads(arguments) == {"query": USER_TEXT}
    assert len(calls) > 4  # the arguments came in several fragments
    assert isinstance(events[-2], Finish) and events[-2].reason == "tool_calls"
    body = mock_upstream.requests[-1].body
    assert body["tools"][0] == {
        "type": "function",
        "function": {
            "name": "search",
            "description": "find things",
            "parameters": {"type": "object"},
        },
    }
    assert body["tools"][1] == {"type": "function", "function": {"name": "fetch"}}
    assert body["tool_choice"] == "auto"


@pytest.mark.parametrize("model", ["reasoning-content", "reasoning", "think-inline"])
async def test_reasoning_styles_are_normalized(make: Factory, model: str) -> None:
    events = await collect(make(), chat(model))
    assert reasoning_of(events) == REASONING_TEXT
    assert text_of(events) == USER_TEXT
    first_text = next(i for i, e in enumerate(events) if isinstance(e, TextDelta))
    assert all(not isinstance(e, ReasoningDelta) for e in events[first_text:])
    usage = events[-1]
    assert isinstance(usage, Usage)
    assert usage.reasoning_tokens == len(REASONING_TEXT.split())
    assert usage.completion_tokens == len(REASONING_TEXT.split()) + len(USER_TEXT.split())


@pytest.mark.parametrize("model", ["echo-cached-3", "echo-hit-3"])
async def test_cached_prompt_tokens(make: Factory, model: str) -> None:
    events = await collect(make(), chat(model))
    assert isinstance(events[-1], Usage)
    assert events[-1].cached_prompt_tokens == 3


@pytest.mark.parametrize("model", ["keepalive", "keepalive-crlf", "echo-crlf-nodone"])
async def test_keepalives_crlf_and_missing_done(make: Factory, model: str) -> None:
    events = await collect(make(), chat(model))
    assert text_of(events) == USER_TEXT
    assert Finish("stop") in events


async def test_usage_is_optional(make: Factory) -> None:
    events = await collect(make(), chat("echo-nousage"))
    assert not any(isinstance(e, Usage) for e in events)
    assert events[-1] == Finish("stop")


async def test_legacy_prompt_uses_completions(make: Factory, mock_upstream: MockUpstream) -> None:
    request = ChatRequest(model="echo", messages=(), prompt="once upon a time", stream=True)
    events = await collect(make(), request)
    assert mock_upstream.requests[-1].path == "/v1/completions"
    assert mock_upstream.requests[-1].body["prompt"] == "once upon a time"
    assert text_of(events) == "once upon a time"
    assert Finish("stop") in events


async def test_headers_and_key(mock_upstream: MockUpstream, make: Factory) -> None:
    mock_upstream.api_key = "sk-right"
    provider = make(api_key="sk-right", headers={"X-Title": "gateway"})
    assert "sk-right" not in repr(UpstreamConfig(name="x", base_url="http://h", api_key="sk-right"))
    await collect(provider, chat("echo"))
    headers = mock_upstream.requests[-1].headers
    assert headers["Authorization"] == "Bearer sk-right"
    assert headers["X-Title"] == "gateway"


async def test_wrong_key_names_the_provider_not_the_key(
    mock_upstream: MockUpstream, make: Factory
) -> None:
    mock_upstream.api_key = "sk-right"
    with pytest.raises(UpstreamAuthError) as info:
        await collect(make(name="tao", api_key="sk-wrong-secret"), chat("echo"))
    assert "tao" in info.value.message
    assert "sk-" not in info.value.message
    assert info.value.upstream_status == 401


@pytest.mark.parametrize(
    ("status", "error", "retry_after"),
    [
        (401, UpstreamAuthError, None),
        (403, UpstreamAuthError, None),
        (429, UpstreamRateLimited, 7),
        (400, UpstreamBadRequest, None),
        (404, UpstreamBadRequest, None),
        (422, UpstreamBadRequest, None),
        (402, UpstreamUnavailable, None),
        (500, UpstreamUnavailable, None),
        (503, UpstreamUnavailable, 7),
        (504, UpstreamTimeout, None),
    ],
)
async def test_http_errors(
    make: Factory, status: int, error: type[ProviderError], retry_after: int | None
) -> None:
    with pytest.raises(error) as info:
        await collect(make(), chat(f"fail-{status}"))
    assert type(info.value) is error
    assert info.value.retry_after == retry_after
    assert info.value.upstream_status == status
    assert info.value.provider == "mock"
    if error is UpstreamBadRequest:
        assert info.value.message == f"Provider 'mock' rejected the request: mock failure {status}"
        assert not info.value.retryable


async def test_unknown_model_is_a_bad_request(make: Factory) -> None:
    with pytest.raises(UpstreamBadRequest, match="does not exist"):
        await collect(make(), chat("no-such-model"))


async def test_connection_refused(make: Factory, free_port: int) -> None:
    provider = make(base_url=f"http://127.0.0.1:{free_port}/v1")
    with pytest.raises(UpstreamUnavailable, match="could not be reached") as info:
        await collect(provider, chat("echo"))
    assert "Connect" in info.value.detail  # the library's words stay in the logs


async def test_connect_timeout(make: Factory) -> None:
    """A listener whose accept queue is full: the kernel drops our SYN, the connect hangs."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(0)
        fillers = [socket.socket() for _ in range(3)]
        try:
            for filler in fillers:
                filler.setblocking(False)
                filler.connect_ex(server.getsockname())
            port = server.getsockname()[1]
            provider = make(base_url=f"http://127.0.0.1:{port}/v1", connect_timeout_s=0.2)
            with pytest.raises(UpstreamTimeout, match="connect"):
                await collect(provider, chat("echo"))
        finally:
            for filler in fillers:
                filler.close()


async def test_error_frame_mid_stream(make: Factory) -> None:
    events: list[Event] = []
    with pytest.raises(UpstreamUnavailable, match="mock midstream failure"):
        async with asyncio.timeout(5):
            async for event in make().chat(chat("error-midstream")):
                events.append(event)
    assert text_of(events) == "tell me "


async def test_death_mid_stream_raises(make: Factory) -> None:
    events: list[Event] = []
    with pytest.raises(UpstreamUnavailable, match="broke off"):
        async with asyncio.timeout(5):
            async for event in make().chat(chat("die-midstream-after-2")):
                events.append(event)
    assert text_of(events) == "tell me "
    assert not any(isinstance(e, Finish) for e in events)


async def test_first_byte_timeout(make: Factory) -> None:
    with pytest.raises(UpstreamTimeout, match="first byte"):
        await collect(make(first_byte_timeout_s=0.1), chat("slow-delay-2"))


async def test_keepalives_do_not_count_as_first_byte(make: Factory) -> None:
    with pytest.raises(UpstreamTimeout, match="first byte"):
        await collect(make(first_byte_timeout_s=0.15), chat("keepalive-gap-0.1"))
    events = await collect(make(idle_timeout_s=0.5), chat("keepalive-gap-0.1"))
    assert text_of(events) == USER_TEXT


async def test_idle_timeout(make: Factory, mock_upstream: MockUpstream) -> None:
    events: list[Event] = []
    with pytest.raises(UpstreamTimeout, match="idle"):
        async for event in make(idle_timeout_s=0.1).chat(chat("stall-after-1")):
            events.append(event)
    assert text_of(events) == "tell "
    await mock_upstream.wait_disconnect()


async def test_comments_after_the_first_data_do_not_hold_a_stream_open(
    make: Factory, mock_upstream: MockUpstream
) -> None:
    """An upstream that sends only `: keep-alive` comments after its first data: the idle
    deadline runs from the last data event, whatever comments came since."""
    events: list[Event] = []
    with pytest.raises(UpstreamTimeout, match="sent no data for 0.3 s") as caught:
        async for event in make(idle_timeout_s=0.3).chat(chat("stall-after-1-comments-gap-0.05")):
            events.append(event)
    assert "keep-alive comments do not count" in caught.value.message
    assert text_of(events) == "tell "
    await mock_upstream.wait_disconnect()


async def test_the_total_timeout_bounds_an_answer_that_keeps_sending(
    make: Factory, mock_upstream: MockUpstream
) -> None:
    """Data every 0.05 s keeps the idle deadline away; the total deadline still ends it."""
    events: list[Event] = []
    upstream = make(idle_timeout_s=5.0, total_timeout_s=0.4)
    with pytest.raises(UpstreamTimeout, match=r"within 0.4 s \(total timeout\)"):
        async for event in upstream.chat(chat("echo-chunks-400-gap-0.05")):
            events.append(event)
    assert 0 < len(text_of(events).split()) < 400
    await mock_upstream.wait_disconnect()
    with pytest.raises(UpstreamTimeout, match="total timeout"):  # comments count for nothing
        await collect(make(idle_timeout_s=5.0, total_timeout_s=0.4), chat("stall-after-1-comments"))


async def test_closing_the_stream_disconnects_upstream(
    make: Factory, mock_upstream: MockUpstream
) -> None:
    async with aclosing(make().chat(chat("stall-after-1"))) as stream:
        async for event in stream:
            if isinstance(event, TextDelta):
                break
    recorded = await mock_upstream.wait_disconnect()
    assert recorded.body["model"] == "stall-after-1"


async def test_cancelling_while_waiting_disconnects_upstream(
    make: Factory, mock_upstream: MockUpstream
) -> None:
    task = asyncio.create_task(collect(make(), chat("hang")))
    await asyncio.wait_for(mock_upstream.request_arrived.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    recorded = await mock_upstream.wait_disconnect()
    assert recorded.body["model"] == "hang"


async def test_requests_share_one_kept_alive_connection(
    make: Factory, mock_upstream: MockUpstream
) -> None:
    provider = make()
    await collect(provider, chat("echo"))
    await collect(provider, chat("echo"))
    first, second = mock_upstream.requests[-2:]
    assert first.peer == second.peer


async def test_a_body_left_open_after_done_ends_the_stream_and_its_connection(
    make: Factory,
) -> None:
    """`[DONE]` then nothing (the chunked body never ends): the answer is complete, the rest of
    the body is awaited for at most a second, and the connection is not used again."""
    peers: list[object] = []
    frame = {"choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": "stop"}]}
    sse = f"data: {json.dumps(frame)}\n\ndata: [DONE]\n\n".encode()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peers.append(writer.get_extra_info("peername"))
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            await reader.readexactly(length)
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n" % (len(sse), sse)
            )

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        provider = make(base_url=f"http://127.0.0.1:{port}/v1")
        loop = asyncio.get_running_loop()
        for _ in range(2):
            started = loop.time()
            events = await collect(provider, chat("echo"))
            assert text_of(events) == "hi" and isinstance(events[-1], Finish)
            assert 0.9 < loop.time() - started < 5
        assert len(peers) == 2  # each answer's connection was closed, not reused
    finally:
        server.close()


async def test_models_and_health(make: Factory, mock_upstream: MockUpstream) -> None:
    provider = make()
    cards = await provider.models()
    assert [c.id for c in cards] == list(SCENARIOS)
    assert {c.owned_by for c in cards} == {"mock"}
    assert await provider.health()
    mock_upstream.models_status = 503
    assert not await provider.health()
    with pytest.raises(UpstreamUnavailable):
        await provider.models()


async def test_configured_models_need_no_upstream(make: Factory) -> None:
    provider = make(name="tao", base_url="http://127.0.0.1:9/v1", models=("deepseek-chat",))
    cards = await provider.models()
    assert [(c.id, c.owned_by) for c in cards] == [("deepseek-chat", "tao")]


async def test_health_of_a_dead_upstream(make: Factory, free_port: int) -> None:
    provider = make(base_url=f"http://127.0.0.1:{free_port}/v1", health_timeout_s=0.5)
    assert not await provider.health()


async def test_closed_provider_refuses(make: Factory) -> None:
    provider = make()
    await provider.open()
    await provider.close()
    with pytest.raises(UpstreamUnavailable, match="shutting down"):
        await collect(provider, chat("echo"))
    assert not await provider.health()


def test_parse_retry_after() -> None:
    assert parse_retry_after("7") == 7
    assert parse_retry_after("1.2") == 2
    assert parse_retry_after(None) is None
    assert parse_retry_after("soon") is None
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 0
