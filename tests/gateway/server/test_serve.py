"""`python -m gateway serve` as an operator runs it: flags, readiness, graceful shutdown."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import aiohttp

from testkit.gateway_app import closed_port
from testkit.mock_upstream import MockUpstream
from tests.support.sse_rules import check_chat_stream

ROOT = Path(__file__).parents[3]


async def _wait_healthy(root: str) -> None:
    async with aiohttp.ClientSession() as session:
        for _ in range(300):
            try:
                async with session.get(f"{root}/healthz") as resp:
                    if resp.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.05)
    raise AssertionError("the gateway did not become healthy")


async def test_sigterm_lets_running_streams_finish(
    tmp_path: Path, mock_upstream: MockUpstream
) -> None:
    config = tmp_path / "settings.toml"
    config.write_text(
        f"""
[server]
port = 1
grace_period_s = 10
[redis]
embedded = false
key_prefix = "test:serve:"
[auth]
enabled = false
[logging]
format = "json"
[providers.mock]
kind = "openai"
base_url = "{mock_upstream.base_url}"
direct_models = ["*"]
"""
    )
    port = closed_port()  # the --port flag beats the file
    env = {**os.environ, "GATEWAY_USE_PRESETS": "false"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gateway",
        "serve",
        "--config",
        str(config),
        "--port",
        str(port),
        cwd=ROOT,
        env=env,
        stderr=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
    )
    root = f"http://127.0.0.1:{port}"
    try:
        await _wait_healthy(root)
        body = {
            "model": "mock/echo-chunks-6-gap-0.3",
            "messages": [{"role": "user", "content": "one two three"}],
            "stream": True,
        }
        async with aiohttp.ClientSession() as session:
            async with session.post(f"{root}/v1/chat/completions", json=body) as resp:
                first = await resp.content.readuntil(b"\n\n")
                proc.send_signal(signal.SIGTERM)
                rest = await resp.read()
            stream = check_chat_stream(first + rest, include_usage=False)
            assert len(stream.content.split()) == 6 and stream.finish_reason == "stop"
            assert await asyncio.wait_for(proc.wait(), timeout=15) == 0
            try:
                async with session.get(f"{root}/healthz") as late:
                    raise AssertionError(f"still serving after shutdown: {late.status}")
            except aiohttp.ClientConnectionError:
                pass
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
