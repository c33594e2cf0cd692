"""An upstream that breaks the protocol (testkit/broken_upstream.py), met through every protocol
with the official SDKs as clients: each answer is a 502 (or a 429 with a sane Retry-After) in the
protocol's own error shape, never a 500 or a broken stream; each request leaves one usage record
with the status it got, and the key holds no slot or reservation afterwards."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import anthropic
import openai
import pytest

from testkit.broken_upstream import BrokenUpstream
from testkit.gateway_app import Gateway, gateway_settings
from testkit.mock_upstream import MockUpstream
from tests.support.probed import Probed, probed_gateway

USER = [{"role": "user", "content": "hello there"}]


@pytest.fixture
async def broken() -> AsyncIterator[BrokenUpstream]:
    upstream = BrokenUpstream()
    await upstream.start()
    yield upstream
    await upstream.stop()


@pytest.fixture
async def gw(
    mock_upstream: MockUpstream, broken: BrokenUpstream, redis_prefix: str
) -> AsyncIterator[Probed]:
    provider = {"kind": "openai", "base_url": broken.base_url, "direct_models": ["*"]}
    settings = gateway_settings(
        mock_upstream,
        redis_prefix,
        providers={"broken": provider, "streamed": {**provider, "stream_upstream": True}},
        models={},
        routing={"breaker": {"failures": 1000, "window": 1000}},  # every request reaches it
    )
    async with probed_gateway(settings, mock_upstream) as gateway:
        yield gateway


async def chat(gw: Gateway, model: str, stream: bool) -> None:
    client = gw.async_client()
    if not stream:
        await client.chat.completions.create(model=model, messages=USER)  # type: ignore[arg-type]
        return
    events = await client.chat.completions.create(
        model=model,
        messages=USER,  # type: ignore[arg-type]
        stream=True,
        stream_options={"include_usage": True},
    )
    async for _ in events:
        pass


async def completions(gw: Gateway, model: str, stream: bool) -> None:
    await gw.async_client().completions.create(model=model, prompt="hello there")


class StreamFailed(Exception):
    """A stream that ended with an error event (the SDK raises nothing for it)."""


async def responses(gw: Gateway, model: str, stream: bool) -> None:
    client = gw.async_client()
    if not stream:
        await client.responses.create(model=model, input="hello there")
        return
    async with client.responses.stream(model=model, input="hello there") as events:
        async for event in events:
            if event.type == "response.failed":
                raise StreamFailed(str(event.response.error))


async def messages(gw: Gateway, model: str, stream: bool) -> None:
    client = anthropic.AsyncAnthropic(base_url=gw.root, api_key=gw.key, max_retries=0)
    if not stream:
        await client.messages.create(model=model, max_tokens=50, messages=USER)  # type: ignore[arg-type]
        return
    async with client.messages.stream(model=model, max_tokens=50, messages=USER) as events:  # type: ignore[arg-type]
        async for _ in events:
            pass


Call = Callable[[Gateway, str, bool], Any]
CALLS: list[tuple[str, Call, bool]] = [
    ("chat", chat, False),
    ("chat stream", chat, True),
    ("completions", completions, False),
    ("responses", responses, False),
    ("responses stream", responses, True),
    ("messages", messages, False),
    ("messages stream", messages, True),
]


def failure(exc: openai.APIError | anthropic.APIError | StreamFailed) -> int | str:
    """The HTTP status of an SDK's error, or 502 for an error event in a stream that names the
    provider's failure (the anthropic SDK reports those with the stream's status, 200)."""
    status = getattr(exc, "status_code", None)
    if status is not None and status != 200:
        return int(status)
    said = str(exc)
    return 502 if "Provider 'broken'" in said or "Provider 'streamed'" in said else said


@pytest.mark.parametrize("behaviour", ["html", "garbled", "overcount", "nochoices", "reset"])
@pytest.mark.parametrize("provider", ["broken", "streamed"])
async def test_a_broken_upstream_is_a_502_in_every_protocol(
    gw: Probed, broken: BrokenUpstream, behaviour: str, provider: str
) -> None:
    model = f"{provider}/{behaviour}"
    failures = []
    for name, call, stream in CALLS:
        try:
            await call(gw, model, stream)
        except (openai.APIError, anthropic.APIError, StreamFailed) as exc:
            failures.append((name, failure(exc)))
        else:
            failures.append((name, "answered"))
    assert failures == [(name, 502) for name, _, _ in CALLS]
    await gw.settled()
    assert len(broken.requests) == len(CALLS)
    recorded = await gw.outcomes()
    # A 502, or a stream that failed after its 200: recorded with that 200 and its error code.
    assert len(recorded) == len(CALLS), recorded
    statuses = [outcome.partition(" ")[0] for outcome in recorded]
    assert set(statuses) <= {"502", "200"}, recorded
    assert statuses.count("200") <= sum(stream for _, _, stream in CALLS), recorded
    assert all(outcome.partition(" ")[2].startswith("upstream_") for outcome in recorded)
    assert await gw.held() == (0, 0)


async def test_an_upstream_retry_after_of_infinity_is_passed_on_capped(gw: Probed) -> None:
    with pytest.raises(openai.RateLimitError) as caught:
        await chat(gw, "broken/retry-inf", False)
    assert 1 <= int(caught.value.response.headers["Retry-After"]) <= 3600
    await gw.settled()
    assert await gw.statuses() == ["429"]
