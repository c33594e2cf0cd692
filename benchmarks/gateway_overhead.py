"""What the gateway adds on top of its upstream, measured side by side in one run.

A mock upstream (answers at once, streams N chunks) runs in its own process; two gateways run in
processes of their own (`python -m gateway serve`), both started once: `open` (auth.enabled =
false: no key, limits or usage records) and `keyed` (a real key with limits set high: auth +
admission + settlement on Redis). A bounded load generator on 127.0.0.1 measures direct-to-mock
and through each gateway at concurrency 1, 16 and 64, non-streaming and streaming.

The machine's speed drifts by up to 2x over minutes (shared host, 2 cores that the mock, both
gateways, Redis and the load generator share), so the paths are compared within rounds: every
round runs one burst per (concurrency, mode) on each path back to back, in an order that rotates
from round to round, and each comparison (added latency, keyed vs open throughput) is taken within
its round; the figures printed are medians over the rounds, with the range of the per-round
figures beside the targets. CPU seconds per request of each gateway process and of Redis (INFO
cpu) are measured per burst: they drift far less than wall-clock figures.

A fourth path, `keyed2`, is the keyed gateway run with `[server] workers = 2` (its CPU is the
supervisor's and its workers'). The open gateway's idle memory is read once it is ready.

Issue-14 targets, printed last: CPU per request at c=64 (auth off: <= 0.35 ms JSON, <= 0.5 ms per
20-chunk stream; keyed with every limit on: <= 0.5 ms JSON including Redis's CPU), keyed added
p50 at one client <= 0.5 ms, idle memory <= 80 MB, keyed peak throughput with 2 workers >= 1.6x
one worker's. The machine's load average is printed beside them.

Earlier targets (2-core machine): added p50 < 1 ms at concurrency 1; >= 1,500 non-streaming
requests/s through one gateway process; streaming adds < 50 us per chunk; with keys, auth +
admission + settlement add < 0.5 ms p50 at concurrency 1 and throughput drops < 20% against `open`.

    .venv/bin/python benchmarks/gateway_overhead.py [--requests 1500] [--chunks 20] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import signal
import statistics
import subprocess
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from redis.asyncio import Redis

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.gateway_procs import (  # noqa: E402
    REDIS_URL,
    drop_prefix,
    high_limit_key,
    run_mock,
    start_gateway,
    wait_ready,
)
from benchmarks.http_load import Bench, Burst, Endpoint, Level, rss_mb  # noqa: E402

CONCURRENCY = (1, 16, 64)
IDLE_RSS_MB: list[float] = []
LOAD: list[tuple[float, float, float]] = []  # the open gateway's, once ready and before any request
PATHS = ("direct", "open", "keyed", "keyed2")  # keyed2: the keyed gateway with 2 workers


@dataclass
class Target:
    name: str
    unit: str
    limit: float
    below: bool  # met when the figure is below the limit (else at or above it)
    rounds: list[float]

    def line(self) -> str:
        value = statistics.median(self.rounds)
        met = value < self.limit if self.below else value >= self.limit
        spread = f"rounds {min(self.rounds):.{self._digits}f}..{max(self.rounds):.{self._digits}f}"
        sign = "<" if self.below else ">="
        return (
            f"  {self.name}: {value:.{self._digits}f}{self.unit} ({spread}; "
            f"{sign} {self.limit:g}{self.unit}: {'met' if met else 'NOT met'})"
        )

    @property
    def _digits(self) -> int:
        return {" ms": 3, "x": 2}.get(self.unit, 1)


Rounds = list[dict[tuple[str, Level], Burst]]


def _median_burst(rounds: Rounds, label: str, level: Level) -> Burst:
    bursts = [r[(label, level)] for r in rounds]

    def med(get: Callable[[Burst], float | None]) -> float | None:
        values = [v for v in map(get, bursts) if v is not None]
        return statistics.median(values) if values else None

    return Burst(
        med(lambda b: b.rps) or 0.0,
        med(lambda b: b.p50_ms) or 0.0,
        med(lambda b: b.p99_ms) or 0.0,
        med(lambda b: b.gateway_cpu_ms),
        med(lambda b: b.redis_cpu_ms) or 0.0,
    )


def _print_table(rounds: Rounds, levels: list[Level]) -> None:
    print(
        f"\n{'path':8} {'conc':>4} {'mode':6} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} "
        f"{'added p50':>10} {'gw cpu ms/req':>14} {'redis cpu ms/req':>17} {'req/s vs direct':>16}"
    )
    for label in PATHS:
        for level in levels:
            b = _median_burst(rounds, label, level)
            added = [
                r[(label, level)].p50_ms - r[("direct", level)].p50_ms
                for r in rounds
                if label != "direct"
            ]
            added_s = f"{statistics.median(added):10.3f}" if added else ""
            cpu = "" if b.gateway_cpu_ms is None else f"{b.gateway_cpu_ms:14.3f}"
            ratio = b.rps / _median_burst(rounds, "direct", level).rps
            print(
                f"{label:8} {level.concurrency:4d} {level.mode:6} {b.rps:9.0f} {b.p50_ms:8.3f} "
                f"{b.p99_ms:8.3f} {added_s:>10} {cpu:>14} {b.redis_cpu_ms:17.3f} {ratio:16.2f}"
            )


def _targets(rounds: Rounds, chunks: int) -> list[Target]:
    json1, stream1 = Level(1, False), Level(1, True)

    def peak(r: dict[tuple[str, Level], Burst], label: str) -> float:
        return max(r[(label, Level(c, False))].rps for c in CONCURRENCY)

    def per_chunk_us(r: dict[tuple[str, Level], Burst], label: str) -> float:
        cpu_json = r[(label, json1)].gateway_cpu_ms or 0.0
        cpu_stream = r[(label, stream1)].gateway_cpu_ms or 0.0
        return (cpu_stream - cpu_json) / chunks * 1000

    targets = []
    for label in ("open", "keyed"):
        added = [r[(label, json1)].p50_ms - r[("direct", json1)].p50_ms for r in rounds]
        targets += [
            Target(f"[{label}] added p50 at c=1", " ms", 1.0, True, added),
            Target(
                f"[{label}] non-streaming throughput",
                " req/s",
                1500,
                False,
                [peak(r, label) for r in rounds],
            ),
            Target(
                f"[{label}] streaming CPU per chunk",
                " us",
                50,
                True,
                [per_chunk_us(r, label) for r in rounds],
            ),
        ]
    targets += [
        Target(
            "auth + admission + settlement p50 at c=1 (keyed - open, within each round)",
            " ms",
            0.5,
            True,
            [r[("keyed", json1)].p50_ms - r[("open", json1)].p50_ms for r in rounds],
        ),
        Target(
            "keyed vs open peak throughput drop (within each round)",
            "%",
            20,
            True,
            [100 * (1 - peak(r, "keyed") / peak(r, "open")) for r in rounds],
        ),
    ]
    return targets


def _issue14_targets(rounds: Rounds) -> list[Target]:
    """CPU per request at c=64 (where the machine is saturated and CPU bounds throughput; the
    gateway's own process, Redis added for keyed), added p50 at one client, idle memory, and
    keyed throughput with 2 workers against 1."""
    json64, stream64, json1 = Level(64, False), Level(64, True), Level(1, False)

    def cpu(r: dict[tuple[str, Level], Burst], label: str, level: Level, redis: bool) -> float:
        b = r[(label, level)]
        return (b.gateway_cpu_ms or 0.0) + (b.redis_cpu_ms if redis else 0.0)

    def peak(r: dict[tuple[str, Level], Burst], label: str) -> float:
        return max(r[(label, Level(c, False))].rps for c in CONCURRENCY)

    return [
        Target(
            "[open] CPU per json request",
            " ms",
            0.35,
            True,
            [cpu(r, "open", json64, False) for r in rounds],
        ),
        Target(
            "[open] CPU per 20-chunk stream",
            " ms",
            0.5,
            True,
            [cpu(r, "open", stream64, False) for r in rounds],
        ),
        Target(
            "[keyed] CPU per json request, gateway + Redis",
            " ms",
            0.5,
            True,
            [cpu(r, "keyed", json64, True) for r in rounds],
        ),
        Target(
            "[keyed] added p50 at c=1",
            " ms",
            0.5,
            True,
            [r[("keyed", json1)].p50_ms - r[("direct", json1)].p50_ms for r in rounds],
        ),
        Target("idle memory of the open gateway (no engine)", " MB", 80, True, IDLE_RSS_MB),
        Target(
            "[keyed] peak json throughput, 2 workers / 1 worker",
            "x",
            1.6,
            False,
            [peak(r, "keyed2") / peak(r, "keyed") for r in rounds],
        ),
    ]


def _print_cpu_cost(rounds: Rounds) -> None:
    """What keys cost in CPU per request, gateway and Redis together: a steadier figure than
    throughput, and what bounds it once the machine is saturated."""
    level = Level(64, False)
    open_ = _median_burst(rounds, "open", level)
    keyed = _median_burst(rounds, "keyed", level)
    open_total = (open_.gateway_cpu_ms or 0.0) + open_.redis_cpu_ms
    keyed_total = (keyed.gateway_cpu_ms or 0.0) + keyed.redis_cpu_ms
    print(
        f"\nCPU per request at c=64, json (gateway + Redis): open {open_total:.3f} ms, keyed "
        f"{keyed_total:.3f} ms ({keyed.gateway_cpu_ms or 0.0:.3f} + {keyed.redis_cpu_ms:.3f}); "
        f"keys add {keyed_total - open_total:.3f} ms = {keyed_total / open_total - 1:.1%}"
    )


async def _gateway(
    label: str, mock_url: str, prefix: str, chunks: int, redis: Redis
) -> tuple[subprocess.Popen[bytes], Endpoint]:
    keyed = label.startswith("keyed")
    workers = 2 if label == "keyed2" else 1
    proc, root = start_gateway(mock_url, chunks, keyed, prefix, workers)
    await wait_ready(root)
    if label == "open":
        await asyncio.sleep(1.0)  # settled after start-up, before a request: its idle memory
        IDLE_RSS_MB.append(rss_mb(proc.pid))
    headers = {"Content-Type": "application/json"}
    if keyed:
        headers["Authorization"] = f"Bearer {await high_limit_key(redis, prefix)}"
    return proc, Endpoint(label, f"{root}/v1/chat/completions", headers, "bench", proc.pid)


async def _run(args: argparse.Namespace, mock_url: str, redis: Redis, prefix: str) -> Rounds:
    direct = Endpoint(
        "direct",
        f"{mock_url}/chat/completions",
        {"Content-Type": "application/json"},
        f"echo-chunks-{args.chunks}",
        None,
    )
    procs: list[subprocess.Popen[bytes]] = []
    bench = Bench(redis, args.chunks, args.requests)
    try:
        paths = {"direct": direct}
        for label in PATHS[1:]:
            proc, path = await _gateway(label, mock_url, prefix, args.chunks, redis)
            procs.append(proc)
            paths[label] = path
        levels = [Level(c, stream) for stream in (False, True) for c in CONCURRENCY]
        for level in levels:
            for label in PATHS:
                await bench.warm(paths[label], level)
        rounds: Rounds = []
        for i in range(args.rounds):
            bursts: dict[tuple[str, Level], Burst] = {}
            for j, level in enumerate(levels):
                shift = (i + j) % len(PATHS)
                for label in PATHS[shift:] + PATHS[:shift]:
                    bursts[(label, level)] = await bench.burst(paths[label], level)
            rounds.append(bursts)
            print(f"round {i + 1}/{args.rounds} done", file=sys.stderr)
        return rounds
    finally:
        await bench.close()
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            proc.wait(timeout=30)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=1500, help="requests per burst")
    parser.add_argument("--chunks", type=int, default=20, help="chunks per streamed answer")
    parser.add_argument("--rounds", type=int, default=5, help="rounds; medians reported")
    args = parser.parse_args()
    LOAD.append(os.getloadavg())

    ctx = mp.get_context("spawn")
    queue: mp.Queue = ctx.Queue()  # type: ignore[type-arg]
    mock_proc = ctx.Process(target=run_mock, args=(queue,), daemon=True)
    mock_proc.start()
    mock_url = queue.get(timeout=30)
    prefix = f"bench:{uuid.uuid4().hex}:"
    redis = Redis.from_url(REDIS_URL)
    try:
        rounds = await _run(args, mock_url, redis, prefix)
    finally:
        mock_proc.terminate()
        await drop_prefix(redis, prefix)
        await redis.aclose()
    levels = [Level(c, stream) for stream in (False, True) for c in CONCURRENCY]
    print(
        f"cpus={os.cpu_count()} requests/burst={args.requests} chunks={args.chunks} "
        f"rounds={args.rounds} (medians over rounds; mock, both gateways, Redis and the load "
        "generator share the cores)"
    )
    _print_table(rounds, levels)
    _print_cpu_cost(rounds)
    print("\nTargets (median over rounds, and the range of the per-round figures):")
    for target in _targets(rounds, args.chunks):
        print(target.line())
    print(f"\nIssue 14 targets (load average before/after: {LOAD[0]} / {os.getloadavg()}):")
    for target in _issue14_targets(rounds):
        print(target.line())


if __name__ == "__main__":
    asyncio.run(main())
