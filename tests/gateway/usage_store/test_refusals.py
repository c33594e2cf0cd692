"""Requests refused for their budget or a rate limit (429) are recorded in usage: a record with
no tokens, status 429 and its error code, so that the store's summaries count them (requests,
errors, by status and error code) while nothing is charged. Through a keyed gateway with the
usage store on, with the openai SDK; and a refusal's record is written once however often it
is retried."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import openai
from redis.asyncio import Redis

from gateway.access.contract import Grant, Outcome, Principal, Ticket
from gateway.keys.limiter import REFUSED, Settlement
from gateway.keys.records import KeyCreate
from gateway.keys.redis_access import RedisAccessControl
from gateway.keys.store import KeyStore
from gateway.keys.usage import usage_entry
from providers.types import Usage
from testkit.gateway_app import REDIS_URL
from tests.support.console import ADMIN_KEY, ConsoleGateway

AUTH = {"Authorization": f"Bearer {ADMIN_KEY}"}


async def _summary(root: str, **params: str) -> list[dict[str, Any]]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{root}/admin/usage/summary", params=params, headers=AUTH) as resp,
    ):
        assert resp.status == 200, await resp.text()
        return list((await resp.json())["data"])


async def test_refusals_are_recorded_and_counted(
    console_gateway: ConsoleGateway, redis_prefix: str
) -> None:
    redis = Redis.from_url(REDIS_URL)
    store = KeyStore(redis, prefix=redis_prefix)
    rated, rated_record = await store.create(KeyCreate(name="rated", rpm=1))
    broke, broke_record = await store.create(KeyCreate(name="broke", budget_tokens=0))
    await redis.aclose()
    root = console_gateway.root
    outcomes: dict[str, list[int]] = {}
    for name, secret in (("rated", rated), ("broke", broke)):
        client = openai.AsyncOpenAI(base_url=f"{root}/v1", api_key=secret, max_retries=0)
        try:
            for _ in range(3):
                try:
                    await client.chat.completions.create(
                        model="echo-model", messages=[{"role": "user", "content": "hi"}]
                    )
                    outcomes.setdefault(name, []).append(200)
                except openai.RateLimitError as exc:
                    outcomes.setdefault(name, []).append(exc.status_code)
        finally:
            await client.close()
    assert outcomes == {"rated": [200, 429, 429], "broke": [429, 429, 429]}

    wanted = {
        (rated_record.id, 200, ""): 1,
        (rated_record.id, 429, "rate_limit_exceeded"): 2,
        (broke_record.id, 429, "insufficient_quota"): 3,
    }
    deadline = time.monotonic() + 20
    while True:
        rows = await _summary(root, group_by="key,status,error_code")
        got = {(r["key"], r["status"], r["error_code"]): r for r in rows}
        if {k: got[k]["requests"] for k in wanted if k in got} == wanted:
            break
        assert time.monotonic() < deadline, f"the store never held the refusals: {rows}"
        await asyncio.sleep(0.05)
    for key in wanted:
        if key[1] == 429:  # no tokens, every one an error
            row = got[key]
            assert row["errors"] == row["requests"]
            assert (row["prompt_tokens"], row["completion_tokens"], row["cost"]) == (0, 0, 0)
    # The all-keys totals (the Overview's error rate) count them too.
    [total] = await _summary(root, key=rated_record.id)
    assert (total["requests"], total["errors"]) == (3, 2)
    async with (
        aiohttp.ClientSession() as session,
        session.get(
            f"{root}/admin/usage/records",
            params={"key": broke_record.id},
            headers=AUTH,
        ) as resp,
    ):
        records = (await resp.json())["data"]
    assert [(r["status"], r["error_code"], r["provider"]) for r in records] == [
        (429, "insufficient_quota", "")
    ] * 3
    assert all(r["charged_tokens"] == 0 and r["latency_ms"] > 0 for r in records)


async def test_a_refusals_record_is_written_once(redis: Redis, tmp_path: Path) -> None:
    prefix = f"test:{uuid.uuid4().hex}:"
    access = RedisAccessControl(
        redis, prefix=prefix, usage_stream_maxlen=0, spool_dir=tmp_path / "spool"
    )
    try:
        ticket = Ticket(Principal("key_x", "x"), "m", "req-1", prompt_tokens=5, max_tokens=9)
        outcome = Outcome(Usage(), 429, error_code="rate_limit_exceeded")
        await access.refused(ticket, outcome)
        await access.refused(ticket, outcome)  # another refusal of the same request id
        grant = Grant(ticket=ticket, max_tokens=9, reserved_tokens=0)
        again = Settlement("key_x", "tok.1", REFUSED, 0, usage_entry(grant, outcome, time.time()))
        assert await access._limiter.settle(again) == 0
        assert await access._limiter.settle(again) == -1  # a retry of one recorded
        entries = await redis.xrange(access.store.space.usage_log())
        assert len(entries) == 3
        assert {e[b"status"] for _, e in entries} == {b"429"}
        assert {e[b"charged_tokens"] for _, e in entries} == {b"0"}
        assert 0 < await redis.pttl(access.store.space.refused("tok.1")) <= 3_600_000
    finally:
        await access.aclose()
        keys = [key async for key in redis.scan_iter(match=prefix + "*")]
        if keys:
            await redis.delete(*keys)
