"""A keyed gateway with the usage store on: requests through the openai SDK land in the store
with their cost, the stream is trimmed once they are stored, and the admin API reports them
(summary, records, CSV export, a key's own view) and refuses bad queries with 400s."""

from __future__ import annotations

import asyncio
import csv
import io
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from redis.asyncio import Redis

from gateway.keys.records import KeyCreate
from gateway.keys.store import KeySpace, KeyStore
from testkit.gateway_app import REDIS_URL, gateway_settings, start_gateway
from testkit.mock_upstream import MockUpstream

ADMIN = "admin-usage-store"
AUTH = {"Authorization": f"Bearer {ADMIN}"}
PRICE = {"input": 2.0, "cached_input": 0.5, "output": 8.0}


class Served:
    def __init__(self, root: str, key: str, key_id: str) -> None:
        self.root, self.key, self.key_id = root, key, key_id

    async def get(self, path: str, **params: str) -> tuple[int, Any]:
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"{self.root}{path}", params=params, headers=AUTH) as resp,
        ):
            body = await resp.read()
            if resp.content_type == "application/json":
                return resp.status, await resp.json()
            return resp.status, body.decode()


@pytest.fixture
async def served(
    mock_upstream: MockUpstream, redis_prefix: str, tmp_path: Path
) -> AsyncIterator[Served]:
    settings = gateway_settings(
        mock_upstream,
        redis_prefix,
        admin={"api_key": ADMIN},
        usage={
            "enabled": True,
            "url": f"sqlite+aiosqlite:///{tmp_path / 'usage.db'}",
            "block_ms": 50,
            "currency": "EUR",
            "prices": {"echo-model": PRICE},
        },
    )
    runner, root = await start_gateway(settings)
    redis = Redis.from_url(REDIS_URL)
    secret, record = await KeyStore(redis, prefix=redis_prefix).create(KeyCreate(name="usage"))
    await redis.aclose()
    try:
        yield Served(root, secret, record.id)
    finally:
        await runner.cleanup()


async def stored(served: Served, n: int) -> list[dict[str, Any]]:
    """Wait (with a deadline) until the store holds `n` records; them, newest first."""
    deadline = time.monotonic() + 20
    while True:
        status, page = await served.get("/admin/usage/records", limit="100")
        assert status == 200
        if len(page["data"]) >= n:
            return list(page["data"])
        assert time.monotonic() < deadline, f"{len(page['data'])} of {n} records stored"
        await asyncio.sleep(0.05)


async def test_requests_are_stored_priced_and_reported(
    served: Served, redis_prefix: str, redis: Redis
) -> None:
    client = openai.AsyncOpenAI(base_url=f"{served.root}/v1", api_key=served.key, max_retries=0)
    for i in range(4):
        await client.chat.completions.create(
            model="echo-model", messages=[{"role": "user", "content": f"count to {i}"}]
        )
    await client.close()
    records = await stored(served, 4)
    assert [r["model"] for r in records] == ["echo-model"] * 4
    assert all("messages" not in r and "content" not in r for r in records)
    for r in records:
        uncached = r["prompt_tokens"] - r["cached_tokens"]
        expected = (uncached * 2.0 + r["cached_tokens"] * 0.5 + r["completion_tokens"] * 8.0) / 1e6
        assert r["cost"] == pytest.approx(expected) and r["cost"] > 0
        assert (r["route"], r["key_id"], r["status"]) == ("upstream", served.key_id, 200)

    status, summary = await served.get("/admin/usage/summary", group_by="key,model", interval="day")
    assert status == 200 and summary["currency"] == "EUR"
    [row] = summary["data"]
    assert (row["key"], row["model"], row["requests"]) == (served.key_id, "echo-model", 4)
    assert row["cost"] == pytest.approx(sum(r["cost"] for r in records), rel=1e-5)
    assert row["latency_ms"]["p95"] is not None
    assert (summary["has_more"], summary["next_cursor"]) == (False, None)

    status, first = await served.get("/admin/usage/summary", group_by="key,status", limit="1")
    assert status == 200 and len(first["data"]) == 1 and first["next_cursor"] is None
    status, after = await served.get(
        "/admin/usage/summary", group_by="key,model", interval="hour", limit="1"
    )
    assert status == 200 and len(after["data"]) == 1

    status, mine = await served.get(f"/admin/keys/{served.key_id}/usage", group_by="provider")
    assert status == 200 and [(r["provider"], r["requests"]) for r in mine["data"]] == [("mock", 4)]
    assert (await served.get("/admin/keys/nope/usage"))[0] == 404

    status, exported = await served.get("/admin/usage/export", key=served.key_id)
    assert status == 200
    lines = list(csv.DictReader(io.StringIO(exported)))
    assert sorted(line["record_id"] for line in lines) == sorted(r["id"] for r in records)

    stream = KeySpace(redis_prefix).usage_log()

    async def trimmed() -> bool:
        return await redis.xlen(stream) == 0

    deadline = time.monotonic() + 20
    while not await trimmed():  # stored, acked, then trimmed
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)


async def test_streams_that_broke_off_after_their_200_count_as_errors(served: Served) -> None:
    """An upstream dropping the connection mid-answer: a streamed request gets its 200, some
    chunks and an error event; one not streamed gets a 502. Both are errors in the reports."""
    body = {
        "model": "mock/die-midstream-after-2",
        "messages": [{"role": "user", "content": "a b c d"}],
    }
    headers = {"Authorization": f"Bearer {served.key}"}
    async with aiohttp.ClientSession() as session:
        for stream in (True, True, False):
            async with session.post(
                f"{served.root}/v1/chat/completions",
                json={**body, "stream": stream},
                headers=headers,
            ) as resp:
                text = await resp.text()
                assert resp.status == (200 if stream else 502)
                assert ("upstream_disconnected" if stream else "upstream_unavailable") in text
    await stored(served, 3)
    status, summary = await served.get("/admin/usage/summary", group_by="status,error_code")
    assert status == 200
    rows = [(r["status"], r["error_code"], r["requests"], r["errors"]) for r in summary["data"]]
    assert rows == [(200, "upstream_disconnected", 2, 2), (502, "upstream_unavailable", 1, 1)]


@pytest.mark.parametrize(
    ("path", "params", "param", "says"),
    [
        (
            "/admin/usage/summary",
            {"group_by": "key,colour"},
            "group_by",
            "Unknown dimension 'colour' in 'group_by' (allowed: key, model, provider, route, "
            "thinking, status, error_code",
        ),
        ("/admin/usage/summary", {"interval": "week"}, "interval", "hour, day or month"),
        (
            "/admin/usage/summary",
            {"start": "2026-02-01", "end": "2026-01-01"},
            "start",
            "'start' (2026-02-01T00:00:00+00:00) must be before 'end' (2026-01-01T00:00:00+00:00)",
        ),
        ("/admin/usage/summary", {"start": "yesterday"}, "start", "ISO 8601"),
        ("/admin/usage/summary", {"status": "x"}, "status", "from 0 to 999"),
        ("/admin/usage/summary", {"colour": "red"}, "colour", "Unknown parameter 'colour'"),
        ("/admin/usage/summary", {"limit": "0"}, "limit", "from 1 to 1000"),
        ("/admin/usage/summary", {"cursor": "nonsense"}, "cursor", "pass the next_cursor"),
        (
            "/admin/usage/summary",
            {"group_by": "key", "cursor": "WyJrZXkiLCJtIl0"},
            "cursor",
            "pass the next_cursor",
        ),
        ("/admin/usage/records", {"limit": "0"}, "limit", "from 1 to 1000"),
        (
            "/admin/usage/records",
            {"cursor": "nonsense"},
            "cursor",
            "pass the next_cursor you were given",
        ),
        ("/admin/usage/export", {"route": "sideways"}, "route", "'local', 'upstream'"),
        ("/admin/usage/records", {"key": "a\x00b"}, "key", "without NUL"),
        ("/admin/usage/export", {"start": "0001-01-01T00:00:00+01:00"}, "start", "ISO 8601"),
        ("/admin/usage", {"group_by": "week"}, "group_by", "one of 'day', 'model' or 'key'"),
    ],
)
async def test_bad_queries_are_400s(
    served: Served, path: str, params: dict[str, str], param: str, says: str
) -> None:
    """Each names its parameter (in `param` and the message) and says what it allows, in the
    API's words, not the validation library's."""
    status, body = await served.get(path, **params)
    assert status == 400, body
    error = body["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert f"'{param}'" in error["message"] and says in error["message"], error["message"]
    for library_words in ("None", "Value error", "String should", "Input should", "pattern"):
        assert library_words not in error["message"], error["message"]


async def test_without_the_store_the_reports_are_404(
    mock_upstream: MockUpstream, redis_prefix: str
) -> None:
    settings = gateway_settings(mock_upstream, redis_prefix, admin={"api_key": ADMIN})
    runner, root = await start_gateway(settings)
    try:
        status, body = await Served(root, "", "").get("/admin/usage/summary")
        assert status == 404 and body["error"]["code"] == "usage_store_disabled"
    finally:
        await runner.cleanup()
