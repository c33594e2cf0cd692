"""The gateway process stopped under streaming load: with SIGTERM it finishes and records every
request it admitted; with SIGKILL only the requests in flight at that instant are lost, and
their capacity comes back when their leases run out. Each on a redis-server of its own."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from redis.asyncio import Redis

from testkit.fault_drills import (
    GatewayProcess,
    Load,
    account,
    create_key,
    idle,
    recovered,
    request_status,
)
from testkit.gateway_app import PrivateRedis
from testkit.mock_upstream import MockUpstream

CLIENTS = 4


def chat_requests(mock: MockUpstream) -> int:
    return sum(1 for r in mock.requests if r.path.endswith("/chat/completions"))


@pytest.fixture
async def redis(private_redis: PrivateRedis) -> AsyncIterator[Redis]:
    client = Redis.from_url(private_redis.url())
    yield client
    await client.aclose()


async def loaded_gateway(
    mock: MockUpstream, private_redis: PrivateRedis, redis: Redis, workdir: Path
) -> tuple[GatewayProcess, Load, str]:
    """A gateway process with CLIENTS streams running on it; (gateway, load, key id)."""
    gateway = GatewayProcess(
        workdir, private_redis.url(), mock.base_url, "echo-chunks-40-gap-0.05", lease_s=1.0
    )
    await gateway.start()
    key, key_id = await create_key(redis, max_concurrency=CLIENTS, budget_tokens=10**6)
    load = Load(gateway.root, key, CLIENTS)
    load.start()
    deadline = asyncio.get_running_loop().time() + 20
    while (await account(redis, key_id, 0)).live_slots < CLIENTS:  # every stream admitted
        assert asyncio.get_running_loop().time() < deadline, "the load did not start"
        await asyncio.sleep(0.02)
    return gateway, load, key_id


async def test_sigterm_under_load_records_every_request_and_holds_nothing(
    mock_upstream: MockUpstream, private_redis: PrivateRedis, redis: Redis, tmp_path: Path
) -> None:
    gateway, load, key_id = await loaded_gateway(mock_upstream, private_redis, redis, tmp_path)
    assert await gateway.stop(signal.SIGTERM) == 0  # streams finish within the grace period
    await load.stop()
    assert load.statuses["200"] >= CLIENTS
    served = chat_requests(mock_upstream)
    after = await account(redis, key_id, served)
    assert after.clean(), after  # recorded before the process exited: nothing lost or held
    await gateway.start()
    load.retarget(gateway.root)
    _, again = await recovered(redis, key_id, served, gateway.root, load.key)
    assert again.clean(), again
    await gateway.stop(signal.SIGTERM)


async def test_sigkill_under_load_loses_only_the_requests_in_flight(
    mock_upstream: MockUpstream, private_redis: PrivateRedis, redis: Redis, tmp_path: Path
) -> None:
    gateway, load, key_id = await loaded_gateway(mock_upstream, private_redis, redis, tmp_path)
    await gateway.stop(signal.SIGKILL)
    await load.stop()
    served = chat_requests(mock_upstream)
    killed = await account(redis, key_id, served)
    # Lost: only requests streaming at that instant (each client has one at a time).
    assert 0 < killed.lost <= CLIENTS, killed
    await gateway.start()  # the dead process's leases (1 s) run out; the cap is free again
    _, after = await recovered(redis, key_id, served, gateway.root, load.key, may_lose=CLIENTS)
    assert after.clean(may_lose=CLIENTS), after
    await idle(redis, key_id)  # the probe request of `recovered` has settled
    statuses = await asyncio.gather(
        *(request_status(gateway.root, load.key) for _ in range(CLIENTS))
    )
    assert statuses == [200] * CLIENTS  # all of the cap, none refused
    await gateway.stop(signal.SIGTERM)


async def test_an_upstream_restarted_under_streaming_load_serves_every_client_again(
    private_redis: PrivateRedis, redis: Redis, tmp_path: Path
) -> None:
    upstream = MockUpstream()
    url = await upstream.start()
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    gateway = GatewayProcess(tmp_path, private_redis.url(), url, "echo-chunks-5")
    await gateway.start()
    key, _ = await create_key(redis, max_concurrency=CLIENTS, budget_tokens=10**6)
    load = Load(gateway.root, key, CLIENTS)
    load.start()
    try:
        deadline = asyncio.get_running_loop().time() + 20
        while load.first_ok_after(0) is None:
            assert asyncio.get_running_loop().time() < deadline, "the load did not start"
            await asyncio.sleep(0.02)
        await upstream.stop()
        failed = sum(load.statuses.values()) - load.statuses["200"]
        while sum(load.statuses.values()) - load.statuses["200"] < failed + 10:  # it is down
            assert asyncio.get_running_loop().time() < deadline, "no failures seen"
            await asyncio.sleep(0.02)
        await upstream.start(port)
        back = time.monotonic()
        while (served := load.all_ok_after(back)) is None:
            assert time.monotonic() - back < 10, "not every client was served again"
            await asyncio.sleep(0.02)
        first = load.first_ok_after(back)
        assert first is not None and first - back < 5
        assert served - back < 5
    finally:
        await load.stop()
        await gateway.stop(signal.SIGTERM)
        await upstream.stop()
