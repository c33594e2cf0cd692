"""The processes a gateway benchmark runs: a mock upstream, `python -m gateway serve` on a
config written for it, and a key with limits set high; started on 127.0.0.1 and awaited with a
readiness deadline."""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import aiohttp
from redis.asyncio import Redis

from gateway.keys.records import KeyCreate
from gateway.keys.store import KeyStore
from tests.mock_upstream import MockUpstream

ROOT = Path(__file__).resolve().parents[1]
REDIS_URL = "redis://127.0.0.1:6379/0"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_mock(port_queue: mp.Queue) -> None:  # type: ignore[type-arg]
    async def main() -> None:
        mock = MockUpstream()
        await mock.start()
        mock.requests = _Discard()  # type: ignore[assignment]
        port_queue.put(mock.base_url)
        await asyncio.Event().wait()

    asyncio.run(main())


class _Discard(list):  # type: ignore[type-arg]
    """Keeps the mock from recording a million requests during a benchmark."""

    def append(self, item: object) -> None:
        return None


def start_gateway(
    mock_url: str, chunks: int, keyed: bool, prefix: str, workers: int = 1
) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    config = Path(tempfile.mkdtemp()) / "bench.toml"
    config.write_text(f"""
[server]
host = "127.0.0.1"
port = {port}
workers = {workers}
[redis]
url = "{REDIS_URL}"
embedded = false
key_prefix = "{prefix}"
[logging]
format = "json"
level = "warning"
[auth]
enabled = {"true" if keyed else "false"}
[providers.mock]
kind = "openai"
base_url = "{mock_url}"
[models."bench"]
routes = [{{ provider = "mock", model = "echo-chunks-{chunks}" }}]
""")
    env = {**os.environ, "GATEWAY_USE_PRESETS": "false"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway", "serve", "--config", str(config)], cwd=ROOT, env=env
    )
    return proc, f"http://127.0.0.1:{port}"


async def wait_ready(root: str) -> None:
    async with aiohttp.ClientSession() as session:
        for _ in range(200):
            try:
                async with session.get(f"{root}/healthz") as resp:
                    if resp.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.05)
    raise RuntimeError("the gateway did not start")


async def high_limit_key(redis: Redis, prefix: str) -> str:
    secret, _ = await KeyStore(redis, prefix=prefix).create(
        KeyCreate(name="bench", budget_tokens=10**12, rpm=10**8, tpm=10**11, max_concurrency=10**5)
    )
    return secret


async def drop_prefix(redis: Redis, prefix: str) -> None:
    keys = [k async for k in redis.scan_iter(match=f"{prefix}*", count=1000)]
    if keys:
        await redis.delete(*keys)
