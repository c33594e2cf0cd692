"""Streams stay alive while the answer is slow to come: clients with read timeouts far shorter
than the upstream's silences (before the first token and in the middle of an answer) get their
whole answer. The gateway here sends a stream's headers 0.1 s after it began and a keep-alive
after 0.1 s of silence; the clients give up after 1 s without a byte; the mock upstream stays
silent for 2 s (see testkit/mock_upstream.py for the scenarios named in the routes)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import openai
import pytest

from testkit.gateway_app import Gateway
from testkit.mock_upstream import MockUpstream
from tests.support.configured import configured_gateway
from tests.support.sse_events import check_stream, sse_events
from tests.support.sse_rules import check_chat_stream, sse_payloads

USER = [{"role": "user", "content": "alpha beta gamma delta epsilon"}]
CLIENT_TIMEOUT_S = 1.0
SERVER = {
    "host": "127.0.0.1",
    "port": 0,
    "max_body_bytes": 64 * 1024,
    "stream_headers_after_s": 0.1,
    "keepalive_s": 0.1,
}
MODELS = {
    # the upstream's first byte after 2 s
    "slow-model": {"routes": [{"provider": "mock", "model": "slow-delay-2"}]},
    # two words with 2 s of silence after each
    "pause-model": {"routes": [{"provider": "mock", "model": "echo-chunks-2-gap-2"}]},
    # the first route fails only after the headers went out; the second answers
    "late-fallback": {
        "routes": [
            {"provider": "mock", "model": "fail-500-delay-1"},
            {"provider": "mock", "model": "echo"},
        ]
    },
    "late-failure": {"routes": [{"provider": "mock", "model": "fail-500-delay-1"}]},
    "never": {"routes": [{"provider": "mock", "model": "hang"}]},
}


@pytest.fixture
async def gw(mock_upstream: MockUpstream, redis_prefix: str) -> AsyncIterator[Gateway]:
    async with configured_gateway(
        mock_upstream, redis_prefix, server=SERVER, models=MODELS
    ) as gateway:
        yield gateway


async def test_openai_sdk_with_a_short_read_timeout_gets_a_slow_first_token(gw: Gateway) -> None:
    client = gw.async_client(timeout=CLIENT_TIMEOUT_S)
    stream = await client.chat.completions.create(model="slow-model", messages=USER, stream=True)
    content = [c.choices[0].delta.content or "" async for c in stream if c.choices]
    assert "".join(content) == "alpha beta gamma delta epsilon"


async def test_responses_silence_mid_answer_gets_in_progress_events(gw: Gateway) -> None:
    client = gw.async_client(timeout=CLIENT_TIMEOUT_S)
    async with client.responses.stream(model="pause-model", input="alpha beta") as stream:
        kinds = [event.type async for event in stream]
        final = await stream.get_final_response()
    assert final.output_text == "alpha beta" and final.status == "completed"
    # Codex resets its idle timer only on events: the silences are filled with in_progress.
    first_text = kinds.index("response.output_text.delta")
    assert "response.in_progress" in kinds[first_text:]
    assert kinds[-1] == "response.completed"


async def test_responses_stream_with_keepalives_keeps_codex_rules(gw: Gateway) -> None:
    raw = await gw.post_raw(
        {"model": "slow-model", "input": "alpha beta", "stream": True}, path="/v1/responses"
    )
    events = sse_events(raw.body)  # sequence numbers stay in order
    final = check_stream(events)
    assert final["status"] == "completed"
    assert [e["type"] for e in events[:3]] == ["response.created"] + ["response.in_progress"] * 2


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
async def test_silence_is_filled_with_sse_comments(gw: Gateway, path: str) -> None:
    body: dict[str, Any] = {"model": "slow-model", "stream": True}
    body.update({"messages": USER} if "chat" in path else {"prompt": "alpha beta"})
    raw = await gw.post_raw(body, path=path)
    assert raw.status == 200
    assert raw.body.count(b"\n: keep-alive\n\n") >= 2  # after the opening chunk
    if "chat" in path:
        assert check_chat_stream(raw.body, include_usage=False).content.startswith("alpha")
    else:
        assert sse_payloads(raw.body)[-1] == "[DONE]"


async def test_a_route_failing_after_the_headers_still_falls_back(
    gw: Gateway, mock_upstream: MockUpstream
) -> None:
    raw = await gw.post_raw({"model": "late-fallback", "messages": USER, "stream": True})
    assert raw.status == 200
    assert raw.body.index(b": keep-alive") < raw.body.index(b"alpha")  # headers went out first
    stream = check_chat_stream(raw.body, include_usage=False)  # no error frame
    assert stream.content == "alpha beta gamma delta epsilon"
    assert [r.body["model"] for r in mock_upstream.requests] == ["fail-500-delay-1", "echo"]


async def test_every_route_failing_after_the_headers_is_an_error_in_the_stream(
    gw: Gateway,
) -> None:
    raw = await gw.post_raw({"model": "late-failure", "messages": USER, "stream": True})
    assert raw.status == 200
    payloads = sse_payloads(raw.body)
    assert json.loads(payloads[0])["choices"][0]["delta"]["role"] == "assistant"
    error = json.loads(payloads[-1])["error"]
    assert error["message"] == "Provider 'mock' failed with HTTP 500: mock failure 500"
    assert "[DONE]" not in payloads

    client = gw.async_client(timeout=CLIENT_TIMEOUT_S)
    with pytest.raises(openai.APIError, match="mock failure 500"):
        async for _ in await client.chat.completions.create(
            model="late-failure", messages=USER, stream=True
        ):
            pass

    raw = await gw.post_raw(
        {"model": "late-failure", "input": "hi", "stream": True}, path="/v1/responses"
    )
    final = check_stream(sse_events(raw.body), last="response.failed")
    assert final["error"]["message"] == "Provider 'mock' failed with HTTP 500: mock failure 500"


async def test_a_client_leaving_while_kept_alive_closes_the_upstream_request(
    gw: Gateway, mock_upstream: MockUpstream
) -> None:
    body = {"model": "never", "messages": USER, "stream": True}
    async with aiohttp.ClientSession() as session:
        resp = await session.post(
            f"{gw.base_url}/chat/completions", json=body, headers=gw.auth_headers()
        )
        assert resp.status == 200
        await resp.content.readuntil(b"\n: keep-alive\n\n")
        resp.close()
    left = await mock_upstream.wait_disconnect()
    assert left.body["model"] == "hang"
    await gw.settled()


async def test_early_headers_say_where_the_request_went(
    mock_upstream: MockUpstream, redis_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The provider's placement (here: which of the upstream's accounts the conversation keeps
    to) is decided before the request is sent; headers that go out before the first token
    carry it, as the finished answer's would."""
    monkeypatch.setenv("MOCK_KEY_1", "sk-one")
    monkeypatch.setenv("MOCK_KEY_2", "sk-two")
    provider = {
        "kind": "openai",
        "base_url": mock_upstream.base_url,
        "api_key_envs": ["MOCK_KEY_1", "MOCK_KEY_2"],
        "direct_models": ["*"],
    }
    async with configured_gateway(
        mock_upstream,
        redis_prefix,
        server=SERVER,
        providers={"mock": provider},
        models={"slow-model": MODELS["slow-model"]},
    ) as gw:
        raw = await gw.post_raw({"model": "slow-model", "messages": USER, "stream": True})
        assert raw.status == 200
        assert raw.body.index(b": keep-alive") < raw.body.index(b"alpha")  # headers went early
        route = dict(f.split("=", 1) for f in raw.headers["x-gateway-route"].split("; "))
        assert route["provider"] == "mock" and route["account"] in {"1/2", "2/2"}
        json_answer = await gw.post_raw({"model": "slow-model", "messages": USER})
        assert json_answer.headers["x-gateway-route"] == raw.headers["x-gateway-route"]
