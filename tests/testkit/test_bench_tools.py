"""The gateway benchmark's native tools: nginx answers what the Python mock would, and a wrk
burst reports its requests and fails on answers that are not 2xx. Skipped where the tools are
not installed (`apt-get install -y wrk nginx-light`)."""

from __future__ import annotations

import asyncio
import json
import os
import socket
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from testkit import wrk_load
from testkit.gateway_procs import Nginx, mock_answer, request_body
from testkit.http_load import cpu_jiffies, io_calls, stolen_share
from testkit.mock_upstream import MockUpstream

needs_nginx = pytest.mark.skipif(not Nginx.available(), reason="nginx is not installed")
needs_wrk = pytest.mark.skipif(not wrk_load.available(), reason="wrk is not installed")


def _comparable(answer: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in answer.items() if k not in ("id", "created")}


@pytest.fixture
def nginx() -> Iterator[Nginx]:
    server = Nginx(mock_answer(20))
    server.start()
    yield server
    server.stop()


async def _post(url: str, body: dict[str, Any]) -> tuple[int, str, dict[str, Any]]:
    async with aiohttp.ClientSession() as session:
        for _ in range(100):  # nginx binds its port a moment after it starts
            try:
                async with session.post(url, json=body) as resp:
                    return resp.status, resp.content_type, await resp.json()
            except aiohttp.ClientConnectionError:
                await asyncio.sleep(0.05)
    raise AssertionError(f"{url} did not answer")


@needs_nginx
async def test_nginx_answers_the_benchmark_request_as_the_python_mock_does(
    nginx: Nginx, mock_upstream: MockUpstream
) -> None:
    body = request_body("echo-chunks-20", 20, False)
    status, kind, fixed = await _post(f"{nginx.base_url}/chat/completions", body)
    _, _, live = await _post(f"{mock_upstream.base_url}/chat/completions", body)
    assert (status, kind) == (200, "application/json")
    assert _comparable(fixed) == _comparable(live)
    assert fixed["usage"]["completion_tokens"] == 20


@needs_nginx
@needs_wrk
async def test_a_wrk_burst_counts_its_requests_and_refuses_failed_answers(nginx: Nginx) -> None:
    await _post(f"{nginx.base_url}/chat/completions", {})  # up
    lua = wrk_load.script(json.dumps(request_body("m", 20, False)).encode(), {"X-Test": "1"})
    try:
        result = await asyncio.to_thread(
            wrk_load.run, f"{nginx.base_url}/chat/completions", lua, 2, 1.0
        )
        assert result.requests > 0 and result.p50_ms <= result.p99_ms and result.cpu_s > 0
        with pytest.raises(RuntimeError, match="failures"):
            await asyncio.to_thread(wrk_load.run, f"{nginx.base_url}/missing", lua, 1, 1.0)
    finally:
        lua.unlink()


def test_the_stolen_share_is_read_off_the_machines_cpu_times() -> None:
    stolen, total = cpu_jiffies()
    assert 0 <= stolen <= total
    assert stolen_share((10, 1000), (30, 1100)) == pytest.approx(0.2)
    assert stolen_share((10, 1000), (10, 1000)) == 0.0  # no time passed


def test_io_calls_count_a_processs_socket_writes_and_reads() -> None:
    """The counts `gateway_overhead.py` prints per request: one write(2) on a socket is one
    write, one read(2) one read (as libuv, under uvloop, writes and reads); a process that is
    gone counts nothing."""
    left, right = socket.socketpair()
    with left, right:
        reads0, writes0 = io_calls([os.getpid()])
        for _ in range(5):
            os.write(left.fileno(), b"x")
            os.read(right.fileno(), 1)
        reads1, writes1 = io_calls([os.getpid()])
    assert writes1 - writes0 >= 5 and reads1 - reads0 >= 5
    assert io_calls([2**22 + 1]) == (0, 0)
