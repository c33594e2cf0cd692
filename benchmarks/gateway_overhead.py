"""What the gateway adds on top of its upstream, measured side by side in one run.

A mock upstream (answers at once, streams N chunks) runs in its own process; the gateway runs in
its own process (`python -m gateway serve`) in two modes: `open` (auth.enabled = false: no key,
limits or usage records) and `keyed` (a real key with limits set high: auth + admission +
settlement on Redis). A bounded load generator on 127.0.0.1 measures direct-to-mock and through
each gateway at concurrency 1, 16 and 64, non-streaming and streaming, and prints requests/s, p50
and p99 latency, the added latency (gateway minus direct) and the gateway's CPU seconds per request.

Targets (2-core machine): added p50 < 1 ms at concurrency 1; >= 1,500 non-streaming requests/s
through one gateway process; streaming adds < 50 us per chunk; with keys, auth + admission +
settlement add < 0.5 ms p50 at concurrency 1 and throughput drops < 20% against `open`.

    .venv/bin/python benchmarks/gateway_overhead.py [--requests 3000] [--chunks 20] [--repeat 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from redis.asyncio import Redis

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gateway.keys.records import KeyCreate  # noqa: E402
from gateway.keys.store import KeyStore  # noqa: E402
from tests.mock_upstream import MockUpstream  # noqa: E402

REDIS_URL = "redis://127.0.0.1:6379/0"
CONCURRENCY = (1, 16, 64)
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _run_mock(port_queue: mp.Queue) -> None:  # type: ignore[type-arg]
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


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


@dataclass
class Result:
    label: str
    concurrency: int
    stream: bool
    rps: float
    p50_ms: float
    p99_ms: float
    cpu_per_req_ms: float | None


async def _load(
    url: str, headers: dict[str, str], body: bytes, concurrency: int, total: int, stream: bool
) -> tuple[float, list[float]]:
    latencies: list[float] = []
    remaining = total
    connector = aiohttp.TCPConnector(limit=concurrency, force_close=False)
    async with aiohttp.ClientSession(connector=connector) as session:

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
        elapsed = time.perf_counter() - started
    return elapsed, latencies


async def _measure(
    label: str, url: str, headers: dict[str, str], chunks: int, total: int, pid: int | None
) -> list[Result]:
    results = []
    for stream in (False, True):
        body = json.dumps(
            {
                "model": f"echo-chunks-{chunks}" if label == "direct" else "bench",
                "messages": [{"role": "user", "content": "the quick brown fox"}],
                "stream": stream,
                "max_tokens": chunks + 8,
            }
        ).encode()
        for concurrency in CONCURRENCY:
            n = max(200, total // 4) if concurrency == 1 else total
            await _load(url, headers, body, concurrency, min(n, 200), stream)  # warm-up
            cpu0 = _cpu_seconds(pid) if pid else 0.0
            elapsed, lat = await _load(url, headers, body, concurrency, n, stream)
            cpu = (_cpu_seconds(pid) - cpu0) / n * 1000 if pid else None
            lat.sort()
            results.append(
                Result(
                    label,
                    concurrency,
                    stream,
                    n / elapsed,
                    statistics.median(lat) * 1000,
                    lat[int(len(lat) * 0.99) - 1] * 1000,
                    cpu,
                )
            )
    return results


def _start_gateway(
    mock_url: str, chunks: int, keyed: bool, prefix: str
) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    config = Path(tempfile.mkdtemp()) / "bench.toml"
    config.write_text(f"""
[server]
host = "127.0.0.1"
port = {port}
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


async def _wait_ready(root: str) -> None:
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


async def _high_limit_key(prefix: str) -> str:
    redis = Redis.from_url(REDIS_URL)
    secret, _ = await KeyStore(redis, prefix=prefix).create(
        KeyCreate(name="bench", budget_tokens=10**12, rpm=10**8, tpm=10**11, max_concurrency=10**5)
    )
    await redis.aclose()
    return secret


async def _drop_prefix(prefix: str) -> None:
    redis = Redis.from_url(REDIS_URL)
    keys = [k async for k in redis.scan_iter(match=f"{prefix}*", count=1000)]
    if keys:
        await redis.delete(*keys)
    await redis.aclose()


def _print(results: list[Result], chunks: int) -> None:
    direct = {(r.concurrency, r.stream): r for r in results if r.label == "direct"}
    print(
        f"\n{'path':8} {'conc':>4} {'mode':6} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} "
        f"{'added p50':>10} {'gw cpu ms/req':>14}"
    )
    for r in results:
        base = direct[(r.concurrency, r.stream)]
        added = "" if r.label == "direct" else f"{r.p50_ms - base.p50_ms:10.3f}"
        cpu = "" if r.cpu_per_req_ms is None else f"{r.cpu_per_req_ms:14.3f}"
        print(
            f"{r.label:8} {r.concurrency:4d} {'stream' if r.stream else 'json':6} "
            f"{r.rps:9.0f} {r.p50_ms:8.3f} {r.p99_ms:8.3f} {added:>10} {cpu:>14}"
        )
    by = {(r.label, r.concurrency, r.stream): r for r in results}

    def verdict(ok: bool) -> str:
        return "met" if ok else "NOT met"

    print("\nTargets:")
    for label in ("open", "keyed"):
        added = by[(label, 1, False)].p50_ms - by[("direct", 1, False)].p50_ms
        best = max(by[(label, c, False)].rps for c in CONCURRENCY)
        cpu_json = by[(label, 1, False)].cpu_per_req_ms or 0.0
        cpu_stream = by[(label, 1, True)].cpu_per_req_ms or 0.0
        per_chunk_us = (cpu_stream - cpu_json) / chunks * 1000
        print(f"  [{label}] added p50 at c=1: {added:.3f} ms (< 1 ms: {verdict(added < 1)})")
        print(
            f"  [{label}] non-streaming throughput: {best:.0f} req/s "
            f"(>= 1500: {verdict(best >= 1500)})"
        )
        print(
            f"  [{label}] streaming CPU per chunk: {per_chunk_us:.1f} us "
            f"(< 50 us: {verdict(per_chunk_us < 50)})"
        )
    acc = by[("keyed", 1, False)].p50_ms - by[("open", 1, False)].p50_ms
    drop = 1 - (
        max(by[("keyed", c, False)].rps for c in CONCURRENCY)
        / max(by[("open", c, False)].rps for c in CONCURRENCY)
    )
    print(
        f"  auth + admission + settlement p50 at c=1: {acc:.3f} ms (< 0.5 ms: {verdict(acc < 0.5)})"
    )
    print(f"  keyed vs open peak throughput drop: {drop:.1%} (< 20%: {verdict(drop < 0.2)})")


async def _through_gateway(
    label: str, mock_url: str, prefix: str, args: argparse.Namespace
) -> list[Result]:
    proc, root = _start_gateway(mock_url, args.chunks, label == "keyed", prefix)
    try:
        await _wait_ready(root)
        headers = {"Content-Type": "application/json"}
        if label == "keyed":
            headers["Authorization"] = f"Bearer {await _high_limit_key(prefix)}"
        url = f"{root}/v1/chat/completions"
        return await _measure(label, url, headers, args.chunks, args.requests, proc.pid)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


def _medians(runs: list[Result]) -> list[Result]:
    """One Result per (path, concurrency, mode): the median of each figure over the runs."""
    groups: dict[tuple[str, int, bool], list[Result]] = {}
    for r in runs:
        groups.setdefault((r.label, r.concurrency, r.stream), []).append(r)
    out = []
    for (label, concurrency, stream), rs in groups.items():
        cpus = [r.cpu_per_req_ms for r in rs if r.cpu_per_req_ms is not None]
        out.append(
            Result(
                label,
                concurrency,
                stream,
                statistics.median(r.rps for r in rs),
                statistics.median(r.p50_ms for r in rs),
                statistics.median(r.p99_ms for r in rs),
                statistics.median(cpus) if cpus else None,
            )
        )
    return out


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=3000, help="requests per level")
    parser.add_argument("--chunks", type=int, default=20, help="chunks per streamed answer")
    parser.add_argument("--repeat", type=int, default=3, help="runs per path; medians reported")
    args = parser.parse_args()

    ctx = mp.get_context("spawn")
    queue: mp.Queue = ctx.Queue()  # type: ignore[type-arg]
    mock_proc = ctx.Process(target=_run_mock, args=(queue,), daemon=True)
    mock_proc.start()
    mock_url = queue.get(timeout=30)
    runs: list[Result] = []
    prefix = f"bench:{uuid.uuid4().hex}:"
    try:
        for _ in range(args.repeat):  # the three paths alternate, so drift hits them alike
            runs += await _measure(
                "direct", f"{mock_url}/chat/completions", {}, args.chunks, args.requests, None
            )
            for label in ("open", "keyed"):
                runs += await _through_gateway(label, mock_url, prefix, args)
    finally:
        mock_proc.terminate()
        await _drop_prefix(prefix)
    results = _medians(runs)
    print(
        f"cpus={os.cpu_count()} requests/level={args.requests} chunks={args.chunks} "
        f"repeat={args.repeat} (medians; mock, gateway, Redis and load generator share the cores)"
    )
    _print(results, args.chunks)


if __name__ == "__main__":
    asyncio.run(main())
