"""Redis paused, killed and restarted under a running keyed gateway (a redis-server of each
test's own): what was recorded, what is still held, and that the next requests succeed."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from gateway.keys.records import UsageQuery
from gateway.keys.usage import UsageReader
from testkit.gateway_app import PrivateRedis
from testkit.mock_upstream import MockUpstream
from tests.support.faults import (
    ADMIN,
    PREFIX,
    SPACE,
    chat,
    eventually,
    held,
    keyed_gateway,
    nothing_held,
    records,
    spooled,
)


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as client:
        yield client


async def test_admissions_refused_during_a_stall_hold_nothing_once_redis_is_back(
    mock_upstream: MockUpstream,
    private_redis: PrivateRedis,
    session: aiohttp.ClientSession,
    tmp_path: Path,
) -> None:
    conc = 4
    async with keyed_gateway(
        mock_upstream, private_redis.url(), tmp_path, max_concurrency=conc, rpm=100
    ) as gw:
        assert (await chat(session, gw.root, gw.key))[0] == 200  # the key is cached
        private_redis.pause()
        refused = await asyncio.gather(*(chat(session, gw.root, gw.key) for _ in range(8)))
        assert [status for status, _ in refused] == [503] * 8
        private_redis.resume()  # Redis now runs the admissions it had queued
        await nothing_held(gw.redis, gw.key_id)
        minute = int(time.time() // 60)
        rpm = int(await gw.redis.get(SPACE.window("rpm", gw.key_id, minute)) or 0)
        assert rpm <= 1  # the refused requests count for nothing (the first one may)
        # The whole concurrency cap is there for the next requests.
        answers = await asyncio.gather(
            *(chat(session, gw.root, gw.key, "gap-model", stream=True) for _ in range(conc))
        )
        assert [status for status, _ in answers] == [200] * conc
        await gw.settled()
        assert len(await records(gw.redis)) == 1 + conc
        await nothing_held(gw.redis, gw.key_id)


async def test_settlements_survive_redis_killed_and_restarted_mid_load(
    mock_upstream: MockUpstream,
    private_redis: PrivateRedis,
    session: aiohttp.ClientSession,
    tmp_path: Path,
) -> None:
    async with keyed_gateway(
        mock_upstream, private_redis.url(), tmp_path, budget_tokens=100_000
    ) as gw:
        streams = [
            asyncio.ensure_future(chat(session, gw.root, gw.key, "long-model", stream=True))
            for _ in range(8)
        ]

        async def all_admitted() -> bool:
            return (await held(gw.redis, gw.key_id))[0] == 8

        await eventually(all_admitted)
        private_redis.stop()  # the streams end while Redis is away: settlement must wait
        assert [status for status, _ in await asyncio.gather(*streams)] == [200] * 8
        await gw.settled()
        assert gw.access.keeper.pending == 8
        assert len(spooled(tmp_path)) == 8
        private_redis.start()  # the append-only file brings the key and its slots back
        await gw.redis.connection_pool.disconnect()  # the test's own client reconnects

        async def replayed() -> bool:
            return gw.access.keeper.pending == 0

        await eventually(replayed)
        logged = await records(gw.redis)
        assert len(logged) == 8 and all(r["status"] == "200" for r in logged)
        await nothing_held(gw.redis, gw.key_id)
        charged = sum(int(r["charged_tokens"]) for r in logged)
        assert int(await gw.redis.get(SPACE.spent(gw.key_id, "all")) or 0) == charged
        assert (await chat(session, gw.root, gw.key))[0] == 200


async def test_a_settlement_retried_after_a_stall_is_charged_once(
    mock_upstream: MockUpstream,
    private_redis: PrivateRedis,
    session: aiohttp.ClientSession,
    tmp_path: Path,
) -> None:
    async with keyed_gateway(
        mock_upstream, private_redis.url(), tmp_path, budget_tokens=100_000
    ) as gw:
        streams = [
            asyncio.ensure_future(chat(session, gw.root, gw.key, "long-model", stream=True))
            for _ in range(6)
        ]

        async def all_admitted() -> bool:
            return (await held(gw.redis, gw.key_id))[0] == 6

        await eventually(all_admitted)
        private_redis.pause()  # settlements time out; Redis runs them when it resumes
        assert [status for status, _ in await asyncio.gather(*streams)] == [200] * 6
        await gw.settled()
        private_redis.resume()  # ... and then their retries arrive

        async def replayed() -> bool:
            return gw.access.keeper.pending == 0

        await eventually(replayed)
        logged = await records(gw.redis)
        assert len(logged) == 6
        usage = await UsageReader(gw.redis, prefix=PREFIX).query(UsageQuery())
        assert usage["totals"]["requests"] == 6
        charged = sum(int(r["charged_tokens"]) for r in logged)
        assert int(await gw.redis.get(SPACE.spent(gw.key_id, "all")) or 0) == charged
        await nothing_held(gw.redis, gw.key_id)


async def test_settlements_spooled_at_shutdown_are_replayed_at_the_next_start(
    mock_upstream: MockUpstream,
    private_redis: PrivateRedis,
    session: aiohttp.ClientSession,
    tmp_path: Path,
) -> None:
    async with keyed_gateway(mock_upstream, private_redis.url(), tmp_path) as gw:
        key, key_id = gw.key, gw.key_id
        streams = [
            asyncio.ensure_future(chat(session, gw.root, key, "long-model", stream=True))
            for _ in range(4)
        ]

        async def all_admitted() -> bool:
            return (await held(gw.redis, key_id))[0] == 4

        await eventually(all_admitted)
        private_redis.stop()
        assert [status for status, _ in await asyncio.gather(*streams)] == [200] * 4
    # The gateway stopped with Redis away: the settlements wait on disk.
    assert len(spooled(tmp_path)) == 4
    private_redis.start()
    async with keyed_gateway(mock_upstream, private_redis.url(), tmp_path) as gw:

        async def replayed() -> bool:
            return len(await records(gw.redis)) == 4

        await eventually(replayed)
        await nothing_held(gw.redis, key_id)
        assert (await chat(session, gw.root, key))[0] == 200
    assert spooled(tmp_path) == []


async def test_key_lookups_and_the_admin_api_give_up_after_redis_timeout_s(
    mock_upstream: MockUpstream,
    private_redis: PrivateRedis,
    session: aiohttp.ClientSession,
    tmp_path: Path,
) -> None:
    async with keyed_gateway(mock_upstream, private_redis.url(), tmp_path, timeout_s=0.3) as gw:
        private_redis.pause()
        admin = {"Authorization": f"Bearer {ADMIN}"}

        async def get(path: str, headers: dict[str, str]) -> int:
            async with session.get(f"{gw.root}{path}", headers=headers) as resp:
                return resp.status

        # Each gives up after 0.3 s (the deadline leaves room for a loaded machine, and is
        # well short of what an unbounded wait on a frozen Redis would take).
        lookups = [
            get("/v1/models", {"Authorization": f"Bearer {gw.key}"}),  # key not cached yet
            get("/admin/keys", admin),
            get(f"/admin/keys/{gw.key_id}", admin),
            get("/admin/usage", admin),
        ]
        statuses = await asyncio.wait_for(asyncio.gather(*lookups), timeout=3)
        assert statuses == [503] * 4
        private_redis.resume()
        assert await get("/admin/keys", admin) == 200
        assert (await chat(session, gw.root, gw.key))[0] == 200


async def test_a_live_request_keeps_its_slot_past_its_first_lease(
    mock_upstream: MockUpstream,
    private_redis: PrivateRedis,
    session: aiohttp.ClientSession,
    tmp_path: Path,
) -> None:
    async with keyed_gateway(
        mock_upstream, private_redis.url(), tmp_path, lease_s=1.0, max_concurrency=1
    ) as gw:
        stream = asyncio.ensure_future(chat(session, gw.root, gw.key, "longer-model", stream=True))
        slots = SPACE.slots(gw.key_id)

        async def admitted() -> bool:
            return await gw.redis.zcard(slots) == 1

        await eventually(admitted)
        ((_, first),) = await gw.redis.zrange(slots, 0, -1, withscores=True)

        async def renewed_past_first_lease() -> bool:
            ((_, deadline),) = await gw.redis.zrange(slots, 0, -1, withscores=True)
            return deadline > first and time.time() * 1000 > first

        await eventually(renewed_past_first_lease)
        assert (await chat(session, gw.root, gw.key))[0] == 429  # still held: it is alive
        assert (await stream)[0] == 200
        await gw.settled()
        await nothing_held(gw.redis, gw.key_id)
        assert (await chat(session, gw.root, gw.key))[0] == 200
