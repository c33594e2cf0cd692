"""The load generator of `gateway_overhead.py`: bursts of chat requests at a fixed concurrency
against one endpoint, with latency percentiles and the CPU seconds per request of the process
behind it (from /proc) and of Redis (INFO cpu)."""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from redis.asyncio import Redis

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """CPU seconds of `pid` and of its live children (the workers of `server.workers > 1`)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    own = (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return own + sum(cpu_seconds(int(child)) for child in children)


def rss_mb(pid: int) -> float:
    """Resident memory of `pid` in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise ValueError(f"no VmRSS for {pid}")


async def _rediscpu_seconds(redis: Redis) -> float:
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
    """One burst of requests on one path at one level."""

    rps: float
    p50_ms: float
    p99_ms: float
    gateway_cpu_ms: float | None  # gateway process CPU per request
    redis_cpu_ms: float  # Redis server CPU per request (whoever else uses it counts too)


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


@dataclass
class Endpoint:
    label: str
    url: str
    headers: dict[str, str]
    model: str
    pid: int | None


class Bench:
    def __init__(self, redis: Redis, chunks: int, requests: int) -> None:
        self._redis = redis
        self._chunks = chunks
        self._requests = requests
        # One connection pool per (path, concurrency), kept across rounds: a burst measures
        # requests, not connection set-up.
        self._sessions: dict[tuple[str, int], aiohttp.ClientSession] = {}

    def _session(self, label: str, concurrency: int) -> aiohttp.ClientSession:
        key = (label, concurrency)
        if key not in self._sessions:
            connector = aiohttp.TCPConnector(limit=concurrency)
            self._sessions[key] = aiohttp.ClientSession(connector=connector)
        return self._sessions[key]

    async def close(self) -> None:
        for session in self._sessions.values():
            await session.close()

    def _body(self, path: Endpoint, level: Level) -> bytes:
        return json.dumps(
            {
                "model": path.model,
                "messages": [{"role": "user", "content": "the quick brown fox"}],
                "stream": level.stream,
                "max_tokens": self._chunks + 8,
            }
        ).encode()

    def _count(self, level: Level) -> int:
        return max(200, self._requests // 4) if level.concurrency == 1 else self._requests

    async def warm(self, path: Endpoint, level: Level) -> None:
        session = self._session(path.label, level.concurrency)
        body = self._body(path, level)
        await load(session, path.url, path.headers, body, level.concurrency, 200, level.stream)

    async def burst(self, path: Endpoint, level: Level) -> Burst:
        session = self._session(path.label, level.concurrency)
        body, n = self._body(path, level), self._count(level)
        cpu0 = cpu_seconds(path.pid) if path.pid else 0.0
        redis0 = await _rediscpu_seconds(self._redis)
        elapsed, lat = await load(
            session, path.url, path.headers, body, level.concurrency, n, level.stream
        )
        redis_cpu = (await _rediscpu_seconds(self._redis) - redis0) / n * 1000
        cpu = (cpu_seconds(path.pid) - cpu0) / n * 1000 if path.pid else None
        lat.sort()
        return Burst(
            n / elapsed,
            statistics.median(lat) * 1000,
            lat[int(len(lat) * 0.99) - 1] * 1000,
            cpu,
            redis_cpu,
        )
