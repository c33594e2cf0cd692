"""Upstreams dying and clients leaving at each stage of a request, under a keyed gateway on a
Redis of each test's own: what was recorded (status, error, the `errors` counter), that
nothing is still held, and that the next request succeeds."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from gateway.keys.records import UsageQuery
from gateway.keys.usage import UsageReader
from testkit.gateway_app import PrivateRedis
from testkit.mock_upstream import MockUpstream
from tests.support.faults import (
    PREFIX,
    USER,
    Keyed,
    chat,
    keyed_gateway,
    nothing_held,
    records,
)


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as client:
        yield client


@pytest.fixture
async def gw(
    mock_upstream: MockUpstream, private_redis: PrivateRedis, tmp_path: Path
) -> AsyncIterator[Keyed]:
    async with keyed_gateway(
        mock_upstream, private_redis.url(), tmp_path, max_concurrency=2, budget_tokens=10_000
    ) as keyed:
        yield keyed


async def only_record(gw: Keyed) -> dict[str, str]:
    await gw.settled()
    (record,) = await records(gw.redis)
    return record


async def errors_counted(gw: Keyed) -> int:
    usage = await UsageReader(gw.redis, prefix=PREFIX).query(UsageQuery())
    return int(usage["totals"]["errors"])


async def next_requests_succeed(gw: Keyed, session: aiohttp.ClientSession) -> None:
    """The whole concurrency cap (2) is free again."""
    await nothing_held(gw.redis, gw.key_id)
    answers = await asyncio.gather(
        *(chat(session, gw.root, gw.key, "gap-model", stream=True) for _ in range(2))
    )
    assert [status for status, _ in answers] == [200, 200]


@pytest.mark.parametrize(
    "model",
    [
        "fail-model",  # refused before any header
        "die-early-model",  # died after its headers, before any token
    ],
)
async def test_upstream_dying_before_the_first_token_is_a_recorded_error(
    gw: Keyed, session: aiohttp.ClientSession, model: str
) -> None:
    for stream in (False, True):
        got, _ = await chat(session, gw.root, gw.key, model, stream=stream)
        assert got == 502
    await gw.settled()
    logged = await records(gw.redis)
    assert [r["status"] for r in logged] == ["502", "502"]
    assert all(r["error_code"] for r in logged)
    assert await errors_counted(gw) == 2
    await next_requests_succeed(gw, session)


@pytest.mark.parametrize(
    ("model", "code"),
    [
        ("die-model", "upstream_disconnected"),  # the connection dropped after 3 chunks
        ("error-model", "upstream_unavailable"),  # an error event after 2 chunks
        ("stall-impatient-model", "upstream_timeout"),  # silent past the idle timeout
    ],
)
async def test_a_stream_that_fails_mid_way_is_recorded_as_the_failure_it_was(
    gw: Keyed, session: aiohttp.ClientSession, model: str, code: str
) -> None:
    got, body = await chat(session, gw.root, gw.key, model, stream=True)
    assert got == 200 and b'"error"' in body  # the client saw the failure in the stream
    assert f'"code": "{code}"'.encode() in body or f'"code":"{code}"'.encode() in body
    record = await only_record(gw)
    # The 200 the client got, and the error its stream ended with.
    assert (record["status"], record["error_code"]) == ("200", code)
    assert int(record["completion_tokens"]) >= 1  # what was produced is charged
    assert await errors_counted(gw) == 1
    await next_requests_succeed(gw, session)


async def test_a_client_leaving_before_the_first_token_is_recorded_and_frees_its_slot(
    gw: Keyed, session: aiohttp.ClientSession, mock_upstream: MockUpstream
) -> None:
    with pytest.raises(TimeoutError):
        await chat(session, gw.root, gw.key, "hang-model", stream=True, within_s=0.5)
    await mock_upstream.wait_disconnect()  # the upstream call was cancelled too
    record = await only_record(gw)
    assert (record["status"], record["error_code"]) == ("499", "client_disconnected")
    await next_requests_succeed(gw, session)


async def test_a_client_leaving_mid_stream_is_recorded_and_frees_its_slot(
    gw: Keyed, session: aiohttp.ClientSession, mock_upstream: MockUpstream
) -> None:
    body = {"model": "stall-model", "messages": USER, "stream": True}
    async with session.post(
        f"{gw.root}/v1/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {gw.key}"},
    ) as resp:
        assert resp.status == 200
        await resp.content.readuntil(b"\n\n")  # one frame, then the client leaves
        resp.close()
    await mock_upstream.wait_disconnect()
    record = await only_record(gw)
    assert (record["status"], record["error_code"]) == ("499", "client_disconnected")
    await next_requests_succeed(gw, session)


async def test_a_client_leaving_during_a_stalled_admission_holds_nothing(
    gw: Keyed, session: aiohttp.ClientSession, private_redis: PrivateRedis
) -> None:
    assert (await chat(session, gw.root, gw.key))[0] == 200  # the key is cached
    private_redis.pause()
    with pytest.raises(TimeoutError):  # the client gives up before the gateway does
        await chat(session, gw.root, gw.key, within_s=0.2)
    await gw.settled()
    private_redis.resume()  # the admission runs now, or is answered as barred
    await nothing_held(gw.redis, gw.key_id)
    await next_requests_succeed(gw, session)
