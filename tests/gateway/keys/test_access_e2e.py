"""Keys, budgets, rate limits, concurrency and usage through the real app (two instances on
one Redis where it matters), in front of the mock upstream.

Token arithmetic used below: the user message "alpha beta gamma delta epsilon" is estimated at
15 prompt tokens by the gateway (30 chars / 3 + 4 + 1) and counted as 6 by the mock; with
max_tokens 5 a request reserves 20 tokens and, answered in full, uses 11.
"""

from __future__ import annotations

import asyncio
import io
import json
import math
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest
import structlog
from redis.asyncio import Redis

from gateway.config.process import LoggingSettings
from gateway.keys.store import KeySpace
from gateway.observability.logging import configure_logging
from testkit.gateway_app import gateway_settings, start_gateway
from testkit.mock_upstream import MockUpstream
from tests.support.sse_rules import check_chat_stream

ADMIN = "admin-" + uuid.uuid4().hex
ADMIN_AUTH = {"Authorization": f"Bearer {ADMIN}"}
USER = [{"role": "user", "content": "alpha beta gamma delta epsilon"}]
MODELS = {
    "echo-model": {"routes": [{"provider": "mock", "model": "echo"}]},
    "gap-model": {"routes": [{"provider": "mock", "model": "echo-gap-0.01"}]},
    "stall-model": {"routes": [{"provider": "mock", "model": "stall"}]},
}


@asynccontextmanager
async def live(mock: MockUpstream, prefix: str) -> AsyncIterator[str]:
    """A gateway instance (real app factory) with an admin key; yields its root URL."""
    settings = gateway_settings(mock, prefix, admin={"api_key": ADMIN}, models=MODELS)
    runner, root = await start_gateway(settings)
    try:
        yield root
    finally:
        await runner.cleanup()


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as client:
        yield client


async def create_key(session: aiohttp.ClientSession, root: str, **body: Any) -> tuple[str, str]:
    """(secret, id) of a key created through the admin API."""
    async with session.post(
        f"{root}/admin/keys", json={"name": "e2e", **body}, headers=ADMIN_AUTH
    ) as resp:
        assert resp.status == 201, await resp.text()
        created = await resp.json()
    return created["key"], created["id"]


async def chat(
    session: aiohttp.ClientSession,
    root: str,
    key: str,
    *,
    model: str = "echo-model",
    stream: bool = False,
) -> tuple[int, dict[str, str], bytes]:
    body = {"model": model, "messages": USER, "max_tokens": 5, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    async with session.post(
        f"{root}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
    ) as resp:
        return resp.status, dict(resp.headers), await resp.read()


def error_code(body: bytes) -> str:
    return str(json.loads(body)["error"]["code"])


async def eventually(check: Callable[[], Awaitable[bool]], within_s: float = 3.0) -> None:
    """Wait until `check()` holds (settlement runs just after a stream's last byte)."""
    deadline = time.monotonic() + within_s
    while not await check():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


async def in_one_minute(scenario: Callable[[], Awaitable[None]]) -> None:
    """Run a rate-window scenario; run it again (fresh key) if it straddled a minute boundary."""
    for _ in range(2):
        minute = int(time.time() // 60)
        await scenario()
        if int(time.time() // 60) == minute:
            return
    raise AssertionError("two runs straddled a minute boundary")


async def test_budget_holds_under_100_concurrent_streams(
    mock_upstream: MockUpstream,
    redis_prefix: str,
    session: aiohttp.ClientSession,
    redis: Redis,
) -> None:
    async with live(mock_upstream, redis_prefix) as root:
        key, key_id = await create_key(session, root, budget_tokens=200)  # about 10 x 20
        results = await asyncio.gather(
            *(chat(session, root, key, model="gap-model", stream=True) for _ in range(100))
        )
        space = KeySpace(redis_prefix)

        async def settled() -> bool:
            return await redis.zcard(space.slots(key_id)) == 0

        await eventually(settled)
        totals: dict[str, int] = {}

        async def recorded() -> bool:  # every request: the admitted settled, the refused too
            async with session.get(
                f"{root}/admin/usage", params={"key_id": key_id}, headers=ADMIN_AUTH
            ) as resp:
                totals.update((await resp.json())["totals"])
            return totals["requests"] == 100

        await eventually(recorded)

    admitted = [check_chat_stream(body, include_usage=True) for s, _, body in results if s == 200]
    refused = [body for status, _, body in results if status != 200]
    assert 10 <= len(admitted) < 100
    assert all(status in (200, 429) for status, _, _ in results)
    assert all(error_code(body) == "insufficient_quota" for body in refused)
    upstream = [r for r in mock_upstream.requests if r.body and r.body["model"] == "echo-gap-0.01"]
    assert len(upstream) == len(admitted)
    words = USER[0]["content"].split()
    for stream in admitted:
        assert stream.usage is not None
        n = stream.usage["completion_tokens"]
        assert stream.finish_reason == ("stop" if n == len(words) else "length")
        assert stream.content.split() == words[:n]
    produced = sum(s.usage["total_tokens"] for s in admitted if s.usage)
    charged = int(await redis.get(space.spent(key_id, "all")) or 0)
    assert charged == produced <= 200
    # Refusals are recorded too (no tokens, counted as errors), so an operator sees them.
    assert totals["requests"] == 100 and totals["errors"] == len(refused)
    assert totals["prompt_tokens"] == sum(s.usage["prompt_tokens"] for s in admitted if s.usage)
    assert totals["completion_tokens"] == sum(
        s.usage["completion_tokens"] for s in admitted if s.usage
    )
    assert await redis.hget(space.held(key_id), "_sum") in (None, b"0")


async def test_rpm_and_tpm_hold_across_two_instances(
    mock_upstream: MockUpstream, redis_prefix: str, session: aiohttp.ClientSession
) -> None:
    async with live(mock_upstream, redis_prefix) as a, live(mock_upstream, redis_prefix) as b:

        async def rpm() -> None:
            key, _ = await create_key(session, a, rpm=3)
            for root, left in ((a, "2"), (b, "1"), (a, "0")):
                status, headers, _ = await chat(session, root, key)
                assert status == 200 and headers["x-ratelimit-limit-requests"] == "3"
                assert headers["x-ratelimit-remaining-requests"] == left
            before = time.time()
            status, headers, body = await chat(session, b, key)
            after = time.time()
            assert status == 429 and error_code(body) == "rate_limit_exceeded"
            expected = {math.ceil(60 - before % 60), math.ceil(60 - after % 60)}
            assert int(headers["Retry-After"]) in expected
            assert headers["x-ratelimit-remaining-requests"] == "0"

        async def tpm() -> None:
            key, _ = await create_key(session, a, tpm=40)
            # reserve 20, settle 11: the window holds 11, then 22; a third needs 22 + 20 > 40
            for root, left in ((a, "20"), (b, "9")):
                status, headers, _ = await chat(session, root, key)
                assert status == 200 and headers["x-ratelimit-remaining-tokens"] == left
            before = time.time()
            status, headers, body = await chat(session, a, key)
            after = time.time()
            assert status == 429 and error_code(body) == "rate_limit_exceeded"
            expected = {math.ceil(60 - before % 60), math.ceil(60 - after % 60)}
            assert int(headers["Retry-After"]) in expected

        await in_one_minute(rpm)
        await in_one_minute(tpm)


async def test_revoke_on_one_instance_is_refused_on_the_other_at_once(
    mock_upstream: MockUpstream, redis_prefix: str, session: aiohttp.ClientSession
) -> None:
    async with live(mock_upstream, redis_prefix) as a, live(mock_upstream, redis_prefix) as b:
        key, key_id = await create_key(session, a)
        assert (await chat(session, b, key))[0] == 200
        async with session.delete(f"{a}/admin/keys/{key_id}", headers=ADMIN_AUTH) as resp:
            assert resp.status == 200
        status, _, body = await chat(session, b, key)
        assert status == 401 and error_code(body) == "invalid_api_key"


async def test_concurrency_cap_and_slots_freed_by_a_client_that_disconnects(
    mock_upstream: MockUpstream,
    redis_prefix: str,
    session: aiohttp.ClientSession,
    redis: Redis,
) -> None:
    space = KeySpace(redis_prefix)
    async with live(mock_upstream, redis_prefix) as root:
        key, key_id = await create_key(session, root, max_concurrency=2, budget_tokens=1000)
        headers = {"Authorization": f"Bearer {key}"}
        body = {"model": "stall-model", "messages": USER, "stream": True, "max_tokens": 5}
        streams = []
        for _ in range(2):  # each stalls after one word until its client leaves
            resp = await session.post(f"{root}/v1/chat/completions", json=body, headers=headers)
            assert resp.status == 200
            while b'"content"' not in await resp.content.readline():
                pass
            streams.append(resp)
        status, reply_headers, reply = await chat(session, root, key)
        assert status == 429 and error_code(reply) == "concurrency_limit_exceeded"
        assert reply_headers["Retry-After"] == "1"

        streams[0].close()  # the client disconnects mid-stream

        async def one_slot() -> bool:
            return await redis.zcard(space.slots(key_id)) == 1

        await eventually(one_slot)
        assert (await chat(session, root, key))[0] == 200
        streams[1].close()

        async def no_slots() -> bool:
            return await redis.zcard(space.slots(key_id)) == 0

        await eventually(no_slots)
        await mock_upstream.wait_disconnect()

    entries = [fields for _, fields in await redis.xrange(space.usage_log())]
    dropped = [e for e in entries if e[b"error_code"] == b"client_disconnected"]
    assert len(dropped) == 2 and all(e[b"status"] == b"499" for e in dropped)
    assert all(e[b"completion_tokens"] == b"1" for e in dropped)  # the one word streamed
    # no upstream usage arrived: the estimated prompt (15) plus the word streamed is charged
    assert all(e[b"charged_tokens"] == b"16" for e in dropped)


async def test_key_rules_at_the_front_door(
    mock_upstream: MockUpstream, redis_prefix: str, session: aiohttp.ClientSession
) -> None:
    async with live(mock_upstream, redis_prefix) as root:
        key, _ = await create_key(session, root, models=["echo-model"])
        status, _, body = await chat(session, root, key, model="gap-model")
        assert status == 403 and error_code(body) == "model_not_allowed"
        for token in (ADMIN, "sk-" + "x" * 43, ""):  # the admin key is not a user key
            status, _, body = await chat(session, root, token)
            assert status == 401, body
        status, _, body = await chat(session, root, key, model="no-such-model")
        assert status in (403, 404)


async def test_admin_bad_input_through_the_app_changes_nothing(
    mock_upstream: MockUpstream,
    redis_prefix: str,
    session: aiohttp.ClientSession,
    redis: Redis,
) -> None:
    async with live(mock_upstream, redis_prefix) as root:
        _, key_id = await create_key(session, root, rpm=1)
        before = sorted([k async for k in redis.scan_iter(match=redis_prefix + "*")])
        record = await redis.hgetall(KeySpace(redis_prefix).key(key_id))
        for method, path, data, status, param in (
            ("POST", "/admin/keys", b"name=x", 400, None),
            ("POST", "/admin/keys", b'{"name": "x", "rpm": -3}', 400, "rpm"),
            ("PATCH", f"/admin/keys/{key_id}", b'{"rpm": 1, "extra": 2}', 400, "extra"),
            ("PATCH", f"/admin/keys/{key_id}", b'{"tpm": "many"}', 400, "tpm"),
            ("POST", "/admin/keys", b'{"name": "' + b"x" * 200_000 + b'"}', 413, None),
        ):
            async with session.request(
                method, f"{root}{path}", data=data, headers=ADMIN_AUTH
            ) as resp:
                assert resp.status == status
                assert (await resp.json())["error"]["param"] == param
        after = sorted([k async for k in redis.scan_iter(match=redis_prefix + "*")])
        assert after == before
        assert await redis.hgetall(KeySpace(redis_prefix).key(key_id)) == record


async def test_secrets_never_reach_the_logs(
    mock_upstream: MockUpstream,
    redis_prefix: str,
    session: aiohttp.ClientSession,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    logging_config = structlog.get_config()
    logs = io.StringIO()
    configure_logging(LoggingSettings(format="json", level="debug"), stream=logs)
    try:
        async with live(mock_upstream, redis_prefix) as root:
            key, key_id = await create_key(session, root)
            assert (await chat(session, root, key, stream=True))[0] == 200
            wrong = key[:-4] + "zzzz"
            status, _, body = await chat(session, root, wrong)
            assert status == 401 and wrong.encode() not in body
            async with session.post(
                f"{root}/admin/keys/{key_id}/rotate", headers=ADMIN_AUTH
            ) as resp:
                rotated = (await resp.json())["key"]
            assert (await chat(session, root, rotated))[0] == 200
            assert (await chat(session, root, key))[0] == 401
            assert (await chat(session, root, ADMIN))[0] == 401
            async with session.get(f"{root}/admin/keys", headers=ADMIN_AUTH) as resp:
                listing = await resp.text()
            async with session.delete(f"{root}/admin/keys/{key_id}", headers=ADMIN_AUTH):
                pass
    finally:
        structlog.configure(**logging_config)
    captured = capsys.readouterr()
    output = logs.getvalue() + caplog.text + captured.out + captured.err
    assert "api_key_created" in output and "api_key_rotated" in output and key_id in output
    for secret in (key, rotated, wrong, ADMIN):
        assert secret not in output and secret[3:] not in output
        assert secret not in listing


async def test_a_restart_loses_no_usage_and_no_keys(
    mock_upstream: MockUpstream, redis_prefix: str, session: aiohttp.ClientSession
) -> None:
    async with live(mock_upstream, redis_prefix) as first:
        key, key_id = await create_key(session, first, budget_tokens=1000)
        for _ in range(2):
            assert (await chat(session, first, key))[0] == 200
    async with live(mock_upstream, redis_prefix) as second:
        assert (await chat(session, second, key))[0] == 200
        report: dict[str, Any] = {}

        async def all_three() -> bool:
            async with session.get(
                f"{second}/admin/usage",
                params={"key_id": key_id, "group_by": "day"},
                headers=ADMIN_AUTH,
            ) as resp:
                report.update(await resp.json())
            return bool(report["totals"]["requests"] == 3)

        await eventually(all_three)
    assert report["totals"]["requests"] == 3
    assert report["totals"]["prompt_tokens"] == 3 * 6
    assert report["totals"]["completion_tokens"] == 3 * 5
    assert sum(row["requests"] for row in report["data"]) == 3  # grouped by UTC day


async def test_a_rotated_away_secret_is_refused_as_rotated(
    mock_upstream: MockUpstream, redis_prefix: str, session: aiohttp.ClientSession
) -> None:
    """Whether the gateway still holds the old secret's key in its authentication cache (the
    refusal then comes from admission) or not (from the lookup), the 401 says the key was
    rotated, not revoked; a revoked key's secret says revoked."""
    async with live(mock_upstream, redis_prefix) as root:
        used, used_id = await create_key(session, root)
        unused, unused_id = await create_key(session, root)
        assert (await chat(session, root, used))[0] == 200  # now in the cache
        for key_id in (used_id, unused_id):
            async with session.post(
                f"{root}/admin/keys/{key_id}/rotate", headers=ADMIN_AUTH
            ) as resp:
                assert resp.status == 200
        for old in (used, unused):
            status, _, body = await chat(session, root, old)
            error = json.loads(body)["error"]
            assert status == 401 and error["code"] == "invalid_api_key"
            assert "rotated" in error["message"] and "revoked" not in error["message"]
        async with session.delete(f"{root}/admin/keys/{unused_id}", headers=ADMIN_AUTH):
            pass
        fresh, fresh_id = await create_key(session, root)
        async with session.delete(f"{root}/admin/keys/{fresh_id}", headers=ADMIN_AUTH):
            pass
        status, _, body = await chat(session, root, fresh)
        assert status == 401 and "was revoked on " in json.loads(body)["error"]["message"]
