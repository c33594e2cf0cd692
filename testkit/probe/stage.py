"""The stage a probe plays on, all on 127.0.0.1: a private redis-server, the mock and the broken
upstream (in the probe's own event loop), the "tiny" demo checkpoint, and `python -m gateway
serve` as a process of its own on a config written for it, with an admin key and a user key
with limits (so that its slots and reservations are tracked)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from redis.asyncio import Redis

from gateway.keys.records import KeyCreate
from gateway.keys.store import KeySpace, KeyStore, text
from testkit.broken_upstream import BrokenUpstream
from testkit.gateway_app import PrivateRedis, closed_port
from testkit.gateway_procs import wait_ready
from testkit.mock_upstream import MockUpstream
from testkit.scripted_model import build_tiny_checkpoint

ROOT = Path(__file__).resolve().parents[2]
PREFIX = "probe:"
ADMIN_KEY = "admin-probe"
# Short bounds, so that the slow-client checks take seconds.
SLOW_CLIENT_S = 1.5


@dataclass
class Stage:
    root: str  # http://127.0.0.1:PORT of the gateway
    key: str
    key_id: str
    redis: PrivateRedis
    client: Redis  # the probe's own client of the private Redis
    mock: MockUpstream
    broken: BrokenUpstream
    proc: subprocess.Popen[bytes]

    @property
    def port(self) -> int:
        return int(self.root.rsplit(":", 1)[1])

    async def held(self) -> tuple[int, int]:
        """(slots, reserved tokens) the user key holds now."""
        space = KeySpace(PREFIX)
        slots = await self.client.zcard(space.slots(self.key_id))
        tokens = int(await self.client.hget(space.held(self.key_id), "_sum") or 0)
        return slots, tokens

    async def statuses(self) -> list[str]:
        """The status of every usage record so far, oldest first."""
        entries = await self.client.xrange(KeySpace(PREFIX).usage_log())
        return [text(fields[b"status"]) for _, fields in entries]


def _config(work: Path, port: int, redis_url: str, mock: str, broken: str, model: Path) -> Path:
    config = work / "probe.toml"
    config.write_text(f"""
[usage]
enabled = false
[server]
host = "127.0.0.1"
port = {port}
max_body_bytes = 1048576
keepalive_s = 0.5
request_head_timeout_s = {SLOW_CLIENT_S}
request_body_timeout_s = {SLOW_CLIENT_S}
write_stall_timeout_s = {SLOW_CLIENT_S}
[redis]
url = "{redis_url}"
embedded = false
key_prefix = "{PREFIX}"
timeout_s = 2.0
[logging]
format = "json"
level = "warning"
[limits]
spool_dir = "{work / "spool"}"
[engine]
model_path = "{model}"
dtype = "float32"
block_size = 16
cache_memory_mb = 4
max_num_seqs = 16
max_batch_tokens = 1024
num_threads = 1
[routing.breaker]
failures = 1000000
window = 1000000
[providers.local]
kind = "local"
[providers.mock]
kind = "openai"
base_url = "{mock}"
direct_models = ["*"]
[providers.broken]
kind = "openai"
base_url = "{broken}"
direct_models = ["*"]
[providers.brokenstream]
kind = "openai"
base_url = "{broken}"
direct_models = ["*"]
stream_upstream = true
[models."deepseek-chat"]
routes = [{{ provider = "local", model = "deepseek-v3.1", thinking = false }}]
[models."deepseek-reasoner"]
routes = [{{ provider = "local", model = "deepseek-v3.1", thinking = true }}]
[models."echo"]
routes = [{{ provider = "mock", model = "echo" }}]
[models."tools"]
routes = [{{ provider = "mock", model = "tools-calls-2" }}]
[models."slow"]
routes = [{{ provider = "mock", model = "echo-chunks-60-gap-0.05" }}]
[model_patterns]
"claude-*" = "deepseek-chat"
""")
    return config


async def _ready(root: str, proc: subprocess.Popen[bytes], tries: int = 12) -> None:
    """Until the gateway answers /healthz and its engine is loaded, or it exits."""
    for _ in range(tries):
        if proc.poll() is not None:
            raise RuntimeError(f"the gateway exited with status {proc.returncode}")
        try:
            await wait_ready(root)
            return
        except RuntimeError:
            continue
    raise RuntimeError("the gateway did not become ready")


def _spawn(config: Path, log: IO[bytes]) -> subprocess.Popen[bytes]:
    env = {**os.environ, "GATEWAY_USE_PRESETS": "false", "GATEWAY_ADMIN__API_KEY": ADMIN_KEY}
    command = [sys.executable, "-m", "gateway", "serve", "--config", str(config)]
    return subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)


@asynccontextmanager
async def staged() -> AsyncIterator[Stage]:
    with tempfile.TemporaryDirectory(prefix="probe-") as tmp:
        work = Path(tmp)
        model = build_tiny_checkpoint(work / "tiny")
        redis = PrivateRedis(work)
        redis.start()
        mock, broken = MockUpstream(), BrokenUpstream()
        await mock.start()
        await broken.start()
        port = closed_port()
        config = _config(work, port, redis.url(), mock.base_url, broken.base_url, model)
        log = (work / "gateway.log").open("wb")
        proc = _spawn(config, log)
        client = Redis.from_url(redis.url())
        try:
            root = f"http://127.0.0.1:{port}"
            await _ready(root, proc)
            limits = KeyCreate(name="probe", max_concurrency=32, tpm=10**9)
            secret, record = await KeyStore(client, prefix=PREFIX).create(limits)
            yield Stage(root, secret, record.id, redis, client, mock, broken, proc)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            log.close()
            errors = [
                ln
                for ln in (work / "gateway.log").read_text().splitlines()
                if '"level": "error"' in ln
            ]
            for line in errors[-5:]:
                print("gateway log:", line[:400])
            await client.aclose()
            await broken.stop()
            await mock.stop()
            redis.stop()
