"""benchmarks/stand_ins.py: the keyed gateway with parts of its path replaced still answers as
the real one does, and the replaced parts do not reach Redis."""

from __future__ import annotations

import signal
import subprocess
import sys

import aiohttp
from redis.asyncio import Redis

from benchmarks.gateway_procs import ROOT, high_limit_key, request_body, start_gateway, wait_ready
from tests.mock_upstream import MockUpstream


async def _ask(root: str, secret: str) -> tuple[int, dict[str, str], dict[str, object]]:
    headers = {"Authorization": f"Bearer {secret}"}
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"{root}/v1/chat/completions", json=request_body("bench", 3, False), headers=headers
        ) as resp,
    ):
        return resp.status, dict(resp.headers), await resp.json()


async def test_with_admission_and_settlement_replaced_it_answers_and_records_nothing(
    mock_upstream: MockUpstream, redis: Redis, redis_prefix: str
) -> None:
    secret = await high_limit_key(redis, redis_prefix)
    proc, root = start_gateway(
        mock_upstream.base_url,
        mock_upstream.base_url,
        3,
        True,
        redis_prefix,
        stand_ins="admit,settle",
    )
    try:
        await wait_ready(root)
        status, headers, body = await _ask(root, secret)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    assert status == 200
    assert body["choices"][0]["message"]["content"]  # type: ignore[index]
    assert headers["x-ratelimit-limit-requests"] == str(10**8)  # as a real admission says
    # Only the key itself is in Redis: no admission (slots, rpm and tpm windows) and no
    # settlement (usage counters and log) reached it.
    names = {k.decode() async for k in redis.scan_iter(match=f"{redis_prefix}*", count=1000)}
    kinds = {name.removeprefix(redis_prefix).split(":")[0] for name in names}
    assert kinds == {"key", "key-digest", "keys"}, names


def test_an_unknown_part_is_refused() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.stand_ins", "admit,nothing", "serve"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "unknown parts ['nothing']" in done.stderr
