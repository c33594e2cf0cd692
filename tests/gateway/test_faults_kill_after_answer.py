"""An answer a client received in full is billed, even when the gateway is killed (SIGKILL) the
instant its last byte arrives: settlement reaches Redis, or the spool on disk while Redis does
not answer, before the answer's last bytes are written. Each test on a redis-server of its own;
the gateway in a process of its own."""

from __future__ import annotations

import asyncio
import json
import signal
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest
from redis.asyncio import Redis

from testkit.fault_drills import USER, GatewayProcess, RedisProcess, create_key
from testkit.gateway_app import PrivateRedis
from testkit.mock_upstream import MockUpstream
from tests.support.faults import records

ROUNDS = 3  # kills, each right after one client's answer arrived whole
CLIENTS = 4  # two streaming, two JSON, back to back


@pytest.fixture
async def redis(private_redis: PrivateRedis) -> AsyncIterator[Redis]:
    client = Redis.from_url(private_redis.url())
    yield client
    await client.aclose()


@dataclass
class Answers:
    """The request ids of the answers clients read whole (a stream through `[DONE]` and its
    end, a JSON body that parses), and whether the gateway has been killed yet."""

    complete: list[str] = field(default_factory=list)
    killed: asyncio.Event = field(default_factory=asyncio.Event)


async def read_whole(resp: aiohttp.ClientResponse, stream: bool) -> bool:
    body = await resp.read()
    if resp.status != 200:
        return False
    if stream:
        return body.rstrip().endswith(b"data: [DONE]")
    return bool(json.loads(body)["choices"])


async def client(
    gateway: GatewayProcess, key: str, stream: bool, answers: Answers, *, kill: bool
) -> None:
    """Requests back to back until the gateway is killed; with `kill`, the client kills it
    (SIGKILL) right after reading its first whole answer, before anything else runs."""
    body = {"model": "drill", "messages": USER, "stream": stream, "max_tokens": 50}
    headers = {"Authorization": f"Bearer {key}"}
    async with aiohttp.ClientSession() as session:
        while not answers.killed.is_set():
            try:
                async with session.post(
                    f"{gateway.root}/v1/chat/completions",
                    json=body,
                    headers=headers,
                    timeout=aiohttp.ClientTimeout(total=30),
                ) as resp:
                    whole = await read_whole(resp, stream)
                    if whole and kill and not answers.killed.is_set():
                        assert gateway.proc is not None
                        gateway.proc.send_signal(signal.SIGKILL)  # at once: no await before
                        answers.killed.set()
                    if whole:
                        answers.complete.append(resp.headers["x-request-id"])
            except (aiohttp.ClientError, TimeoutError):
                return  # the gateway is gone


async def test_answers_read_whole_are_recorded_once_through_kill_9_after_their_last_byte(
    mock_upstream: MockUpstream, private_redis: PrivateRedis, redis: Redis, tmp_path: Path
) -> None:
    gateway = GatewayProcess(tmp_path, private_redis.url(), mock_upstream.base_url, "echo-chunks-8")
    key, _ = await create_key(redis, budget_tokens=10**7)
    complete: list[str] = []
    for round_ in range(ROUNDS):
        await gateway.start()
        answers = Answers()
        killer = round_ % 2 == 0  # the killing client streams in one round, reads JSON next
        tasks = [
            client(gateway, key, stream=i % 2 == 0, answers=answers, kill=(i % 2 == 0) == killer)
            for i in range(CLIENTS)
        ]
        await asyncio.wait_for(asyncio.gather(*tasks), 60)
        assert answers.killed.is_set()
        await gateway.stop(signal.SIGKILL)  # reaped
        complete += answers.complete
    recorded = Counter(r["request_id"] for r in await records(redis))
    assert complete and len(set(complete)) == len(complete)
    assert {rid: recorded[rid] for rid in complete} == dict.fromkeys(complete, 1)
    assert all(n == 1 for n in recorded.values())  # nothing recorded twice either


async def test_an_answer_read_whole_while_redis_is_stopped_is_spooled_before_its_last_byte(
    mock_upstream: MockUpstream, tmp_path: Path
) -> None:
    server = RedisProcess(tmp_path)
    await server.start()
    redis = Redis.from_url(server.url)
    model = "echo-chunks-6-gap-0.2"
    gateway = GatewayProcess(tmp_path, server.url, mock_upstream.base_url, model, timeout_s=0.5)
    try:
        key, _ = await create_key(redis, budget_tokens=10**6)
        await gateway.start()
        body = {"model": "drill", "messages": USER, "stream": True, "max_tokens": 50}
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                f"{gateway.root}/v1/chat/completions",
                json=body,
                headers={"Authorization": f"Bearer {key}"},
                timeout=aiohttp.ClientTimeout(total=30),
            ) as resp,
        ):
            assert resp.status == 200
            await resp.content.readuntil(b"\n\n")  # admitted and streaming
            server.send(signal.SIGSTOP)  # Redis takes nothing from here on
            whole = await resp.read()
            assert gateway.proc is not None
            gateway.proc.send_signal(signal.SIGKILL)  # right after the last byte
            request_id = resp.headers["x-request-id"]
        assert whole.rstrip().endswith(b"data: [DONE]")
        await gateway.stop(signal.SIGKILL)
        server.send(signal.SIGCONT)
        await gateway.start()  # adopts the dead process's spool and replays it
        deadline = asyncio.get_running_loop().time() + 30
        while request_id not in [r["request_id"] for r in await records(redis)]:
            assert asyncio.get_running_loop().time() < deadline, "the answer was never recorded"
            await asyncio.sleep(0.05)
        await gateway.stop(signal.SIGTERM)
        ids = [r["request_id"] for r in await records(redis)]
        assert ids.count(request_id) == 1
    finally:
        if gateway.proc is not None:
            await gateway.stop(signal.SIGKILL)
        await redis.aclose()
        server.stop()
