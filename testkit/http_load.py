"""The load generator of `gateway_overhead.py`: bursts of chat requests at a fixed concurrency
against one endpoint, with latency percentiles and the CPU seconds per request of every process
on the request's path: the gateway (its workers too), Redis (INFO cpu), the upstream mock and the
load generator itself.

Two load generators send the same request: `wrk` (native; for a fixed time per burst) when it is
installed, else this module's aiohttp client (a fixed number of requests per burst). The Python
one spends about as much CPU per request as the gateway, which on a 2-core machine caps what a
second gateway worker can add (the benchmark prints the bound).
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from redis.asyncio import Redis

from testkit import wrk_load

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def own_cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system) of `pid` alone."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def io_calls(pids: list[int]) -> tuple[int, int]:
    """(read-like, write-like) system calls made so far by `pids` together, from
    /proc/<pid>/io (its syscr and syscw: read(2) and write(2) calls, which is how libuv, under
    uvloop, reads and writes sockets; send(2) and recv(2) are not counted); nothing for a
    process with no such file or one that cannot be read."""
    reads = writes = 0
    for pid in pids:
        try:
            lines = Path(f"/proc/{pid}/io").read_text().splitlines()
        except OSError:
            continue
        counts = dict(line.split(": ", 1) for line in lines if ": " in line)
        reads += int(counts.get("syscr", 0))
        writes += int(counts.get("syscw", 0))
    return reads, writes


def process_tree(pid: int) -> list[int]:
    """`pid` and its live descendants (the supervisor and workers of `server.workers > 1`)."""
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return [pid, *(p for child in children for p in process_tree(int(child)))]


def cpu_seconds(pid: int) -> float:
    """CPU seconds of `pid` and of its live descendants."""
    return sum(map(own_cpu_seconds, process_tree(pid)))


def rss_mb(pid: int) -> float:
    """Resident memory of `pid` in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise ValueError(f"no VmRSS for {pid}")


def cpu_jiffies() -> tuple[int, int]:
    """(stolen, all) CPU time of the whole machine so far, from /proc/stat's first line ((0, 0)
    without one). Stolen time is time this virtual machine wanted to run and its host ran
    something else: figures taken while it grows are the host's neighbours' as much as ours."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return 0, 0
    # user nice system idle iowait irq softirq steal (guest time is counted within user)
    return (fields[7] if len(fields) > 7 else 0), sum(fields[:8])


def stolen_share(before: tuple[int, int], after: tuple[int, int]) -> float:
    """The share of the CPU time between two `cpu_jiffies()` readings that the host stole."""
    total = after[1] - before[1]
    return (after[0] - before[0]) / total if total > 0 else 0.0


# What `python_speed_s` read on the machine of the CPU targets' figures in docs/performance.md.
REFERENCE_SPEED_S = 0.51


def python_speed_s() -> float:
    """User CPU seconds of `python3 -c "s=0\nfor i in range(10_000_000): s+=i"` (run as a child
    process, as the reference below was read): how fast this machine runs Python now. It read
    0.51 s on one 2-core guest and 1.85 s on another; figures of runs on different machines
    compare only scaled by it."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime
    code = "s = 0\nfor i in range(10_000_000): s += i"
    subprocess.run([sys.executable, "-c", code], check=True)
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime - before


async def redis_cpu_seconds(redis: Redis) -> float:
    info = await redis.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


@dataclass(frozen=True)
class Level:
    concurrency: int
    stream: bool

    @property
    def mode(self) -> str:
        return "stream" if self.stream else "json"


@dataclass
class Burst:
    """One burst of requests on one path at one level; CPU figures are ms per request."""

    rps: float
    p50_ms: float
    p99_ms: float
    gateway_cpu_ms: float | None  # the gateway's processes (None on the direct path)
    redis_cpu_ms: float  # the Redis server (whoever else uses it counts too)
    mock_cpu_ms: float = 0.0  # the upstream that answered
    load_cpu_ms: float = 0.0  # the load generator
    process_cpu_ms: tuple[float, ...] = ()  # the gateway's, process by process (supervisor first)
    # The gateway's read and write system calls per request (None on the direct path): a
    # request's frames split over more writes than its reads show up here first.
    gateway_reads: float | None = None
    gateway_writes: float | None = None

    @property
    def total_cpu_ms(self) -> float:
        return (
            (self.gateway_cpu_ms or 0.0) + self.redis_cpu_ms + self.mock_cpu_ms + self.load_cpu_ms
        )


@dataclass
class Endpoint:
    label: str
    url: str  # JSON requests go here
    stream_url: str  # streamed ones here (the direct path's stream upstream differs)
    headers: dict[str, str]
    model: str
    stream_model: str
    pid: int | None  # the gateway's process (its workers are its children)


@dataclass
class Upstreams:
    """The processes whose CPU is the upstream's, for JSON and for streamed answers."""

    json_pids: list[int] = field(default_factory=list)
    stream_pids: list[int] = field(default_factory=list)


async def load(
    session: aiohttp.ClientSession,
    url: str,
    headers: dict[str, str],
    body: bytes,
    concurrency: int,
    total: int,
    stream: bool,
) -> tuple[float, list[float]]:
    latencies: list[float] = []
    remaining = total

    async def worker() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            t0 = time.perf_counter()
            async with session.post(url, data=body, headers=headers) as resp:
                if stream:
                    async for _ in resp.content.iter_any():
                        pass
                else:
                    await resp.read()
                if resp.status != 200:
                    raise RuntimeError(f"{url} answered {resp.status}")
            latencies.append(time.perf_counter() - t0)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.perf_counter() - started, latencies


class Bench:
    """`native`: bursts by wrk of `seconds` each; else by aiohttp of `requests` each (a quarter
    of that, at least 200, at one client)."""

    def __init__(
        self,
        redis: Redis,
        upstreams: Upstreams,
        *,
        chunks: int,
        native: bool,
        requests: int,
        seconds: float,
    ) -> None:
        self._redis = redis
        self._upstreams = upstreams
        self._chunks = chunks
        self._native = native
        self._requests = requests
        self._seconds = seconds
        # One connection pool per (path, concurrency), kept across rounds: a burst measures
        # requests, not connection set-up.
        self._sessions: dict[tuple[str, int], aiohttp.ClientSession] = {}
        self._scripts: dict[tuple[str, bool], Path] = {}

    async def close(self) -> None:
        for session in self._sessions.values():
            await session.close()
        for path in self._scripts.values():
            path.unlink(missing_ok=True)

    def _body(self, path: Endpoint, level: Level) -> bytes:
        return json.dumps(
            {
                "model": path.stream_model if level.stream else path.model,
                "messages": [{"role": "user", "content": "the quick brown fox"}],
                "stream": level.stream,
                "max_tokens": self._chunks + 8,
            }
        ).encode()

    async def warm(self, path: Endpoint, level: Level) -> None:
        await self._send(path, level, 200, 1.0)

    async def burst(self, path: Endpoint, level: Level) -> Burst:
        mock_pids = self._upstreams.stream_pids if level.stream else self._upstreams.json_pids
        gateway = process_tree(path.pid) if path.pid else []
        cpu0 = [own_cpu_seconds(p) for p in gateway]
        io0 = io_calls(gateway)
        mock0 = sum(map(cpu_seconds, mock_pids))
        redis0 = await redis_cpu_seconds(self._redis)
        n, elapsed, p50, p99, load_cpu = await self._send(
            path, level, self._count(level), self._seconds
        )
        redis_cpu = (await redis_cpu_seconds(self._redis) - redis0) / n * 1000
        mock_cpu = (sum(map(cpu_seconds, mock_pids)) - mock0) / n * 1000
        each = tuple(
            (own_cpu_seconds(p) - c) / n * 1000 for p, c in zip(gateway, cpu0, strict=True)
        )
        cpu = sum(each) if path.pid else None
        io1 = io_calls(gateway)
        reads, writes = ((a - b) / n for a, b in zip(io1, io0, strict=True))
        return Burst(
            n / elapsed,
            p50,
            p99,
            cpu,
            redis_cpu,
            mock_cpu,
            load_cpu / n * 1000,
            each,
            reads if path.pid else None,
            writes if path.pid else None,
        )

    def _count(self, level: Level) -> int:
        return max(200, self._requests // 4) if level.concurrency == 1 else self._requests

    async def _send(
        self, path: Endpoint, level: Level, count: int, seconds: float
    ) -> tuple[int, float, float, float, float]:
        """Requests sent, seconds, p50 ms, p99 ms, the load generator's CPU seconds."""
        url = path.stream_url if level.stream else path.url
        body = self._body(path, level)
        if self._native:
            key = (path.label, level.stream)
            if key not in self._scripts:
                self._scripts[key] = wrk_load.script(body, path.headers)
            result = await asyncio.to_thread(
                wrk_load.run, url, self._scripts[key], level.concurrency, seconds
            )
            return result.requests, result.seconds, result.p50_ms, result.p99_ms, result.cpu_s
        key2 = (path.label, level.concurrency)
        if key2 not in self._sessions:
            connector = aiohttp.TCPConnector(limit=level.concurrency)
            self._sessions[key2] = aiohttp.ClientSession(connector=connector)
        cpu0 = time.process_time()
        elapsed, lat = await load(
            self._sessions[key2], url, path.headers, body, level.concurrency, count, level.stream
        )
        cpu = time.process_time() - cpu0
        lat.sort()
        p99 = lat[int(len(lat) * 0.99) - 1]
        return len(lat), elapsed, statistics.median(lat) * 1000, p99 * 1000, cpu
