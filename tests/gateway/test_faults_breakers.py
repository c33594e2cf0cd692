"""Upstream faults against the breakers and readiness: one failing model among healthy ones on
the same provider (the process stays ready and says which model is down, unless that model
gates readiness), 429 back-pressure, an upstream killed and restarted under load, the
transitions in the log, the error code in the access log, and /readyz without upstream calls.
Each runs a live gateway (the real app factory) in front of the mock upstream."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest
from structlog.testing import capture_logs

from gateway.resources import DRAINING
from testkit.gateway_app import closed_port, gateway_settings, start_gateway
from testkit.mock_upstream import MockUpstream
from tests.support.faults import USER, eventually

MODELS = {
    "echo-model": {"routes": [{"provider": "mock", "model": "echo"}]},
    "fail-model": {"routes": [{"provider": "mock", "model": "fail-500"}]},
    "limited-model": {"routes": [{"provider": "mock", "model": "fail-429"}]},
    "busy-model": {
        "routes": [
            {"provider": "mock", "model": "fail-429"},
            {"provider": "mock", "model": "echo-chunks-3"},
        ]
    },
}
OPEN_AFTER = 3  # breaker.failures in these tests


@asynccontextmanager
async def open_gateway(
    mock: MockUpstream, prefix: str, *, models: dict[str, Any] | None = None, **providers: Any
) -> AsyncIterator[str]:
    """An unkeyed gateway in front of `mock` (and `providers`); yields its root URL."""
    base = gateway_settings(mock, prefix).providers
    every = {n: p.model_dump(exclude_unset=True) for n, p in base.items()} | providers
    settings = gateway_settings(
        mock,
        prefix,
        auth={"enabled": False},
        models=models or MODELS,
        routing={"breaker": {"failures": OPEN_AFTER}},
        providers=every,
    )
    runner, root = await start_gateway(settings)
    try:
        yield root
    finally:
        await runner.cleanup()


async def chat(session: aiohttp.ClientSession, root: str, model: str) -> aiohttp.ClientResponse:
    body = {"model": model, "messages": USER, "max_tokens": 5}
    async with session.post(
        f"{root}/v1/chat/completions", json=body, timeout=aiohttp.ClientTimeout(total=15)
    ) as resp:
        await resp.read()
        return resp


async def ready(session: aiohttp.ClientSession, root: str) -> tuple[int, dict[str, Any]]:
    async with session.get(f"{root}/readyz") as resp:
        return resp.status, await resp.json()


def sent(mock: MockUpstream, model: str) -> int:
    """Requests for the upstream model `model` that reached the mock."""
    return sum(1 for r in mock.requests if isinstance(r.body, dict) and r.body["model"] == model)


def events(logs: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [line for line in logs if line["event"] == name]


async def test_one_failing_model_does_not_block_the_other_models_of_its_provider(
    mock_upstream: MockUpstream, redis_prefix: str
) -> None:
    async with open_gateway(mock_upstream, redis_prefix) as root, aiohttp.ClientSession() as s:
        with capture_logs() as logs:
            for _ in range(OPEN_AFTER + 2):  # 502: the upstream's failure, passed on
                assert (await chat(s, root, "fail-model")).status in (502, 503)
            healthy = await asyncio.gather(
                *(chat(s, root, m) for m in ["echo-model", "fail-model"] * 10)
            )
        statuses = Counter(r.status for r in healthy[::2])
        assert statuses == {200: 10}  # 0 refused
        opened = events(logs, "breaker_opened")
        assert len(opened) == 1 and opened[0]["log_level"] == "warning"
        assert (opened[0]["provider"], opened[0]["model"], opened[0]["account"]) == (
            "mock",
            "fail-500",
            "",
        )
        assert opened[0]["consecutive_failures"] == OPEN_AFTER
        assert opened[0]["last_error"].startswith("upstream_unavailable (HTTP 500)")
        access = [line for line in events(logs, "request") if line["status"] == 502]
        assert access and {line["code"] for line in access} == {"upstream_unavailable"}
        assert all("code" not in line for line in events(logs, "request") if line["status"] == 200)
        status, body = await ready(s, root)
        # Its only route is failing: the body says so; the process still serves the rest.
        assert status == 200 and body["failing_models"] == ["fail-model"]
        assert body["serving_models"] == ["echo-model", "limited-model", "busy-model"]
        assert body["checks"] == {"redis": True, "accepting": True}
        async with s.get(f"{root}/metrics") as resp:
            text = await resp.text()
        assert 'gateway_model_available{model="fail-model"} 0.0' in text
        assert 'gateway_model_available{model="echo-model"} 1.0' in text
        assert "gateway_ready 1.0" in text
        mock = body["providers"]["mock"]
        assert mock["breakers"]["fail-500"]["state"] in ("open", "half_open")
        assert list(mock["breakers"]) == ["fail-500"]  # echo has none: it never failed


async def test_a_dead_single_route_model_among_healthy_ones_leaves_the_process_ready(
    mock_upstream: MockUpstream, redis_prefix: str
) -> None:
    """A provider that is down (connection refused) is the only route of one model: the process
    stays ready, names the dead model and serves the others; a model that gates readiness by
    its settings turns it unready."""
    dead: dict[str, Any] = {
        "kind": "openai",
        "base_url": f"http://127.0.0.1:{closed_port()}/v1",
        "connect_timeout_s": 1,
    }
    models = {
        "dead-model": {"routes": [{"provider": "dead", "model": "gpt-4o"}]},
        "echo-model": MODELS["echo-model"],
        "other-model": {"routes": [{"provider": "mock", "model": "echo-chunks-2"}]},
    }
    async with (
        open_gateway(mock_upstream, redis_prefix, models=models, dead=dead) as root,
        aiohttp.ClientSession() as s,
    ):
        for _ in range(OPEN_AFTER):
            assert (await chat(s, root, "dead-model")).status == 502
        status, body = await ready(s, root)
        assert status == 200 and body["status"] == "ready"
        assert body["failing_models"] == ["dead-model"]
        assert body["serving_models"] == ["echo-model", "other-model"]
        assert body["providers"]["dead"]["breakers"]["gpt-4o"]["state"] == "open"
        assert (await chat(s, root, "echo-model")).status == 200
        assert (await chat(s, root, "other-model")).status == 200
    gated = dict(models, **{"dead-model": {**models["dead-model"], "gates_readiness": True}})
    async with (
        open_gateway(mock_upstream, redis_prefix, models=gated, dead=dead) as root,
        aiohttp.ClientSession() as s,
    ):
        status, body = await ready(s, root)
        assert status == 200 and body["checks"]["models"] is True  # not known to fail yet
        for _ in range(OPEN_AFTER):
            assert (await chat(s, root, "dead-model")).status == 502
        status, body = await ready(s, root)
        assert status == 503 and body["checks"]["models"] is False
        assert body["failing_models"] == ["dead-model"]


async def test_a_429_moves_to_the_next_route_for_its_retry_after_and_opens_nothing(
    mock_upstream: MockUpstream, redis_prefix: str
) -> None:
    async with open_gateway(mock_upstream, redis_prefix) as root, aiohttp.ClientSession() as s:
        with capture_logs() as logs:
            first = await chat(s, root, "limited-model")
            assert first.status == 429 and first.headers["retry-after"] == "7"
            assert sent(mock_upstream, "fail-429") == 1
            for _ in range(3 * OPEN_AFTER):
                resp = await chat(s, root, "busy-model")
                assert resp.status == 200
                assert "skipped=mock" in resp.headers["x-gateway-route"]
                again = await chat(s, root, "limited-model")
                assert again.status == 429  # answered by the gateway: the upstream said wait
                assert 1 <= int(again.headers["retry-after"]) <= 7
            assert sent(mock_upstream, "fail-429") == 1  # Retry-After honoured
        assert not events(logs, "breaker_opened")
        codes = {line.get("code") for line in events(logs, "request") if line["status"] == 429}
        assert codes == {"upstream_rate_limited"}
        status, body = await ready(s, root)
        assert status == 200 and body["failing_models"] == []
        mock = body["providers"]["mock"]
        assert mock["breakers"] == {} and 0 < mock["rate_limited"]["fail-429"] <= 7


async def test_an_upstream_killed_and_restarted_under_load_serves_again_at_once(
    mock_upstream: MockUpstream, redis_prefix: str
) -> None:
    upstream = MockUpstream()
    url = await upstream.start()
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    models = {"back-model": {"routes": [{"provider": "back", "model": "echo-chunks-3"}]}}
    provider = {"kind": "openai", "base_url": url, "connect_timeout_s": 1}
    statuses: list[tuple[float, int]] = []
    running = True

    async def client(session: aiohttp.ClientSession, root: str) -> None:
        while running:
            try:
                status = (await chat(session, root, "back-model")).status
            except aiohttp.ClientError:
                status = 0
            statuses.append((time.monotonic(), status))
            if status != 200:
                await asyncio.sleep(0.01)  # a client's pause before it retries

    async with (
        open_gateway(mock_upstream, redis_prefix, models=models, back=provider) as root,
        aiohttp.ClientSession() as s,
    ):
        with capture_logs() as logs:
            load = [asyncio.ensure_future(client(s, root)) for _ in range(8)]
            try:
                await eventually(lambda: _served(statuses), within_s=10)
                await upstream.stop()

                async def opened() -> bool:
                    status, body = await ready(s, root)
                    return status == 200 and body.get("failing_models") == ["back-model"]

                await eventually(opened, within_s=10)
                await upstream.start(port)
                back = time.monotonic()

                async def served_since() -> bool:
                    return any(t >= back and code == 200 for t, code in statuses)

                await eventually(served_since, within_s=5)
                first = min(t for t, code in statuses if t >= back and code == 200)
                assert first - back < 5
                status, body = await ready(s, root)
                assert status == 200 and body["failing_models"] == []
            finally:
                running = False
                await asyncio.gather(*load)
                await upstream.stop()
        assert events(logs, "breaker_opened")
        closed = events(logs, "breaker_closed")
        assert closed and closed[0]["log_level"] == "info"
        assert (closed[0]["provider"], closed[0]["model"]) == ("back", "echo-chunks-3")


async def _served(statuses: list[tuple[float, int]]) -> bool:
    return any(code == 200 for _, code in statuses)


async def test_readyz_is_200_with_a_provider_down_says_which_and_calls_no_upstream(
    mock_upstream: MockUpstream, redis_prefix: str
) -> None:
    async with open_gateway(mock_upstream, redis_prefix) as root, aiohttp.ClientSession() as s:
        for _ in range(OPEN_AFTER):
            assert (await chat(s, root, "refused/echo")).status in (502, 504)
        before = len(mock_upstream.requests)
        for _ in range(5):
            status, body = await ready(s, root)
            assert status == 200, body
        assert len(mock_upstream.requests) == before  # no upstream call per probe
        assert body["checks"] == {"redis": True, "accepting": True}
        refused = body["providers"]["refused"]
        assert refused["breakers"]["echo"]["state"] == "open"
        assert refused["last_error"] and refused["last_success_age_s"] is None
        assert body["providers"]["mock"]["breakers"] == {}
        async with s.get(f"{root}/metrics") as resp:
            text = await resp.text()
        assert len(mock_upstream.requests) == before
        assert 'gateway_breaker_state{account="",model="echo",provider="refused"} 2.0' in text
        assert 'gateway_provider_open_breakers{provider="refused"} 1.0' in text
        assert "gateway_ready 1.0" in text


async def test_a_failing_account_is_skipped_and_its_conversations_move_to_the_next(
    mock_upstream: MockUpstream, redis_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    mock_upstream.api_key = "good-key"
    monkeypatch.setenv("BREAKER_TEST_KEY_A", "revoked-key")  # 401 on this account
    monkeypatch.setenv("BREAKER_TEST_KEY_B", "good-key")
    provider = {
        "kind": "openai",
        "base_url": mock_upstream.base_url,
        "api_key_env": "BREAKER_TEST_KEY_A",
        "api_key_envs": ["BREAKER_TEST_KEY_B"],
    }
    models = {"multi-model": {"routes": [{"provider": "multi", "model": "echo"}]}}
    async with (
        open_gateway(mock_upstream, redis_prefix, models=models, multi=provider) as root,
        aiohttp.ClientSession() as s,
    ):
        statuses = []
        for i in range(40):  # 40 conversations: about half of them belong to account A
            body = {"model": "multi-model", "messages": [{"role": "user", "content": f"c{i}"}]}
            async with s.post(f"{root}/v1/chat/completions", json=body) as resp:
                statuses.append(resp.status)
                if resp.status == 200:
                    assert "account=2/2" in resp.headers["x-gateway-route"]
        assert statuses == [200] * 40  # account A's failures were retried on account B
        assert len(mock_upstream.requests) < 40 + 2 * OPEN_AFTER  # A skipped once open
        status, body = await ready(s, root)
        assert status == 200 and body["failing_models"] == []
        multi = body["providers"]["multi"]["breakers"]
        assert list(multi) == ["echo@BREAKER_TEST_KEY_A"]
        assert multi["echo@BREAKER_TEST_KEY_A"]["state"] == "open"


async def test_a_process_told_to_stop_is_not_ready(
    mock_upstream: MockUpstream, redis_prefix: str
) -> None:
    """What the serving process sets on SIGTERM (gateway/server/serve.py): /readyz turns 503
    at once, so a load balancer stops sending while streams finish."""
    settings = gateway_settings(mock_upstream, redis_prefix, auth={"enabled": False})
    runner, root = await start_gateway(settings)
    try:
        async with aiohttp.ClientSession() as s:
            assert (await ready(s, root))[0] == 200
            runner.app[DRAINING].set()
            status, body = await ready(s, root)
            assert status == 503 and body["checks"]["accepting"] is False
            assert body["failing_models"] == []  # the models are fine: this process is not
    finally:
        await runner.cleanup()
