"""benchmarks/stand_ins.py: the keyed gateway with parts of its path replaced still answers as
the real one does, and the replaced parts do not reach Redis."""

from __future__ import annotations

import signal
import subprocess
import sys

import aiohttp
import pytest
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


@pytest.mark.parametrize(("parts", "admitted"), [("admit,settle", False), ("send", True)])
async def test_with_parts_replaced_it_answers_and_the_parts_do_not_reach_redis(
    mock_upstream: MockUpstream, redis: Redis, redis_prefix: str, parts: str, admitted: bool
) -> None:
    secret = await high_limit_key(redis, redis_prefix)
    proc, root = start_gateway(
        mock_upstream.base_url,
        mock_upstream.base_url,
        3,
        True,
        redis_prefix,
        stand_ins=parts,
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
    names = {k.decode() async for k in redis.scan_iter(match=f"{redis_prefix}*", count=1000)}
    kinds = {name.removeprefix(redis_prefix).split(":")[0] for name in names}
    assert not kinds & {"usage", "usage-days", "usage-log"}, names  # no settlement was sent
    assert ("slots" in kinds) == admitted, names  # the admission reached Redis where it is real


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
