"""The processes a gateway benchmark runs: the upstreams (the Python mock; nginx answering the
JSON chat completion), `python -m gateway serve` on a config written for it, and a key with
limits set high; started on 127.0.0.1 and awaited with a readiness deadline.

Upstreams: streamed answers always come from the Python mock (testkit/mock_upstream.py), one
write per SSE frame as a live upstream sends them. Non-streamed answers come from nginx when it
is installed (`return 200` of the very bytes the mock would answer to the benchmark's request,
so the gateway reads and re-encodes the same answer), and from the Python mock otherwise: nginx
spends a tenth of the CPU per answer, CPU that the 2-core machine would otherwise take from the
gateway.
"""

from __future__ import annotations

import asyncio
import json
import logging
import multiprocessing as mp
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import aiohttp
from redis.asyncio import Redis

from gateway.access.contract import Outcome, Ticket
from gateway.config.process import ServerSettings
from gateway.keys.records import KeyCreate
from gateway.keys.redis_access import RedisAccessControl
from gateway.keys.store import KeyStore
from plumbing.busy_wait import BusyWait
from providers.types import Usage
from testkit.mock_scenarios import make_plan, parse_model
from testkit.mock_upstream import MockUpstream

ROOT = Path(__file__).resolve().parents[1]
REDIS_URL = "redis://127.0.0.1:6379/0"
STREAM_MODEL = "bench-stream"  # streamed clients ask for this one; JSON clients for "bench"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def request_body(model: str, chunks: int, stream: bool) -> dict[str, Any]:
    """The benchmark's chat request (the same on every path)."""
    return {
        "model": model,
        "messages": [{"role": "user", "content": "the quick brown fox"}],
        "stream": stream,
        "max_tokens": chunks + 8,
    }


def run_mock(port_queue: mp.Queue) -> None:  # type: ignore[type-arg]
    # A burst ends with streams in flight (wrk stops on time): their cut is not an error here.
    logging.getLogger("aiohttp.server").setLevel(logging.CRITICAL)

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


def start_python_mock() -> tuple[mp.process.BaseProcess, str]:
    """The Python mock in a process of its own, and its base URL."""
    ctx = mp.get_context("spawn")
    queue: mp.Queue = ctx.Queue()  # type: ignore[type-arg]
    proc = ctx.Process(target=run_mock, args=(queue,), daemon=True)
    proc.start()
    return proc, queue.get(timeout=30)


def mock_answer(chunks: int) -> bytes:
    """What the Python mock answers to the benchmark's non-streamed upstream request."""
    body = request_body(f"echo-chunks-{chunks}", chunks, False)
    opts = parse_model(body["model"])
    assert opts is not None
    mock = MockUpstream()
    mock._counter = 1
    return json.dumps(mock._full(body, make_plan(body, opts), legacy=False)).encode()


class Nginx:
    """nginx (one worker) answering POST {base}/chat/completions with a fixed JSON body."""

    def __init__(self, answer: bytes) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="bench-nginx-"))
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        text = answer.decode()
        if any(c in text for c in "'\\$"):
            raise ValueError("the answer needs quoting that nginx's `return` does not do")
        (self.dir / "nginx.conf").write_text(
            _NGINX_CONF.format(dir=self.dir, port=self.port, answer=text)
        )
        self.proc: subprocess.Popen[bytes] | None = None

    @staticmethod
    def available() -> bool:
        return shutil.which("nginx") is not None

    def start(self) -> None:
        nginx = shutil.which("nginx") or "nginx"
        args = [nginx, "-p", str(self.dir), "-c", str(self.dir / "nginx.conf"), "-e", "stderr"]
        self.proc = subprocess.Popen(args)

    @property
    def pid(self) -> int:
        """The master's (its worker is its child: `cpu_seconds` counts both)."""
        assert self.proc is not None
        return self.proc.pid

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
        shutil.rmtree(self.dir, ignore_errors=True)


_NGINX_CONF = """
daemon off;
worker_processes 1;
pid {dir}/nginx.pid;
error_log stderr warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {dir}/body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    keepalive_requests 100000000;
    keepalive_timeout 600s;
    server {{
        listen 127.0.0.1:{port};
        location = /v1/chat/completions {{
            default_type application/json;
            return 200 '{answer}';
        }}
    }}
}}
"""


def start_gateway(
    json_url: str,
    stream_url: str,
    chunks: int,
    keyed: bool,
    prefix: str,
    workers: int = 1,
    busy_wait_us: int | None = None,
    *,
    tree: Path = ROOT,
    cpus: str | None = None,
    usage_db: Path | None = None,
    admin_key: str | None = None,
    extra_env: dict[str, str] | None = None,
) -> tuple[subprocess.Popen[bytes], str]:
    """`bench` routes to the JSON upstream at `json_url`, `bench-stream` to `stream_url`.
    `busy_wait_us`: `[server] busy_wait_us` (None: the default). `tree`: the source tree that
    serves (another checkout, for a comparison). `cpus`: a taskset CPU list to pin it to.
    `usage_db`: a SQLite file for the usage store (None: the store off). `admin_key`: the
    admin API's key (`key_via_admin_api`). `extra_env`: more environment (e.g. a PYTHONPATH that
    puts a directory before the tree's)."""
    port = free_port()
    config = Path(tempfile.mkdtemp()) / "bench.toml"
    busy_wait = "" if busy_wait_us is None else f"busy_wait_us = {busy_wait_us}"
    config.write_text(f"""
[server]
host = "127.0.0.1"
port = {port}
workers = {workers}
{busy_wait}
[redis]
url = "{REDIS_URL}"
embedded = false
key_prefix = "{prefix}"
[logging]
format = "json"
level = "warning"
[auth]
enabled = {"true" if keyed else "false"}
[providers.json]
kind = "openai"
base_url = "{json_url}"
[providers.stream]
kind = "openai"
base_url = "{stream_url}"
[models."bench"]
routes = [{{ provider = "json", model = "echo-chunks-{chunks}" }}]
[models."{STREAM_MODEL}"]
routes = [{{ provider = "stream", model = "echo-chunks-{chunks}" }}]
""")
    # The usage store off through the environment, which a tree from before it ignores.
    env = {
        **os.environ,
        "GATEWAY_USE_PRESETS": "false",
        "GATEWAY_USAGE__ENABLED": "false",
        "PYTHONPATH": str(tree),
    }
    if usage_db is not None:
        env["GATEWAY_USAGE__ENABLED"] = "true"
        env["GATEWAY_USAGE__URL"] = f"sqlite+aiosqlite:///{usage_db}"
    if admin_key is not None:
        env["GATEWAY_ADMIN__API_KEY"] = admin_key
    env.update(extra_env or {})
    launcher = ["-m", "gateway"]
    pin = ["taskset", "-c", cpus] if cpus is not None else []
    proc = subprocess.Popen(
        [*pin, sys.executable, *launcher, "serve", "--config", str(config)], cwd=tree, env=env
    )
    return proc, f"http://127.0.0.1:{port}"


def stop_gateways(procs: Iterable[subprocess.Popen[bytes]]) -> None:
    """SIGTERM every gateway, then wait for each (they drain at once: nothing is in flight)."""
    procs = list(procs)
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    for proc in procs:
        proc.wait(timeout=30)


async def tear_down(
    procs: Iterable[subprocess.Popen[bytes]],
    nginx: Nginx,
    mock: mp.process.BaseProcess,
    redis: Redis,
    prefix: str,
) -> None:
    """Stop the gateways, nginx and the Python mock; drop the run's Redis keys."""
    stop_gateways(procs)
    nginx.stop()
    mock.terminate()
    await drop_prefix(redis, prefix)
    await redis.aclose()


async def wait_ready(root: str, workers: int = 1, loaded_within_s: float = 600.0) -> None:
    """Until every worker answers /healthz (each on a new connection: SO_REUSEPORT hands a
    connection to any worker that listens, so a burst begun earlier would miss the late ones),
    then until no local engine is loading (`engines_loaded`)."""
    seen: set[int] = set()
    connector = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(connector=connector) as session:
        for _ in range(600):
            try:
                async with session.get(f"{root}/healthz") as resp:
                    if resp.status == 200:
                        seen.add((await resp.json())["worker"])
                        if len(seen) >= workers:
                            break
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.02 if seen else 0.05)
        else:
            raise RuntimeError(f"the gateway did not start (workers answering: {sorted(seen)})")
        await engines_loaded(session, root, within_s=loaded_within_s, answers=workers)


async def engines_loaded(
    session: aiohttp.ClientSession, root: str, *, within_s: float = 600.0, answers: int = 1
) -> None:
    """Until /readyz reports no local engine loading, `answers` times in a row (one per
    worker). The gateway listens before its engine is loaded (or its demo trained)."""
    deadline = time.monotonic() + within_s
    calm = 0
    while calm < answers:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the gateway's local engine did not load within {within_s} s")
        try:
            async with session.get(f"{root}/readyz") as resp:
                loading = (await resp.json()).get("loading", {})
        except aiohttp.ClientError:
            loading = {"?": "no answer"}
        calm = calm + 1 if not loading else 0
        if calm < answers:
            await asyncio.sleep(0.05)


async def high_limit_key(redis: Redis, prefix: str) -> str:
    secret, _ = await KeyStore(redis, prefix=prefix).create(
        KeyCreate(name="bench", budget_tokens=10**12, rpm=10**8, tpm=10**11, max_concurrency=10**5)
    )
    return secret


async def key_via_admin_api(root: str, admin_key: str) -> str:
    """A key with limits set high, made through the gateway's own admin API (whatever its
    tree's key format): its secret."""
    body = {"name": "bench", "budget_tokens": 10**12, "rpm": 10**8, "tpm": 10**11,
            "max_concurrency": 10**5}  # fmt: skip
    headers = {"Authorization": f"Bearer {admin_key}"}
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{root}/admin/keys", json=body, headers=headers) as resp,
    ):
        answer = await resp.json()
        if resp.status != 201:
            raise RuntimeError(f"the admin API refused the key: {resp.status} {answer}")
        return str(answer["key"])


async def admission_round_trip_ms(redis: Redis, prefix: str, calls: int = 2000) -> float:
    """Median wall time of one admission (the script a keyed request runs before its upstream
    call, as the gateway sends it, polling included) made alone by one client: the part of
    the keyed path's added latency at one client that is Redis's round trip."""
    secret = await high_limit_key(redis, prefix)
    access = RedisAccessControl(
        redis,
        prefix=prefix,
        usage_stream_maxlen=1000,
        spool_dir=Path(tempfile.mkdtemp(prefix="bench-spool-")),
        busy=BusyWait(ServerSettings().spin),
    )
    try:
        principal = await access.authenticate(secret)
        times: list[float] = []
        for i in range(calls):
            ticket = Ticket(principal, "bench", f"floor-{i}", 10, 28)
            started = time.perf_counter()
            grant = await access.admit(ticket)
            times.append(time.perf_counter() - started)
            await access.settle(grant, Outcome(Usage(prompt_tokens=10), 200))
        return statistics.median(times) * 1000
    finally:
        await access.aclose()


async def drop_prefix(redis: Redis, prefix: str) -> None:
    keys = [k async for k in redis.scan_iter(match=f"{prefix}*", count=1000)]
    if keys:
        await redis.delete(*keys)
