"""Routing by difficulty through the real app: auto models, key policies, the client's switch,
stickiness across gateways, breakers, shadow mode, and the decision in the header, the usage
record and the metrics."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from redis.asyncio import Redis

from testkit.mock_upstream import MockUpstream
from tests.support.routing import (
    ADMIN_KEY,
    EASY,
    GOOD_KEY_ENV,
    HARD,
    Routed,
    chat,
    fields,
    gateway_process,
    open_routed,
    routing_settings,
    until,
)


@pytest.fixture
async def routed(mock_upstream: MockUpstream, redis_prefix: str) -> AsyncIterator[Routed]:
    async with open_routed(routing_settings(mock_upstream, redis_prefix), mock_upstream) as gw:
        yield gw


async def test_an_auto_model_decides_per_request_on_chat(routed: Routed) -> None:
    client = routed.client(await routed.key())
    answer, route = await chat(client, "auto-model", HARD)
    assert answer.choices[0].message.content  # served
    assert route["thinking"] == "on" and route["reason"] == "model"
    assert float(route["score"]) >= 0.5
    assert route["provider"] == "mock" and route["model"] == "echo"
    assert routed.sent_thinking() == {"type": "enabled"}
    _, route = await chat(client, "auto-model", EASY)
    assert route["thinking"] == "off" and float(route["score"]) < 0.5
    assert routed.sent_thinking() == {"type": "disabled"}
    _, route = await chat(client, "auto-model", "Prove that there are infinitely many primes.")
    assert route == {**route, "thinking": "on", "reason": "rule:proof-request@2"}


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/responses"])
async def test_an_auto_model_decides_on_completions_and_responses(
    routed: Routed, path: str
) -> None:
    key = await routed.key()
    field = "prompt" if path == "/v1/completions" else "input"
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {key}"}) as http:
        for text, expected in ((HARD, "on"), (EASY, "off")):
            body = {"model": "auto-model", field: text, "stream": True}
            async with http.post(routed.root + path, json=body) as resp:
                assert resp.status == 200
                await resp.read()
                route = fields(resp.headers["x-gateway-route"])
            assert route["thinking"] == expected and route["reason"] == "model"
            sent = {"on": {"type": "enabled"}, "off": {"type": "disabled"}}[expected]
            assert routed.sent_thinking() == sent


async def test_the_client_switch_is_honoured_or_refused_by_policy(routed: Routed) -> None:
    off = {"thinking": {"type": "disabled"}}
    client = routed.client(await routed.key(thinking="client"))
    _, route = await chat(client, "auto-model", HARD, extra_body=off)
    assert (route["thinking"], route["reason"]) == ("off", "client")
    assert routed.sent_thinking() == {"type": "disabled"}
    _, route = await chat(client, "auto-model", EASY, reasoning_effort="high")
    assert (route["thinking"], route["reason"]) == ("on", "client")
    strict = routed.client(await routed.key(thinking="auto"))
    _, route = await chat(strict, "auto-model", HARD, extra_body=off)
    assert (route["thinking"], route["reason"], route["client"]) == ("on", "model", "refused")
    assert routed.sent_thinking() == {"type": "enabled"}


async def test_a_key_with_thinking_off_never_receives_reasoning(routed: Routed) -> None:
    client = routed.client(await routed.key(thinking="off"))
    # the upstream reasons whatever it is asked; the gateway still keeps it from this key
    answer, route = await chat(client, "reasoning-auto", HARD)
    assert (route["thinking"], route["reason"]) == ("off", "policy:off")
    assert routed.sent_thinking() == {"type": "disabled"}
    assert "reasoning_content" not in (answer.choices[0].message.model_extra or {})
    assert answer.choices[0].message.content
    stream = await client.chat.completions.create(
        model="reasoning-auto",
        messages=[{"role": "user", "content": HARD}],
        stream=True,
        extra_body={"thinking": {"type": "enabled"}},
    )
    deltas = [c.choices[0].delta for c in [chunk async for chunk in stream] if c.choices]
    assert not any((d.model_extra or {}).get("reasoning_content") for d in deltas)
    assert "".join(d.content or "" for d in deltas)
    # with thinking on, the same upstream's reasoning does arrive
    thinker = routed.client(await routed.key(thinking="on"))
    answer, route = await chat(thinker, "reasoning-auto", EASY)
    assert (route["thinking"], route["reason"]) == ("on", "policy:on")
    assert answer.choices[0].message.model_extra["reasoning_content"]


async def test_a_turn_that_continues_keeps_the_mode_and_a_new_question_is_judged_anew(
    routed: Routed, mock_upstream: MockUpstream, redis_prefix: str, tmp_path: Path
) -> None:
    key = await routed.key()
    first = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": HARD}]
    _, route = await chat(routed.client(key), "auto-model", "", messages=first)
    assert route["thinking"] == "on" and route["reason"] == "model"
    answered = [*first, {"role": "assistant", "content": "There are 738 such pairs."}]
    go_on = {"role": "user", "content": "Go on."}
    # a second gateway process on the same Redis
    async with gateway_process(mock_upstream, redis_prefix, tmp_path) as other:
        client = openai.AsyncOpenAI(base_url=f"{other}/v1", api_key=key, max_retries=0)
        async with client:
            # "go on" continues the work: the conversation's mode, whichever gateway serves it
            _, route = await chat(client, "auto-model", "", messages=[*answered, go_on])
            assert (route["thinking"], route["reason"]) == ("on", "sticky")
            assert routed.sent_thinking() == {"type": "enabled"}
            # an easy follow-up with an ask of its own is judged anew
            table = {"role": "user", "content": "Thanks! Now format that answer as a table."}
            _, route = await chat(client, "auto-model", "", messages=[*answered, table])
            assert (route["thinking"], route["reason"]) == ("off", "model")
        # and it is now the mode the work continues in
        formatted = [*answered, table, {"role": "assistant", "content": "| pairs |"}, go_on]
        _, route = await chat(routed.client(key), "auto-model", "", messages=formatted)
        assert (route["thinking"], route["reason"]) == ("off", "sticky")
    # small talk, then a hard question: judged anew, on
    easy_first = [{"role": "user", "content": EASY}]
    _, route = await chat(routed.client(key), "auto-model", "", messages=easy_first)
    assert route["thinking"] == "off"
    easy_answered = [*easy_first, {"role": "assistant", "content": "Buenos días."}]
    _, route = await chat(routed.client(key), "auto-model", "", messages=[*easy_answered, go_on])
    assert (route["thinking"], route["reason"]) == ("off", "sticky")
    hard_next = [*easy_answered, first[1]]
    _, route = await chat(routed.client(key), "auto-model", "", messages=hard_next)
    assert (route["thinking"], route["reason"]) == ("on", "model")


async def test_tool_results_keep_the_mode_and_declared_tools_decide_nothing(
    routed: Routed,
) -> None:
    client = routed.client(await routed.key())
    tools = [{"type": "function", "function": {"name": "calc", "parameters": {"type": "object"}}}]
    _, route = await chat(client, "auto-model", HARD + " Use the calculator.", tools=tools)
    assert (route["thinking"], route["reason"]) == ("on", "model")  # an agent's hard task
    _, route = await chat(client, "auto-model", EASY, tools=tools)
    assert (route["thinking"], route["reason"]) == ("off", "model")
    turns = [
        {"role": "user", "content": HARD},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "calc", "arguments": "{}"}}
        ]},
        {"role": "tool", "tool_call_id": "c1", "content": "738"},
    ]  # fmt: skip
    _, route = await chat(client, "auto-model", "", messages=turns[:1], tools=tools)
    assert route["thinking"] == "on"  # the conversation begins thinking
    _, route = await chat(client, "auto-model", "", messages=turns, tools=tools)
    assert (route["thinking"], route["reason"]) == ("on", "sticky")


async def test_shadow_mode_reports_without_applying(routed: Routed) -> None:
    client = routed.client(await routed.key())
    _, route = await chat(client, "shadow-model", HARD)
    assert (route["thinking"], route["reason"]) == ("off", "default")
    assert (route["shadow_thinking"], route["shadow_reason"]) == ("on", "model")
    assert routed.sent_thinking() is None  # served as the static model it still is
    async with aiohttp.ClientSession() as http, http.get(routed.root + "/metrics") as resp:
        text = await resp.text()
    assert (
        'gateway_routing_decisions_total{load="none",mode="shadow",provider="mock",'
        'reason="model",thinking="on"} 1.0'
    ) in text
    assert (
        'gateway_routing_decisions_total{load="none",mode="applied",provider="mock",'
        'reason="default",thinking="off"} 1.0'
    ) in text


async def test_the_decision_is_in_the_usage_record(routed: Routed, redis: Redis) -> None:
    client = routed.client(await routed.key())
    _, route = await chat(client, "auto-model", HARD)
    _, static = await chat(client, "static-model", HARD)
    assert (static["thinking"], static["reason"]) == ("off", "default")
    await routed.settled()
    entries = await redis.xrange(f"{routed.prefix}usage-log")
    records = [{k.decode(): v.decode() for k, v in e.items()} for _, e in entries]
    auto, plain = records
    assert auto["route_reason"] == "model" and auto["thinking"] == "on"
    assert fields(auto["route"]) == route
    assert plain["route_reason"] == "default" and plain["thinking"] == ""  # provider default


async def test_a_failing_upstream_opens_its_breaker_and_closes_on_recovery(
    mock_upstream: MockUpstream, redis_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    mock_upstream.api_key = "upstream-secret"  # `flaky` sends none: 401 until it is cleared
    monkeypatch.setenv(GOOD_KEY_ENV, "upstream-secret")
    breaker = {"failures": 2, "cooldown_s": 1.0}
    settings = routing_settings(mock_upstream, redis_prefix, breaker=breaker)
    async with open_routed(settings, mock_upstream) as gw:
        client = gw.client(await gw.key())
        for _ in range(2):
            _, route = await chat(client, "flaky-model", EASY)
            assert route["provider"] == "good" and "skipped" not in route
        sent = len(mock_upstream.requests)
        _, route = await chat(client, "flaky-model", EASY)
        assert route["provider"] == "good" and route["skipped"] == "flaky"
        assert len(mock_upstream.requests) == sent + 1  # nothing sent to the open route
        async with aiohttp.ClientSession() as http:

            async def breaker() -> dict[str, Any]:
                async with http.get(gw.root + "/readyz") as resp:
                    assert resp.status == 200  # the model has a route that serves
                    body = await resp.json()
                    return dict(body["providers"]["flaky"]["breakers"]["echo"])

            async def probe_due() -> bool:
                return (await breaker())["probe_in_s"] == 0

            async with http.get(gw.root + "/metrics") as resp:
                text = await resp.text()
            labels = 'account="",model="echo",provider="flaky"'
            assert f"gateway_breaker_opened{{{labels}}} 1.0" in text
            assert f"gateway_breaker_state{{{labels}}} 2.0" in text
            assert 'gateway_provider_open_breakers{provider="flaky"} 1.0' in text
            assert (await breaker())["last_error"].startswith("upstream_auth_failed (HTTP 401)")
            await until(probe_due)
            mock_upstream.api_key = None  # the upstream recovers
            _, route = await chat(client, "flaky-model", EASY)  # the probe
            assert route["provider"] == "flaky" and "skipped" not in route
            assert (await breaker())["state"] == "closed"


async def test_without_panic_every_route_open_is_an_immediate_503_with_the_route_header(
    mock_upstream: MockUpstream, redis_prefix: str
) -> None:
    breaker = {"failures": 1, "cooldown_s": 60, "panic": False}
    settings = routing_settings(mock_upstream, redis_prefix, breaker=breaker)
    async with open_routed(settings, mock_upstream) as gw:
        client = gw.client(await gw.key())
        with pytest.raises(openai.InternalServerError):  # 502: the upstream failed
            await chat(client, "down-model", EASY)
        sent = len(mock_upstream.requests)
        with pytest.raises(openai.APIStatusError) as caught:
            await chat(client, "down-model", EASY)
        assert caught.value.status_code == 503
        assert caught.value.response.headers["retry-after"]
        assert fields(caught.value.response.headers["x-gateway-route"])["skipped"] == "flaky"
        assert len(mock_upstream.requests) == sent


async def test_in_panic_mode_a_model_whose_every_route_is_open_still_tries_them(
    mock_upstream: MockUpstream, redis_prefix: str
) -> None:
    breaker = {"failures": 1, "cooldown_s": 60}
    settings = routing_settings(mock_upstream, redis_prefix, breaker=breaker)
    async with open_routed(settings, mock_upstream) as gw:
        client = gw.client(await gw.key())
        with pytest.raises(openai.InternalServerError):  # 502: the breaker opens
            await chat(client, "down-model", EASY)
        sent = len(mock_upstream.requests)
        with pytest.raises(openai.InternalServerError) as caught:  # the upstream's own answer
            await chat(client, "down-model", EASY)
        assert len(mock_upstream.requests) == sent + 1
        route = fields(caught.value.response.headers["x-gateway-route"])
        assert route["provider"] == "flaky" and route["panic"] == "1"


async def test_policy_through_the_admin_api_and_the_default_model(routed: Routed) -> None:
    auth = {"Authorization": f"Bearer {ADMIN_KEY}"}
    async with aiohttp.ClientSession(headers=auth) as http:
        bad = {"name": "p", "policy": {"thinking": "sometimes"}}
        async with http.post(routed.root + "/admin/keys", json=bad) as resp:
            assert resp.status == 400
            assert "policy" in (await resp.json())["error"]["param"]
        body = {"name": "p", "policy": {"thinking": "on", "default_model": "auto-model"}}
        async with http.post(routed.root + "/admin/keys", json=body) as resp:
            assert resp.status == 201, await resp.text()
            created = await resp.json()
        assert created["policy"] == {
            "thinking": "on",
            "max_reasoning_tokens": None,
            "providers": "any",
            "default_model": "auto-model",
        }
        client = routed.client(created["key"])
        answer, route = await chat(client, "claude-sonnet-4-5", EASY)  # not served here
        assert answer.model == "auto-model"
        assert (route["thinking"], route["reason"]) == ("on", "policy:on")
        patch = {"policy": {"thinking": "off", "providers": "local"}}
        async with http.patch(routed.root + f"/admin/keys/{created['id']}", json=patch) as resp:
            assert resp.status == 200
            assert (await resp.json())["policy"]["providers"] == "local"
    # the key may no longer use an upstream, and this gateway has no local engine
    fresh = routed.client(await routed.key(providers="local"))
    with pytest.raises(openai.PermissionDeniedError) as caught:
        await chat(fresh, "auto-model", EASY)
    assert caught.value.code == "provider_not_allowed"
    assert json.loads(caught.value.response.text)["error"]["param"] == "model"


async def test_policy_auto_refuses_the_client_switch_on_static_models_too(routed: Routed) -> None:
    on = {"thinking": {"type": "enabled"}}
    client = routed.client(await routed.key(thinking="auto"))
    _, route = await chat(client, "static-model", HARD, extra_body=on)
    assert (route["thinking"], route["reason"], route["client"]) == ("off", "default", "refused")
    assert routed.sent_thinking() is None
    permissive = routed.client(await routed.key())
    _, route = await chat(permissive, "static-model", HARD, extra_body=on)
    assert (route["thinking"], route["reason"]) == ("on", "client")
