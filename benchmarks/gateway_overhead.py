"""What the gateway adds on top of its upstream, measured side by side in one run.

Paths: `direct` (the load generator to the upstream), `open` (a gateway with auth.enabled =
false: no key, limits or usage records), `keyed` (a real key with budget, rpm, tpm and
concurrency limits set high: auth + admission + settlement on Redis) and `keyed2` (the keyed
gateway with `[server] workers = 2`). Each gateway is `python -m gateway serve` in processes of
its own, started once. Every path is measured at concurrency 1, 16 and 64, non-streaming and
streaming (20-chunk answers), with the same request.

Tools (`--tools auto`, the default: native when both are installed): the load generator is
`wrk` and the JSON upstream is nginx answering the Python mock's exact bytes; streamed answers
always come from the Python mock (one write per frame). With `--tools python` (or without wrk
and nginx) the aiohttp load generator and the Python mock do it all, as before: they then spend
as much CPU per request as the gateway, which bounds what a second worker can add on 2 cores.
Install the native ones with `apt-get install -y wrk nginx-light`; `--tools native` fails when
they are missing. Both kinds measure the direct path too, in the same run.

The machine's speed drifts (shared host, 2 cores that the upstreams, the gateways, Redis and the
load generator share), so paths are compared within rounds: every round runs one burst per
(concurrency, mode) on each path back to back, in an order that rotates from round to round;
each comparison (added latency, keyed vs open, 2 workers vs 1) is taken within its round, and
medians over the rounds are printed with the range of the per-round figures. CPU per request of
each process on the path (gateway, Redis from INFO cpu, upstream, load generator) is measured
per burst: it drifts far less than wall-clock figures, and it bounds throughput: with N cores,
a path can serve at most N / (total CPU per request) requests/s, printed beside the 2-worker
ratio.

Targets, printed last: CPU per request at c=64 (auth off: <= 0.35 ms JSON, <= 0.5 ms per
20-chunk stream; keyed with every limit on: <= 0.5 ms JSON including Redis's CPU), keyed added
p50 at one client <= 0.5 ms, idle memory <= 80 MB, keyed peak throughput with 2 workers >= 1.6x
one worker's. The machine's load average is printed beside them, with the share of the run's CPU
time that the host stole (a virtual machine's neighbours: figures from a run with more than a
few percent stolen are theirs as much as ours), and so is the round trip of one admission made
alone from one client: the share of the keyed added latency that is Redis's.

    .venv/bin/python benchmarks/gateway_overhead.py [--tools auto|native|python] [--seconds 2]
        [--requests 1500] [--chunks 20] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

from redis.asyncio import Redis

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.gateway_report import Rounds, Target, print_cpu_split, print_table  # noqa: E402
from testkit import wrk_load  # noqa: E402
from testkit.gateway_procs import (  # noqa: E402
    REDIS_URL,
    STREAM_MODEL,
    Nginx,
    admission_round_trip_ms,
    drop_prefix,
    high_limit_key,
    mock_answer,
    start_gateway,
    start_python_mock,
    stop_gateways,
    wait_ready,
)
from testkit.http_load import (  # noqa: E402
    REFERENCE_SPEED_S,
    Bench,
    Burst,
    Endpoint,
    Level,
    Upstreams,
    cpu_jiffies,
    python_speed_s,
    rss_mb,
    stolen_share,
)

CONCURRENCY = (1, 16, 64)
PATHS = ("direct", "open", "keyed", "keyed2")  # keyed2: the keyed gateway with 2 workers
LEVELS = [Level(c, stream) for stream in (False, True) for c in CONCURRENCY]


Round = dict[tuple[str, Level], Burst]


def _peak(r: Round, label: str) -> float:
    return max(r[(label, Level(c, False))].rps for c in CONCURRENCY)


def _latency_targets(rounds: Rounds, chunks: int) -> list[Target]:
    """Added latency at one client, peak throughput, streaming CPU per chunk, and what keys and
    limits add to the open path (2-core machine)."""
    json1, stream1 = Level(1, False), Level(1, True)
    targets = []
    for label in ("open", "keyed"):

        def per_chunk_us(r: Round, label: str = label) -> float:
            cpu_json = r[(label, json1)].gateway_cpu_ms or 0.0
            return ((r[(label, stream1)].gateway_cpu_ms or 0.0) - cpu_json) / chunks * 1000

        added = [r[(label, json1)].p50_ms - r[("direct", json1)].p50_ms for r in rounds]
        targets += [
            Target(f"[{label}] added p50 at c=1", " ms", 1.0, True, added),
            Target(
                f"[{label}] non-streaming throughput",
                " req/s",
                1500,
                False,
                [_peak(r, label) for r in rounds],
            ),
            Target(
                f"[{label}] streaming CPU per chunk",
                " us",
                50,
                True,
                list(map(per_chunk_us, rounds)),
            ),
        ]
    return targets + [
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
            [100 * (1 - _peak(r, "keyed") / _peak(r, "open")) for r in rounds],
        ),
    ]


def _cpu_targets(rounds: Rounds, idle_mb: float) -> list[Target]:
    """CPU per request at c=64 (where the machine is saturated and CPU bounds throughput; the
    gateway's own processes, Redis added for keyed), added p50 at one client, idle memory, and
    keyed throughput with 2 workers against 1."""
    json64, stream64, json1 = Level(64, False), Level(64, True), Level(1, False)

    def cpu(label: str, level: Level, redis: bool) -> Callable[[Round], float]:
        def get(r: Round) -> float:
            b = r[(label, level)]
            return (b.gateway_cpu_ms or 0.0) + (b.redis_cpu_ms if redis else 0.0)

        return get

    return [
        Target(
            "[open] CPU per json request",
            " ms",
            0.35,
            True,
            [*map(cpu("open", json64, False), rounds)],
        ),
        Target(
            "[open] CPU per 20-chunk stream",
            " ms",
            0.5,
            True,
            [*map(cpu("open", stream64, False), rounds)],
        ),
        Target(
            "[keyed] CPU per json request, gateway + Redis",
            " ms",
            0.5,
            True,
            [*map(cpu("keyed", json64, True), rounds)],
        ),
        Target(
            "[keyed] added p50 at c=1",
            " ms",
            0.5,
            True,
            [r[("keyed", json1)].p50_ms - r[("direct", json1)].p50_ms for r in rounds],
        ),
        Target("idle memory of the open gateway (no engine)", " MB", 80, True, [idle_mb]),
        Target(
            "[keyed] peak json throughput, 2 workers / 1 worker",
            "x",
            1.6,
            False,
            [_peak(r, "keyed2") / _peak(r, "keyed") for r in rounds],
        ),
    ]


async def _gateway(
    label: str, upstreams: tuple[str, str], prefix: str, chunks: int, redis: Redis
) -> tuple[subprocess.Popen[bytes], Endpoint, float]:
    """The gateway of `label`, its endpoint, and its resident memory once settled (MB)."""
    keyed, workers = label.startswith("keyed"), 2 if label == "keyed2" else 1
    proc, root = start_gateway(*upstreams, chunks, keyed, prefix, workers)
    await wait_ready(root, workers)
    await asyncio.sleep(1.0)  # settled after start-up, before a request: its idle memory
    idle = rss_mb(proc.pid)
    headers = {"Content-Type": "application/json"}
    if keyed:
        headers["Authorization"] = f"Bearer {await high_limit_key(redis, prefix)}"
    url = f"{root}/v1/chat/completions"
    return proc, Endpoint(label, url, url, headers, "bench", STREAM_MODEL, proc.pid), idle


async def _run(
    args: argparse.Namespace, native: bool, redis: Redis, prefix: str
) -> tuple[Rounds, float]:
    mock_proc, mock_url = start_python_mock()
    nginx = Nginx(mock_answer(args.chunks)) if native else None
    procs: list[subprocess.Popen[bytes]] = []
    bench: Bench | None = None
    try:
        json_url = mock_url
        upstreams = Upstreams(stream_pids=[mock_proc.pid or 0], json_pids=[mock_proc.pid or 0])
        if nginx is not None:
            nginx.start()
            json_url, upstreams.json_pids = nginx.base_url, [nginx.pid]
        model = f"echo-chunks-{args.chunks}"
        headers = {"Content-Type": "application/json"}
        paths = {
            "direct": Endpoint(
                "direct",
                f"{json_url}/chat/completions",
                f"{mock_url}/chat/completions",
                headers,
                model,
                model,
                None,
            )
        }
        idle = 0.0
        for label in PATHS[1:]:
            proc, paths[label], rss = await _gateway(
                label, (json_url, mock_url), prefix, args.chunks, redis
            )
            procs.append(proc)
            idle = rss if label == "open" else idle
        bench = Bench(
            redis,
            upstreams,
            chunks=args.chunks,
            native=native,
            requests=args.requests,
            seconds=args.seconds,
        )
        for level in LEVELS:
            for label in PATHS:
                await bench.warm(paths[label], level)
        rounds: Rounds = []
        for i in range(args.rounds):
            bursts: Round = {}
            for j, level in enumerate(LEVELS):
                shift = (i + j) % len(PATHS)
                for label in PATHS[shift:] + PATHS[:shift]:
                    bursts[(label, level)] = await bench.burst(paths[label], level)
            rounds.append(bursts)
            print(f"round {i + 1}/{args.rounds} done", file=sys.stderr)
        return rounds, idle
    finally:
        if bench is not None:
            await bench.close()
        stop_gateways(procs)
        if nginx is not None:
            nginx.stop()
        mock_proc.terminate()


def _tools(choice: str) -> bool:
    """True for the native tools (wrk, nginx); exits when they are asked for but missing."""
    found = wrk_load.available() and Nginx.available()
    if choice == "native" and not found:
        sys.exit("--tools native needs wrk and nginx: apt-get install -y wrk nginx-light")
    if choice == "auto" and not found:
        print(
            "wrk or nginx not found: the Python load generator and mock are used, and their CPU "
            "bounds the 2-worker ratio (apt-get install -y wrk nginx-light)",
            file=sys.stderr,
        )
    return found and choice != "python"


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tools", choices=("auto", "native", "python"), default="auto")
    parser.add_argument("--seconds", type=float, default=2.0, help="seconds per wrk burst")
    parser.add_argument("--requests", type=int, default=1500, help="requests per Python burst")
    parser.add_argument("--chunks", type=int, default=20, help="chunks per streamed answer")
    parser.add_argument("--rounds", type=int, default=5, help="rounds; medians reported")
    args = parser.parse_args()
    native = _tools(args.tools)
    speed_before = python_speed_s()
    load_before, jiffies_before = os.getloadavg(), cpu_jiffies()
    prefix = f"bench:{uuid.uuid4().hex}:"
    redis = Redis.from_url(REDIS_URL)
    try:
        rounds, idle_mb = await _run(args, native, redis, prefix)
        admission_ms = await admission_round_trip_ms(redis, prefix)
    finally:
        await drop_prefix(redis, prefix)
        await redis.aclose()
    tools = "wrk + nginx (JSON) + Python mock (streams)" if native else "Python load + Python mock"
    print(
        f"cpus={os.cpu_count()} tools: {tools}; bursts of "
        f"{f'{args.seconds:g} s' if native else f'{args.requests} requests'}, chunks={args.chunks} "
        f"rounds={args.rounds} (medians over rounds; everything shares the cores)"
    )
    print_table(rounds, PATHS, LEVELS)
    print_cpu_split(rounds, PATHS, Level(64, False), os.cpu_count() or 1)
    print("\nLatency targets (median over rounds, and the range of the per-round figures):")
    for target in _latency_targets(rounds, args.chunks):
        print(target.line())
    load = f"load average before/after: {load_before} / {os.getloadavg()}"
    stolen = stolen_share(jiffies_before, cpu_jiffies())
    speed = f"{speed_before:.2f} s before, {python_speed_s():.2f} s after"
    print(f"\nCPU and memory targets ({load}; stolen by the host: {stolen:.1%} of CPU time):")
    print(
        f"  (machine speed: a 10M-step Python loop took {speed}; {REFERENCE_SPEED_S} s where "
        "the CPU targets were met: CPU figures scale with it)"
    )
    for target in _cpu_targets(rounds, idle_mb):
        print(target.line())
    print(
        f"  (one admission alone, from one client, is {admission_ms:.3f} ms of Redis round trip: "
        "a keyed request waits for it before its upstream call)"
    )


if __name__ == "__main__":
    asyncio.run(main())
