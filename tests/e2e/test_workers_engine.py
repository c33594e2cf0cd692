"""`[server] workers = 2` with the local engine, as real processes (`python -m gateway serve`):
the model is loaded once (worker 0), worker 1 answers without it, a client leaving worker 1
frees the engine's blocks, SIGTERM drains both, and worker 0 killed gives worker 1's requests
in flight clear errors, settled in the usage log. A test reaches one worker by keeping a
connection the kernel gave to it (asked with /healthz); every log line names its worker."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from redis.asyncio import Redis

from gateway.keys.records import KeyCreate
from gateway.keys.store import KeySpace, KeyStore
from testkit.cluster_nodes import ROOT, free_port, write_node_config
from testkit.gateway_app import REDIS_URL
from tests.support.processes import process_alive
from tests.support.sse_rules import check_chat_stream, sse_payloads

# Two full blocks (block_size 16) and more: a repeat of the prompt reads them from the cache.
SEA = "Tell me about the sea, the waves, the tides, the boats and the gulls over the harbour."
USER = [{"role": "user", "content": SEA}]
DEADLINE_S = 120.0


@dataclass
class Gateway:
    proc: subprocess.Popen[bytes]
    port: int
    log_path: Path
    run_dir: Path
    prefix: str
    key: str

    @property
    def root(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def events(self, name: str | None) -> list[dict[str, Any]]:
        """The log's events called `name` (None: all), in order."""
        text = self.log_path.read_text()
        # Only whole lines: a worker may be writing the last one while it is read.
        lines = text[: text.rfind("\n") + 1].splitlines()
        events = [json.loads(line) for line in lines if line.startswith("{")]
        return [e for e in events if name is None or e.get("event") == name]

    def worker_pids(self) -> list[int]:
        (started,) = self.events("workers_started")
        return [int(pid) for pid in started["pids"]]  # in worker order

    async def served_by(self, request_id: str) -> int:
        """The worker whose access log line (written when the answer ends) has `request_id`."""
        deadline = asyncio.get_running_loop().time() + DEADLINE_S
        while True:
            lines = [e for e in self.events("request") if e.get("request_id") == request_id]
            if lines:
                (line,) = lines
                return int(line["worker"])
            assert asyncio.get_running_loop().time() < deadline, f"no log line for {request_id}"
            await asyncio.sleep(0.05)

    async def exited(self, within_s: float = 60.0) -> int:
        deadline = asyncio.get_running_loop().time() + within_s
        while self.proc.poll() is None:
            assert asyncio.get_running_loop().time() < deadline, "the gateway did not exit"
            await asyncio.sleep(0.05)
        return self.proc.returncode


@asynccontextmanager
async def gateway_process(checkpoint: Path, workdir: Path) -> AsyncIterator[Gateway]:
    """Two workers on the tiny checkpoint, keyed, their socket and secret the supervisor's."""
    prefix = f"test:{uuid.uuid4().hex}:"
    port = free_port()
    run_dir = workdir / "run"
    sections = {
        "server": {"port": port, "workers": 2, "grace_period_s": 30, "run_dir": str(run_dir)},
        "redis": {"url": REDIS_URL, "embedded": False, "key_prefix": prefix},
        "logging": {"format": "json", "level": "info"},
        "usage": {"enabled": False},
        "engine": {
            "model_path": str(checkpoint),
            "dtype": "float32",
            "block_size": 16,
            "cache_memory_mb": 4,
            "max_num_seqs": 16,
            "max_batch_tokens": 1024,
            "num_threads": 1,
        },
        "providers.local": {"kind": "local"},
    }
    config = write_node_config(workdir / "gateway.toml", sections)
    log_path = workdir / "gateway.log"
    redis = Redis.from_url(REDIS_URL)
    secret, _ = await KeyStore(redis, prefix=prefix).create(KeyCreate(name="workers"))
    proc = _spawn(config, workdir, log_path)
    gateway = Gateway(proc, port, log_path, run_dir, prefix, secret)
    try:
        yield gateway
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in _children_left(gateway):
            os.kill(pid, signal.SIGKILL)
        keys = [k async for k in redis.scan_iter(match=f"{prefix}*", count=1000)]
        if keys:
            await redis.delete(*keys)
        await redis.aclose()


def _spawn(config: Path, workdir: Path, log_path: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "GATEWAY_USE_PRESETS": "false", "PYTHONPATH": str(ROOT)}
    env.pop("GATEWAY_CLUSTER__SECRET", None)  # the supervisor draws one
    cmd = [sys.executable, "-m", "gateway", "serve", "--config", str(config)]
    with log_path.open("wb") as log:
        return subprocess.Popen(cmd, cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT)


def _children_left(gateway: Gateway) -> list[int]:
    try:
        return [pid for pid in gateway.worker_pids() if process_alive(pid)]
    except ValueError:
        return []


@asynccontextmanager
async def on_worker(gateway: Gateway, worker: int) -> AsyncIterator[aiohttp.ClientSession]:
    """A session whose one connection the kernel gave to `worker`, once it is ready. (Its
    requests stay on that worker only while the connection lives.)"""
    deadline = asyncio.get_running_loop().time() + DEADLINE_S
    headers = {"Authorization": f"Bearer {gateway.key}"}
    while True:
        assert asyncio.get_running_loop().time() < deadline, f"worker {worker} never ready"
        assert gateway.proc.poll() is None, gateway.log_path.read_text()[-3000:]
        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1), headers=headers)
        try:
            async with session.get(f"{gateway.root}/healthz") as resp:
                found = (await resp.json())["worker"] if resp.status == 200 else None
            if found == worker:
                async with session.get(f"{gateway.root}/readyz") as resp:
                    if resp.status == 200:
                        break
        except aiohttp.ClientError:
            pass
        await session.close()
        await asyncio.sleep(0.05)
    try:
        yield session
    finally:
        await session.close()


async def engine_gauges(session: aiohttp.ClientSession, root: str) -> dict[str, float]:
    """Worker 0's engine gauges from its /metrics (`session` is on worker 0)."""
    async with session.get(f"{root}/metrics") as resp:
        text = await resp.text()
    gauges = {}
    for line in text.splitlines():
        if line.startswith("engine_") and "{" in line:
            name, value = line.split("{", 1)[0], line.rsplit(" ", 1)[1]
            gauges[name] = float(value)
    return gauges


async def until_gauges(session: aiohttp.ClientSession, root: str, **want: float) -> None:
    deadline = asyncio.get_running_loop().time() + DEADLINE_S
    while True:
        gauges = await engine_gauges(session, root)
        if all(gauges.get(f"engine_{k}") == v for k, v in want.items()):
            return
        assert asyncio.get_running_loop().time() < deadline, gauges
        await asyncio.sleep(0.02)


def chat_body(max_tokens: int, *, stream: bool) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "deepseek-chat",
        "messages": USER,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for {pid}")


def maps_torch(pid: int) -> bool:
    return "libtorch" in Path(f"/proc/{pid}/maps").read_text()


async def test_one_engine_two_workers_then_sigterm_drains(
    tiny_checkpoint: Path, tmp_path: Path
) -> None:
    async with (
        gateway_process(tiny_checkpoint, tmp_path) as gateway,
        on_worker(gateway, 0) as zero,
        on_worker(gateway, 1) as one,
        on_worker(gateway, 1) as leaving,  # its connection is dropped: the others stay
    ):
        root = gateway.root
        socket_path = gateway.run_dir / f"engine-{gateway.port}.sock"
        assert socket_path.is_socket()
        # the model is loaded once, in worker 0; worker 1 has no torch and far less memory
        (started,) = gateway.events("local_engine_started")
        assert started["worker"] == 0
        (attached,) = gateway.events("shared_engine_attached")
        assert attached["worker"] == 1 and attached["socket"] == str(socket_path)
        pid0, pid1 = gateway.worker_pids()
        assert maps_torch(pid0) and not maps_torch(pid1)
        assert rss_kib(pid1) < rss_kib(pid0) / 2, (rss_kib(pid1), rss_kib(pid0))
        # both answer, the same tokens; worker 1 reads worker 0's prefix cache
        answers = {}
        body = chat_body(8, stream=False)
        for worker, session in ((0, zero), (1, one)):
            async with session.post(f"{root}/v1/chat/completions", json=body) as resp:
                assert resp.status == 200
                answers[worker] = await resp.json()
                assert await gateway.served_by(resp.headers["x-request-id"]) == worker
        assert answers[1]["choices"] == answers[0]["choices"]
        assert answers[1]["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
        # a client leaving worker 1 mid-stream: worker 0's engine frees the request's blocks
        resp = await leaving.post(f"{root}/v1/chat/completions", json=chat_body(1500, stream=True))
        assert resp.status == 200
        await resp.content.readline()
        await until_gauges(zero, root, running_requests=1)
        resp.close()
        await until_gauges(zero, root, running_requests=0, kv_blocks_used=0)
        assert await gateway.served_by(resp.headers["x-request-id"]) == 1
        # SIGTERM: worker 1's stream in flight finishes within the grace period
        async with one.post(f"{root}/v1/chat/completions", json=chat_body(60, stream=True)) as resp:
            first = await resp.content.readuntil(b"\n\n")
            request_id = resp.headers["x-request-id"]
            gateway.proc.send_signal(signal.SIGTERM)
            rest = await asyncio.wait_for(resp.read(), DEADLINE_S)
        stream = check_chat_stream(first + rest, include_usage=True)
        assert stream.finish_reason == "length" and stream.usage is not None
        assert stream.usage["completion_tokens"] == 60
        assert await gateway.exited() == 0
        assert await gateway.served_by(request_id) == 1
        # ... and it was still streaming when worker 1 began to drain
        order = [
            (e["event"], e.get("worker"))
            for e in gateway.events(None)
            if e.get("event") == "shutting_down" or e.get("request_id") == request_id
        ]
        assert order.index(("shutting_down", 1)) < order.index(("request", 1)), order
        assert not any(process_alive(pid) for pid in (pid0, pid1))
        assert not socket_path.exists()
        records = await usage_records(gateway)
        assert records[request_id]["status"] == "200"


async def usage_records(gateway: Gateway) -> dict[str, dict[str, str]]:
    redis = Redis.from_url(REDIS_URL, decode_responses=True)
    try:
        entries = await redis.xrange(KeySpace(gateway.prefix).usage_log())
    finally:
        await redis.aclose()
    return {fields["request_id"]: fields for _, fields in entries}


async def test_worker_0_killed_fails_worker_1s_requests_cleanly(
    tiny_checkpoint: Path, tmp_path: Path
) -> None:
    async with (
        gateway_process(tiny_checkpoint, tmp_path) as gateway,
        on_worker(gateway, 1) as streaming,
        on_worker(gateway, 1) as waiting,
    ):
        root = gateway.root
        stream = await streaming.post(
            f"{root}/v1/chat/completions", json=chat_body(1500, stream=True)
        )
        assert stream.status == 200
        first = await stream.content.readuntil(b"\n\n")
        answer = asyncio.ensure_future(
            waiting.post(f"{root}/v1/chat/completions", json=chat_body(1500, stream=False))
        )

        async with aiohttp.ClientSession() as any_worker:  # both export the engine's gauges
            await until_gauges(any_worker, root, running_requests=2)
        pid0, pid1 = gateway.worker_pids()
        os.kill(pid0, signal.SIGKILL)
        rest = await asyncio.wait_for(stream.read(), DEADLINE_S)
        payloads = sse_payloads(first + rest)
        error = json.loads(payloads[-1] if payloads[-1] != "[DONE]" else payloads[-2])
        assert "error" in error, (payloads[-3:], gateway.log_path.read_text()[-6000:])
        assert error["error"]["code"] == "upstream_unavailable", payloads[-3:]
        resp = await asyncio.wait_for(answer, DEADLINE_S)
        assert resp.status == 502
        body = await resp.json()
        assert body["error"]["code"] == "upstream_unavailable"
        # the supervisor stops worker 1 and exits with worker 0's fate
        assert await gateway.exited() != 0
        assert not process_alive(pid1)
        records = await usage_records(gateway)
        for request_id in (stream.headers["x-request-id"], resp.headers["x-request-id"]):
            assert records[request_id]["error_code"] == "upstream_unavailable"
