"""`[server] workers = N`: N serving processes on one port, stopped together."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import aiohttp
import pytest
from pydantic import SecretStr, ValidationError

from gateway.config.process import RedisSettings
from gateway.config.settings import Settings
from gateway.server.workers import worker_settings
from testkit.gateway_app import closed_port
from testkit.mock_upstream import MockUpstream
from tests.support.processes import process_alive
from tests.support.sse_rules import check_chat_stream

ROOT = Path(__file__).parents[3]


def _workers(pid: int) -> set[int]:
    """The worker processes of the supervisor `pid` (not multiprocessing's resource tracker)."""
    text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    children = {int(child) for child in text.split()}
    return {c for c in children if b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes()}


async def _workers_seen(root: str, want: int) -> set[int]:
    """Worker indexes that answered /healthz, each on a fresh connection (the kernel spreads
    connections over the workers), until `want` of them did (readiness deadline: 60 s; a
    worker may still be starting while the other answers)."""
    seen: set[int] = set()
    deadline = asyncio.get_running_loop().time() + 60
    while asyncio.get_running_loop().time() < deadline:
        try:
            async with (
                aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as s,
                s.get(f"{root}/healthz") as resp,
            ):
                if resp.status == 200:
                    seen.add((await resp.json())["worker"])
        except aiohttp.ClientError:
            await asyncio.sleep(0.05)  # not every worker listens yet
        if len(seen) == want:
            break
    return seen


async def test_two_workers_serve_one_port_and_stop_together(
    tmp_path: Path, mock_upstream: MockUpstream
) -> None:
    port = closed_port()
    config = tmp_path / "settings.toml"
    config.write_text(
        f"""
[server]
port = {port}
workers = 2
grace_period_s = 10
[redis]
embedded = false
key_prefix = "test:workers:"
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
    env = {**os.environ, "GATEWAY_USE_PRESETS": "false"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gateway",
        "serve",
        "--config",
        str(config),
        cwd=ROOT,
        env=env,
        stderr=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
    )
    root = f"http://127.0.0.1:{port}"
    try:
        assert await _workers_seen(root, 2) == {0, 1}
        workers = _workers(proc.pid)
        assert len(workers) == 2
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
            # The worker serving the stream finished it within its grace period.
            stream = check_chat_stream(first + rest, include_usage=False)
            assert len(stream.content.split()) == 6 and stream.finish_reason == "stop"
        assert await asyncio.wait_for(proc.wait(), timeout=30) == 0
        assert not any(process_alive(pid) for pid in workers)
        async with aiohttp.ClientSession() as session:
            with pytest.raises(aiohttp.ClientConnectionError):
                async with session.get(f"{root}/healthz"):
                    pass
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def test_workers_share_one_local_engine_and_no_cluster() -> None:
    local = {"local": {"kind": "local"}}
    settings = Settings(server={"workers": 2}, providers=local, use_presets=False)
    assert settings.shares_engine
    assert not Settings(server={"workers": 1}, providers=local, use_presets=False).shares_engine
    with pytest.raises(ValidationError, match="would each load the model"):
        Settings(
            server={"workers": 2},
            providers={**local, "other": {"kind": "local"}},
            use_presets=False,
        )
    with pytest.raises(ValidationError, match="cluster.enabled is not supported"):
        Settings(
            server={"workers": 2},
            cluster={"enabled": True, "secret": "s" * 16},
            providers=local,
            use_presets=False,
        )


def test_the_supervisor_names_the_engine_socket_and_draws_its_secret(tmp_path: Path) -> None:
    redis = RedisSettings(url="unix:///tmp/redis.sock", embedded=False)
    settings = Settings(
        server={"workers": 2, "port": 9123, "run_dir": tmp_path / "run"},
        messages={"signing_secret": "fixed"},
        providers={"local": {"kind": "local"}},
        use_presets=False,
    )
    first, second = worker_settings(settings, redis), worker_settings(settings, redis)
    assert first.cluster.internal_socket == (tmp_path / "run" / "engine-9123.sock").absolute()
    assert first.cluster.secret is not None and second.cluster.secret is not None
    assert len(first.cluster.secret.get_secret_value()) == 64
    assert first.cluster.secret != second.cluster.secret  # drawn per start, not a constant
    chosen = settings.model_copy(
        update={
            "cluster": settings.cluster.model_copy(
                update={
                    "secret": SecretStr("operator-chosen-1"),
                    "internal_socket": Path("e.sock"),
                }
            )
        }
    )
    kept = worker_settings(chosen, redis).cluster
    assert kept.secret == SecretStr("operator-chosen-1")
    assert kept.internal_socket == Path("e.sock").absolute()
    upstreams = Settings(server={"workers": 2}, use_presets=False)
    assert worker_settings(upstreams, redis).cluster.internal_socket is None


def test_an_engine_socket_path_too_long_is_refused_clearly(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="longer than a unix socket allows"):
        Settings(
            server={"workers": 2, "run_dir": tmp_path / ("d" * 120)},
            providers={"local": {"kind": "local"}},
            use_presets=False,
        )
