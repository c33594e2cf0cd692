"""Fault drills for tests and `benchmarks/faults.py`: a gateway in a process of its own (so it
can be stopped with SIGTERM or SIGKILL), steady streaming load on it, and the account taken
afterwards in Redis: requests the upstream served vs usage records, capacity still held.

Everything lives under the key prefix `gw:` of a Redis the drill owns (a private server)."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from redis.asyncio import Redis
from redis.exceptions import RedisError

from gateway.keys.records import KeyCreate
from gateway.keys.store import KeySpace, KeyStore, text
from testkit.gateway_procs import engines_loaded

ROOT = Path(__file__).resolve().parent.parent
PREFIX = "gw:"
SPACE = KeySpace(PREFIX)
USER = [{"role": "user", "content": "alpha beta gamma delta epsilon"}]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class GatewayProcess:
    """`python -m gateway serve` on a free port, keyed, on the Redis at `redis_url`."""

    workdir: Path
    redis_url: str
    upstream_url: str
    model: str  # the mock scenario every request runs, e.g. "echo-chunks-20-gap-0.05"
    lease_s: float = 15.0
    timeout_s: float = 2.0
    # Further models beside "drill", each a mock scenario on the same provider.
    models: dict[str, str] = field(default_factory=dict)
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def root(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def spool_dir(self) -> Path:
        return self.workdir / "spool"

    def _config(self) -> Path:
        config = self.workdir / "gateway.toml"
        config.write_text(f"""
[usage]
enabled = false
[server]
host = "127.0.0.1"
port = {self.port}
grace_period_s = 10
[redis]
url = "{self.redis_url}"
embedded = false
key_prefix = "{PREFIX}"
timeout_s = {self.timeout_s}
[limits]
slot_lease_s = {self.lease_s}
spool_dir = "{self.spool_dir}"
[logging]
format = "json"
level = "warning"
[providers.mock]
kind = "openai"
base_url = "{self.upstream_url}"
[models."drill"]
routes = [{{ provider = "mock", model = "{self.model}" }}]
{self._more_models()}""")
        return config

    def _more_models(self) -> str:
        return "".join(
            f'[models."{name}"]\nroutes = [{{ provider = "mock", model = "{scenario}" }}]\n'
            for name, scenario in self.models.items()
        )

    def _spawn(self) -> subprocess.Popen[bytes]:
        env = {**os.environ, "GATEWAY_USE_PRESETS": "false", "PYTHONPATH": str(ROOT)}
        with open(self.workdir / "gateway.log", "ab") as log:  # the child keeps its own handle
            return subprocess.Popen(
                [sys.executable, "-m", "gateway", "serve", "--config", str(self._config())],
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=log,
            )

    async def start(self, within_s: float = 30.0) -> None:
        """Start it and wait until /healthz answers and its local engine, if any, is loaded
        (or the process exits: an error)."""
        self.proc = self._spawn()
        deadline = time.monotonic() + within_s
        async with aiohttp.ClientSession() as session:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"the gateway exited with status {self.proc.returncode}")
                try:
                    async with session.get(f"{self.root}/healthz") as resp:
                        if resp.status == 200:
                            left = max(1.0, deadline - time.monotonic())
                            await engines_loaded(session, self.root, within_s=left)
                            return
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.05)
        raise RuntimeError("the gateway did not become ready")

    async def stop(self, sig: signal.Signals, within_s: float = 30.0) -> int:
        """Send `sig` and wait for the process to exit; its exit status."""
        assert self.proc is not None
        self.proc.send_signal(sig)
        deadline = time.monotonic() + within_s
        while self.proc.poll() is None:
            assert time.monotonic() < deadline, "the gateway did not exit"
            await asyncio.sleep(0.02)
        code = self.proc.returncode
        self.proc = None
        return code


async def create_key(redis: Redis, **limits: int) -> tuple[str, str]:
    secret, record = await KeyStore(redis, prefix=PREFIX).create(KeyCreate(name="drill", **limits))
    return secret, record.id


@dataclass
class Load:
    """`clients` clients each streaming requests back to back until `stop()`; a request that
    fails (gateway away, 503) is retried after a short pause."""

    root: str
    key: str
    clients: int
    model: str = "drill"
    statuses: Counter[str] = field(default_factory=Counter)
    # (monotonic time the answer was read, client index, status), in order
    answers: list[tuple[float, int, str]] = field(default_factory=list)
    in_flight: int = 0
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    _running: bool = True

    def start(self) -> None:
        self._tasks = [asyncio.ensure_future(self._client(i)) for i in range(self.clients)]

    async def stop(self) -> None:
        self._running = False
        await asyncio.gather(*self._tasks)

    def retarget(self, root: str) -> None:
        self.root = root

    def first_ok_after(self, since: float) -> float | None:
        """When the first answer with status 200 was read after `since` (None: none yet)."""
        return next((t for t, _, s in self.answers if t >= since and s == "200"), None)

    def all_ok_after(self, since: float) -> float | None:
        """When every client had read an answer with status 200 after `since` (None: not yet)."""
        seen: set[int] = set()
        for t, client, status in self.answers:
            if t >= since and status == "200":
                seen.add(client)
                if len(seen) == self.clients:
                    return t
        return None

    async def _client(self, index: int) -> None:
        body = {"model": self.model, "messages": USER, "stream": True, "max_tokens": 50}
        headers = {"Authorization": f"Bearer {self.key}"}
        async with aiohttp.ClientSession() as session:
            while self._running:
                self.in_flight += 1
                try:
                    async with session.post(
                        f"{self.root}/v1/chat/completions",
                        json=body,
                        headers=headers,
                        timeout=aiohttp.ClientTimeout(total=30),
                    ) as resp:
                        await resp.read()
                        status = str(resp.status)
                except (aiohttp.ClientError, TimeoutError):
                    status = "broken"
                finally:
                    self.in_flight -= 1
                self.statuses[status] += 1
                self.answers.append((time.monotonic(), index, status))
                ok = status == "200"
                if not ok:
                    await asyncio.sleep(0.05)


@dataclass(frozen=True)
class Account:
    """Where a key stands once its load has stopped."""

    served: int  # requests the upstream answered (each one was admitted)
    recorded: int  # usage records
    unsettled: int  # admissions never settled: slots left, or swept as lapsed
    live_slots: int  # concurrency slots whose lease has not run out
    held_tokens: int  # tokens reserved by those

    @property
    def lost(self) -> int:
        """Admitted requests without a usage record (also those the upstream never saw)."""
        return max(self.served - self.recorded, self.unsettled)

    def clean(self, may_lose: int = 0) -> bool:
        return self.lost <= may_lose and self.live_slots == 0 and self.held_tokens == 0


async def account(redis: Redis, key_id: str, served: int) -> Account:
    now_ms = int(time.time() * 1000)
    slots = await redis.zcard(SPACE.slots(key_id))
    live = [text(t) for t in await redis.zrangebyscore(SPACE.slots(key_id), now_ms, "+inf")]
    amounts = await redis.hmget(SPACE.held(key_id), live) if live else []
    lapsed = sum(1 for v in await redis.hvals(SPACE.gone(key_id)) if v == b"lapsed")
    recorded = await redis.xlen(SPACE.usage_log())
    held = sum(int(a) for a in amounts if a is not None)
    return Account(served, recorded, slots + lapsed, len(live), held)


async def recovered(
    redis: Redis,
    key_id: str,
    served: int,
    root: str,
    key: str,
    *,
    may_lose: int = 0,
    within_s: float = 60.0,
) -> tuple[float, Account]:
    """Seconds until no more than `may_lose` admitted requests lack a record, nothing is held
    and a new request succeeds (or the deadline passes); and the account just before that
    request."""
    start = time.monotonic()
    last = None
    while time.monotonic() - start < within_s:
        try:
            last = await account(redis, key_id, served)
        except (OSError, RedisError):
            await asyncio.sleep(0.05)
            continue
        if last.clean(may_lose) and await _succeeds(root, key):
            break
        await asyncio.sleep(0.05)
    assert last is not None, "Redis never answered"
    return time.monotonic() - start, last


async def idle(redis: Redis, key_id: str, within_s: float = 30.0) -> None:
    """Wait until the key holds no live slot (the last request's settlement has landed)."""
    deadline = time.monotonic() + within_s
    while (await account(redis, key_id, 0)).live_slots:
        assert time.monotonic() < deadline, "slots still held"
        await asyncio.sleep(0.02)


async def _succeeds(root: str, key: str) -> bool:
    return await request_status(root, key) == 200


async def request_status(root: str, key: str) -> int:
    """One small request's status; 0 when the gateway could not be reached."""
    body = {"model": "drill", "messages": USER, "max_tokens": 5}
    try:
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                f"{root}/v1/chat/completions",
                json=body,
                headers={"Authorization": f"Bearer {key}"},
                timeout=aiohttp.ClientTimeout(total=30),
            ) as resp,
        ):
            await resp.read()
            return resp.status
    except (aiohttp.ClientError, TimeoutError):
        return 0


@dataclass
class RedisProcess:
    """A redis-server of the drill's own on a free port, append-only with an fsync per write
    (so what Redis acknowledged survives its SIGKILL, and any loss measured is the gateway's)."""

    dir: Path
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    async def start(self, within_s: float = 30.0) -> None:
        self.proc = subprocess.Popen(  # noqa: ASYNC220 (a child that outlives this call)
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
             "--dir", str(self.dir), "--appendonly", "yes", "--appendfsync", "always",
             "--save", ""],
            stdout=subprocess.DEVNULL,
        )  # fmt: skip
        client = Redis.from_url(self.url)
        deadline = time.monotonic() + within_s
        try:
            while True:
                try:
                    if await client.ping():
                        return
                except (OSError, RedisError) as exc:  # refused, or still LOADING
                    if time.monotonic() > deadline:
                        raise RuntimeError("redis-server did not become ready") from exc
                await asyncio.sleep(0.02)
        finally:
            await client.aclose()

    def send(self, sig: signal.Signals) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def stop(self, sig: signal.Signals = signal.SIGTERM) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.send_signal(sig)
            self.proc.wait(timeout=30)
            self.proc = None
