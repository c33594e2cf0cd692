"""The embedded redis-server: started when the configured Redis is unreachable, one per data
directory. A second process (the `keys` command beside a running gateway) uses the running
server instead of starting its own, which would take the socket of the first."""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest

from gateway.config.process import RedisSettings
from gateway.server.redis_server import RedisNotReady, open_redis
from testkit.gateway_app import closed_port

ROOT = Path(__file__).resolve().parents[3]


def embedded(data_dir: Path, **kw: float) -> RedisSettings:
    url = f"redis://127.0.0.1:{closed_port()}/0"
    return RedisSettings(url=url, embedded=True, data_dir=data_dir, **kw)


async def test_embedded_redis_starts_persists_and_stops(tmp_path: Path) -> None:
    settings = embedded(tmp_path / "redis")
    async with open_redis(settings) as redis:
        await redis.set("gw:test", "kept")
    assert (tmp_path / "redis" / "appendonlydir").is_dir()
    async with open_redis(settings) as redis:  # a restart loses nothing
        assert await redis.get("gw:test") == b"kept"


async def test_unreachable_redis_without_embedded_fails_clearly(tmp_path: Path) -> None:
    settings = RedisSettings(url=f"redis://127.0.0.1:{closed_port()}/0", embedded=False)
    with pytest.raises(RuntimeError, match="unreachable"):
        async with open_redis(settings):
            pass


async def test_a_second_user_of_a_data_directory_shares_its_running_server(
    tmp_path: Path,
) -> None:
    settings = embedded(tmp_path / "redis")
    sock = tmp_path / "redis" / "redis.sock"
    async with open_redis(settings) as first:
        await first.set("gw:first", "1")
        inode = sock.stat().st_ino
        async with open_redis(settings) as second:
            assert await second.get("gw:first") == b"1"
            await second.set("gw:second", "2")
        # the first server is still the one, on its own socket
        assert sock.stat().st_ino == inode
        assert await first.get("gw:second") == b"2"


async def test_a_locked_data_directory_never_gets_a_second_server(tmp_path: Path) -> None:
    """Whoever holds the directory's lock owns its server: while it is not answering, another
    process waits for it, then says who holds the directory, and starts nothing."""
    data_dir = tmp_path / "redis"
    data_dir.mkdir()
    fd = os.open(data_dir / "redis.lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.write(fd, b"4242\n")
        with pytest.raises(RedisNotReady, match="belongs to process 4242"):
            async with open_redis(embedded(data_dir, start_timeout_s=0.5)):
                pass
        assert not (data_dir / "redis.sock").exists()
    finally:
        os.close(fd)


def _write_config(path: Path, data_dir: Path) -> Path:
    path.write_text(
        "[redis]\n"
        f'url = "redis://127.0.0.1:{closed_port()}/0"\n'
        "embedded = true\n"
        f'data_dir = "{data_dir}"\n'
        "[auth]\nenabled = true\n"
        "[usage]\nenabled = false\n"
        '[logging]\nformat = "json"\nlevel = "warning"\n'
        '[providers.up]\nkind = "openai"\n'
        f'base_url = "http://127.0.0.1:{closed_port()}/v1"\n'
        '[models."m"]\nroutes = [{ provider = "up", model = "m" }]\n'
    )
    return path


async def test_the_keys_command_uses_the_running_gateways_embedded_redis(
    tmp_path: Path,
) -> None:
    """A first start without a system Redis: the gateway runs the embedded server; `keys
    create` beside it writes to that server, and the running gateway accepts the new key."""
    config = _write_config(tmp_path / "settings.toml", tmp_path / "redis")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GATEWAY_USE_PRESETS": "false"}
    port = closed_port()
    root = f"http://127.0.0.1:{port}"
    gateway = _start_gateway(config, port, env, tmp_path)
    try:
        async with aiohttp.ClientSession() as session:
            deadline = time.monotonic() + 60
            while True:
                assert gateway.poll() is None, (tmp_path / "gateway.log").read_text()
                try:
                    async with session.get(root + "/healthz") as resp:
                        if resp.status == 200:
                            break
                except aiohttp.ClientError:
                    pass
                assert time.monotonic() < deadline, "the gateway never answered /healthz"
                await asyncio.sleep(0.05)
            cli = await asyncio.create_subprocess_exec(
                *[sys.executable, "-m", "gateway", "--config", str(config)],
                *["keys", "create", "--name", "first"],
                env=env,
                cwd=tmp_path,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            out, err = await asyncio.wait_for(cli.communicate(), timeout=60)
            assert cli.returncode == 0, err.decode()
            key = json.loads(out)["key"]
            headers = {"Authorization": f"Bearer {key}"}
            async with session.get(root + "/v1/models", headers=headers) as resp:
                assert resp.status == 200, await resp.text()
            async with session.get(root + "/v1/models", headers={"Authorization": "Bearer x"}) as r:
                assert r.status == 401
    finally:
        gateway.terminate()
        try:
            gateway.wait(timeout=30)
        except subprocess.TimeoutExpired:
            gateway.kill()
            gateway.wait()


def _start_gateway(
    config: Path, port: int, env: dict[str, str], workdir: Path
) -> subprocess.Popen[bytes]:
    with (workdir / "gateway.log").open("wb") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "gateway", "serve", "--config", str(config)]
            + ["--host", "127.0.0.1", "--port", str(port)],
            env=env,
            cwd=workdir,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
