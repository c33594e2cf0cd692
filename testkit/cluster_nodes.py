"""Cluster nodes as real processes (`python -m gateway serve`) on 127.0.0.1, sharing one Redis
under one key prefix; used by the cluster end-to-end tests and benchmarks/cluster_routing.py."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from gateway.cluster.internal import STATUS_PATH
from providers.local.remote_engine import SECRET_HEADER

SECRET = "cluster-test-secret-0123456789"
ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return json.dumps(str(value))


def write_config(path: Path, sections: dict[str, dict[str, Any]]) -> Path:
    lines: list[str] = []
    for name, values in sections.items():
        lines.append(f"[{name}]")
        lines += [f"{k} = {_toml_value(v)}" for k, v in values.items()]
        lines.append("")
    path.write_text("\n".join(lines))
    return path


def node_sections(
    prefix: str,
    redis_url: str,
    model_path: Path,
    *,
    routing: str = "prefix",
    auth: bool = True,
    engine: dict[str, Any] | None = None,
    cluster: dict[str, Any] | None = None,
    server: dict[str, Any] | None = None,
    log_level: str = "warning",
) -> dict[str, dict[str, Any]]:
    return {
        "server": {**(server or {})},
        "redis": {"url": redis_url, "embedded": False, "key_prefix": prefix},
        "logging": {"format": "json", "level": log_level},
        "auth": {"enabled": auth},
        "usage": {"enabled": False},
        "engine": {
            "model_path": str(model_path),
            "dtype": "float32",
            "block_size": 16,
            "cache_memory_mb": 4,
            "max_num_seqs": 16,
            "max_batch_tokens": 1024,
            "num_threads": 1,
            **(engine or {}),
        },
        "cluster": {
            "enabled": True,
            "routing": routing,
            # A liveness key outlives several missed heartbeats: on a loaded 2-core machine a
            # node's loop can stall for a second, and a node that flaps out of its peers'
            # indexes is served around (correct, but not what these tests look at).
            "heartbeat_s": 0.2,
            "liveness_ttl_s": 4.0,
            **(cluster or {}),
        },
        "providers.local": {"kind": "local"},
    }


def write_node_config(path: Path, sections: dict[str, dict[str, Any]]) -> Path:
    """The sections plus the one model, deepseek-chat (thinking off) on the local engine."""
    write_config(path, sections)
    with path.open("a") as fh:
        fh.write('[models."deepseek-chat"]\n')
        fh.write('routes = [{ provider = "local", model = "deepseek-v3.1", thinking = false }]\n')
    return path


@dataclass
class NodeProcess:
    node_id: str
    port: int
    proc: subprocess.Popen[bytes]
    log_path: Path

    @property
    def root(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.root}/v1"

    def kill(self) -> None:
        """kill -9: no goodbye to the cluster."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)

    def freeze(self) -> None:
        """SIGSTOP: its sockets still accept connections, nothing answers."""
        self.proc.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        self.thaw()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()


def start_node(node_id: str, config: Path, workdir: Path, *, nice: int = 0) -> NodeProcess:
    port = free_port()
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "GATEWAY_CLUSTER__SECRET": SECRET,
        "GATEWAY_CLUSTER__NODE_ID": node_id,
        "GATEWAY_CLUSTER__INTERNAL_URL": f"http://127.0.0.1:{port}",
        "GATEWAY_CLUSTER__INTERNAL_SOCKET": str(workdir / f"{node_id}.sock"),
        "GATEWAY_USE_PRESETS": "false",
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    log_path = workdir / f"{node_id}.log"
    cmd = [sys.executable, "-m", "gateway", "serve", "--config", str(config)]
    cmd += ["--host", "127.0.0.1", "--port", str(port)]
    if nice:
        cmd = ["nice", "-n", str(nice), *cmd]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(cmd, env=env, cwd=workdir, stdout=log, stderr=subprocess.STDOUT)
    return NodeProcess(node_id, port, proc, log_path)


async def cluster_status(session: aiohttp.ClientSession, node: NodeProcess) -> dict[str, Any]:
    async with session.get(node.root + STATUS_PATH, headers={SECRET_HEADER: SECRET}) as resp:
        resp.raise_for_status()
        data: dict[str, Any] = await resp.json()
        return data


async def wait_for(
    session: aiohttp.ClientSession,
    node: NodeProcess,
    check: Any,
    *,
    timeout_s: float = 120.0,
    what: str = "",
) -> dict[str, Any]:
    """Poll `node`'s cluster status until `check(status)` holds (readiness, not a sleep)."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        if node.proc.poll() is not None:
            raise RuntimeError(f"{node.node_id} exited: {node.log_path.read_text()[-3000:]}")
        try:
            last = await cluster_status(session, node)
            if check(last):
                return dict(last)
        except (aiohttp.ClientError, OSError) as exc:
            last = exc
        await asyncio.sleep(0.05)
    raise AssertionError(f"{node.node_id}: never {what}; last status {last}")


async def wait_cluster(session: aiohttp.ClientSession, nodes: list[NodeProcess]) -> None:
    """Until every node is up and sees every other as live."""
    ids = {n.node_id for n in nodes}
    for node in nodes:
        await wait_for(
            session, node, lambda s: set(s["nodes"]) == ids, what=f"saw all of {sorted(ids)}"
        )
