"""The serving process polls, not sleeps, while it waits for the answer of an upstream whose
provider sets `busy_wait` (`[server] busy_wait_us`; plumbing/busy_wait.py), and sleeps when the
wait is off or the provider does not ask for it (the default: an upstream over the internet
takes far longer to answer than a sleeping CPU takes to wake)."""

from __future__ import annotations

import aiohttp
import pytest

from gateway.config.process import ServerSettings
from plumbing import busy_wait
from testkit.gateway_app import gateway_settings, start_gateway
from testkit.mock_upstream import MockUpstream


@pytest.mark.parametrize(
    ("busy_wait_us", "provider_busy_wait"), [(200, True), (0, True), (200, False)]
)
async def test_an_upstream_answer_is_polled_for_only_when_its_provider_asks(
    mock_upstream: MockUpstream,
    redis_prefix: str,
    monkeypatch: pytest.MonkeyPatch,
    busy_wait_us: int,
    provider_busy_wait: bool,
) -> None:
    turns: list[int] = []
    monkeypatch.setattr(busy_wait.os, "sched_yield", lambda: turns.append(1))
    server = ServerSettings(host="127.0.0.1", port=0, busy_wait_us=busy_wait_us)
    # Auth off: no Redis call to wait for, only the upstream's answer.
    provider = {
        "kind": "openai",
        "base_url": mock_upstream.base_url,
        "busy_wait": provider_busy_wait,
    }
    settings = gateway_settings(
        mock_upstream,
        redis_prefix,
        server=server,
        auth={"enabled": False},
        providers={"mock": provider},
    )
    runner, root = await start_gateway(settings)
    try:
        async with aiohttp.ClientSession() as session:
            body = {"model": "echo-model", "messages": [{"role": "user", "content": "hi"}]}
            for stream in (False, True):
                async with session.post(
                    f"{root}/v1/chat/completions", json={**body, "stream": stream}
                ) as resp:
                    assert resp.status == 200
                    await resp.read()
    finally:
        await runner.cleanup()
    assert bool(turns) == bool(busy_wait_us and provider_busy_wait)
