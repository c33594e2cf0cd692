"""A request without max_tokens is not capped: it reserves the model's real output limit and is
sent upstream without a limit, unless the operator set one for the model. Through the real app
in front of the mock upstream, which records what it was sent.

Token arithmetic: the user message "alpha beta gamma delta epsilon" is estimated at 15 prompt
tokens by the gateway (see tests/gateway/keys/test_access_e2e.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from pydantic import ValidationError

from gateway.config.providers import ModelSettings
from gateway.pipeline.output_limits import OutputLimits
from gateway.routing import Route
from testkit.gateway_app import Gateway
from testkit.mock_upstream import MockUpstream
from tests.support.configured import configured_gateway

USER = [{"role": "user", "content": "alpha beta gamma delta epsilon"}]
PROMPT_ESTIMATE = 15
MODELS = {
    "echo-model": {"routes": [{"provider": "mock", "model": "echo"}]},
    "big-model": {"routes": [{"provider": "mock", "model": "echo"}], "max_output_tokens": 30_000},
    "capped-model": {
        "routes": [{"provider": "mock", "model": "echo"}],
        "max_output_tokens": 30_000,
        "default_max_tokens": 3,
    },
}


def sent_limit(mock: MockUpstream) -> Any:
    body = mock.requests[-1].body
    return body.get("max_tokens", body.get("max_completion_tokens"))


@pytest.fixture
async def gw(mock_upstream: MockUpstream, redis_prefix: str) -> AsyncIterator[Gateway]:
    async with configured_gateway(
        mock_upstream, redis_prefix, models=MODELS, key={"tpm": 100_000}
    ) as gateway:
        yield gateway


@pytest.mark.parametrize("stream", [False, True])
async def test_no_max_tokens_sends_no_limit_upstream(gateway: Gateway, stream: bool) -> None:
    raw = await gateway.post_raw({"model": "echo-model", "messages": USER, "stream": stream})
    assert raw.status == 200
    assert sent_limit(gateway.mock) is None
    body = {"model": "reasoner-model", "input": "hi", "stream": stream}
    raw = await gateway.post_raw(body, path="/v1/responses")
    assert raw.status == 200
    assert sent_limit(gateway.mock) is None  # Codex sends no max_output_tokens


async def test_reserves_the_models_output_limit(gw: Gateway) -> None:
    raw = await gw.post_raw({"model": "big-model", "messages": USER})
    assert raw.status == 200
    assert raw.headers["x-ratelimit-remaining-tokens"] == str(100_000 - PROMPT_ESTIMATE - 30_000)
    assert sent_limit(gw.mock) is None


async def test_the_clients_and_the_operators_limits_are_sent(gw: Gateway) -> None:
    client = gw.async_client()
    resp = await client.chat.completions.create(model="big-model", messages=USER, max_tokens=2)
    assert sent_limit(gw.mock) == 2 and resp.choices[0].finish_reason == "length"
    resp = await client.chat.completions.create(model="capped-model", messages=USER)
    assert sent_limit(gw.mock) == 3 and resp.choices[0].finish_reason == "length"
    resp = await client.chat.completions.create(model="capped-model", messages=USER, max_tokens=9)
    assert sent_limit(gw.mock) == 9 and resp.choices[0].finish_reason == "stop"


async def test_a_grant_clipped_by_the_budget_is_sent(
    mock_upstream: MockUpstream, redis_prefix: str
) -> None:
    key = {"budget_tokens": 1000}
    async with configured_gateway(mock_upstream, redis_prefix, models=MODELS, key=key) as gw:
        raw = await gw.post_raw({"model": "big-model", "messages": USER})
        assert raw.status == 200
        assert sent_limit(mock_upstream) == 1000 - PROMPT_ESTIMATE


class _Engine:
    """A provider that knows its context length, as the local engine does."""

    name = "local"
    context_length = 1000


def test_a_local_engine_reserves_its_context_room() -> None:
    limits = OutputLimits({}, fallback=4096)
    route = Route(_Engine(), "deepseek-v3.1", None)  # type: ignore[arg-type]
    plan = limits.plan("deepseek-chat", (route,), prompt_tokens=100, requested=None)
    assert plan.reserve == 900 and plan.upstream(900) is None
    assert plan.upstream(500) == 500  # clipped by a budget: the cap is sent
    asked = limits.plan("deepseek-chat", (route,), prompt_tokens=100, requested=5000)
    assert asked.reserve == 900 and asked.upstream(900) == 900


def test_a_model_of_unknown_limit_reserves_the_fallback_but_is_not_capped() -> None:
    plan = OutputLimits({}, fallback=4096).plan("x/y", (), prompt_tokens=10, requested=None)
    assert plan.reserve == 4096 and plan.upstream(4096) is None


def test_a_default_above_the_output_limit_is_refused() -> None:
    routes = [{"provider": "mock", "model": "echo"}]
    with pytest.raises(ValidationError, match="exceeds max_output_tokens"):
        ModelSettings(routes=routes, max_output_tokens=10, default_max_tokens=11)  # type: ignore[arg-type]
