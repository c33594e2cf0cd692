"""Redis paused (SIGSTOP) or killed while streams run on every protocol, and half of their
clients leave mid-stream during the outage: once Redis is back every request has its one usage
record (200 for the finished, 499 for the departed), nothing is held, and the key serves again.
(tests/gateway/test_faults_redis.py covers the chat-only, all-finish cases.)"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from testkit.gateway_app import PrivateRedis
from testkit.mock_upstream import MockUpstream
from testkit.rawhttp import parse_answer, request_bytes
from tests.support.faults import Keyed, eventually, held, keyed_gateway, nothing_held, records

ASK = "alpha beta gamma delta"
BODIES: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {"messages": [{"role": "user", "content": ASK}]},
    "/v1/completions": {"prompt": ASK},
    "/v1/responses": {"input": ASK},
    "/v1/messages": {"messages": [{"role": "user", "content": ASK}], "max_tokens": 50},
}


async def stream(gw: Keyed, path: str, leave: asyncio.Event | None) -> int:
    """One streamed request on a raw connection: read to the end (the status), or, when `leave`
    is given, until the first event and then until `leave` is set, and reset the connection."""
    raw = json.dumps({**BODIES[path], "model": "long-model", "stream": True}).encode()
    headers = {"Authorization": f"Bearer {gw.key}", "Content-Type": "application/json"}
    headers["Content-Length"] = str(len(raw))
    reader, writer = await asyncio.open_connection("127.0.0.1", int(gw.root.rsplit(":", 1)[1]))
    seen = b""
    try:
        writer.write(request_bytes("POST", path, headers, raw))
        async with asyncio.timeout(30):
            if leave is None:
                return parse_answer(await reader.read()).status
            while b"data:" not in seen:
                seen += await reader.read(4096)
            await leave.wait()
            return 499
    finally:
        writer.transport.abort()


@pytest.mark.parametrize("fault", ["paused", "killed"])
async def test_clients_leaving_during_a_redis_outage_are_recorded_once_it_is_back(
    mock_upstream: MockUpstream, private_redis: PrivateRedis, tmp_path: Path, fault: str
) -> None:
    async with keyed_gateway(
        mock_upstream, private_redis.url(), tmp_path, max_concurrency=8, budget_tokens=100_000
    ) as gw:
        outage = asyncio.Event()
        calls = [
            asyncio.ensure_future(stream(gw, path, leave))
            for path in BODIES
            for leave in (None, outage)
        ]

        async def all_admitted() -> bool:
            return (await held(gw.redis, gw.key_id))[0] == len(calls)

        await eventually(all_admitted)
        if fault == "paused":
            private_redis.pause()
        else:
            private_redis.stop()
        outage.set()  # half the clients leave now, the others finish during the outage
        statuses = await asyncio.gather(*calls)
        assert sorted(statuses) == [200] * 4 + [499] * 4
        await gw.settled()
        if fault == "paused":
            private_redis.resume()
        else:
            private_redis.start()
            await gw.redis.connection_pool.disconnect()

        async def replayed() -> bool:
            return gw.access.keeper.pending == 0

        await eventually(replayed, within_s=20)
        logged = await records(gw.redis)
        assert sorted(r["status"] for r in logged) == ["200"] * 4 + ["499"] * 4
        await nothing_held(gw.redis, gw.key_id)
        assert await stream(gw, "/v1/messages", None) == 200
