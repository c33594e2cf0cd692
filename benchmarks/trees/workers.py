"""Keyed JSON throughput of one and two workers, for two or more source trees, in one run.

Each tree (a checkout, e.g. `git worktree add /tmp/before HEAD~1`) serves a keyed gateway (a key
with budget, rpm, tpm and concurrency limits set high) with `[server] workers = 1` and another
with `workers = 2`, all against one nginx upstream and the shared Redis. Every round runs one
wrk burst at `--connections` clients on each gateway, in an order that rotates from round to
round, and one at a single client on each one-worker gateway (its p50). Printed, medians over
the rounds: req/s and the CPU per request of the gateway, Redis, nginx and wrk; each tree's
per-round 2 workers / 1 ratio; and each tree's per-round req/s against the first tree's, for the
same number of workers.

Unlike `compare_trees.py pinned`, nothing is pinned: everything shares the cores, as in
`gateway_overhead.py`, so that what a change does to the processes beside the gateway (the load
generator, the upstream, Redis) is measured too. Bursts taken seconds apart still differ by a
quarter on a drifting machine: compare medians of 8 or more rounds.

    .venv/bin/python benchmarks/compare_trees.py workers TREE TREE [TREE...] [--rounds 8]
        [--seconds 2] [--connections 64]

Needs wrk and nginx (apt-get install -y wrk nginx-light) and the shared Redis.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import uuid
from pathlib import Path

from redis.asyncio import Redis

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from testkit import wrk_load  # noqa: E402
from testkit.gateway_procs import (  # noqa: E402
    REDIS_URL,
    Nginx,
    high_limit_key,
    mock_answer,
    start_gateway,
    start_python_mock,
    tear_down,
    wait_ready,
)
from testkit.http_load import (  # noqa: E402
    cpu_seconds,
    own_cpu_seconds,
    process_tree,
    redis_cpu_seconds,
)

FIGURES = ("req/s", "gateway ms", "redis ms", "nginx ms", "wrk ms")
Gateway = tuple[str, int]  # (tree, workers)


async def _burst(
    redis: Redis,
    nginx: Nginx,
    proc: subprocess.Popen[bytes],
    url: str,
    lua: Path,
    clients: int,
    seconds: float,
) -> tuple[tuple[float, ...], float]:
    """(req/s and the CPU per request of each process, in FIGURES' order), p50 ms."""
    pids = process_tree(proc.pid)
    gateway0, nginx0 = sum(map(own_cpu_seconds, pids)), cpu_seconds(nginx.pid)
    redis0 = await redis_cpu_seconds(redis)
    result = await asyncio.to_thread(wrk_load.run, url, lua, clients, seconds)
    n = result.requests
    figures = (
        n / result.seconds,
        (sum(map(own_cpu_seconds, pids)) - gateway0) / n * 1000,
        (await redis_cpu_seconds(redis) - redis0) / n * 1000,
        (cpu_seconds(nginx.pid) - nginx0) / n * 1000,
        result.cpu_s / n * 1000,
    )
    return figures, result.p50_ms


def _report(
    trees: list[str], loaded: dict[Gateway, list[tuple[float, ...]]], p50: dict[str, list[float]]
) -> None:
    print(f"{'tree':40} workers " + " ".join(f"{f:>11}" for f in FIGURES) + "  p50 at 1 client")
    for tree in trees:
        for workers in (1, 2):
            rounds = loaded[(tree, workers)]
            medians = [statistics.median(r[i] for r in rounds) for i in range(len(FIGURES))]
            line = f"{tree:40} {workers:>7} {medians[0]:>11.0f} "
            line += " ".join(f"{m:>11.4f}" for m in medians[1:])
            if workers == 1:
                line += f"  {statistics.median(p50[tree]):.3f} ms"
            print(line)

    def ratios(a: list[tuple[float, ...]], b: list[tuple[float, ...]]) -> str:
        each = [x[0] / y[0] for x, y in zip(a, b, strict=True)]
        return f"{statistics.median(each):.3f}  ({' '.join(f'{r:.2f}' for r in each)})"

    for tree in trees:
        print(f"{tree:40} 2 workers / 1: {ratios(loaded[(tree, 2)], loaded[(tree, 1)])}")
    for tree in trees[1:]:
        for workers in (1, 2):
            against = ratios(loaded[(tree, workers)], loaded[(trees[0], workers)])
            print(f"{tree:40} req/s / the first tree's, {workers} worker(s): {against}")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("trees", nargs="+", type=Path)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--connections", type=int, default=64)
    args = parser.parse_args()
    if not (wrk_load.available() and Nginx.available()):
        sys.exit("needs wrk and nginx: apt-get install -y wrk nginx-light")
    trees = [str(tree.resolve()) for tree in args.trees]
    prefix = f"bench:{uuid.uuid4().hex}:"
    redis = Redis.from_url(REDIS_URL)
    mock_proc, mock_url = start_python_mock()
    nginx = Nginx(mock_answer(20))
    nginx.start()
    gateways: dict[Gateway, tuple[subprocess.Popen[bytes], str]] = {}
    try:
        for tree in trees:
            for workers in (1, 2):
                proc, root = start_gateway(
                    nginx.base_url, mock_url, 20, True, prefix, workers, tree=Path(tree)
                )
                gateways[(tree, workers)] = (proc, f"{root}/v1/chat/completions")
                await wait_ready(root, workers)
        body = {
            "model": "bench",
            "messages": [{"role": "user", "content": "the quick brown fox"}],
            "max_tokens": 28,
        }
        headers = {
            "Content-Type": "application/json",
            "Authorization": f"Bearer {await high_limit_key(redis, prefix)}",
        }
        lua = wrk_load.script(json.dumps(body).encode(), headers)
        for _, url in gateways.values():  # warm: connections, caches
            await asyncio.to_thread(wrk_load.run, url, lua, args.connections, 1.0)
        loaded: dict[Gateway, list[tuple[float, ...]]] = {g: [] for g in gateways}
        p50: dict[str, list[float]] = {tree: [] for tree in trees}
        order = list(gateways)
        for i in range(args.rounds):
            shift = i % len(order)
            for gateway in order[shift:] + order[:shift]:
                proc, url = gateways[gateway]
                figures, _ = await _burst(
                    redis, nginx, proc, url, lua, args.connections, args.seconds
                )
                loaded[gateway].append(figures)
                if gateway[1] == 1:
                    _, one = await _burst(redis, nginx, proc, url, lua, 1, args.seconds / 2)
                    p50[gateway[0]].append(one)
            print(f"round {i + 1}/{args.rounds} done", file=sys.stderr)
        print(
            f"keyed json, {args.connections} clients, {args.rounds} rounds of {args.seconds:g} s "
            "(medians; CPU per request in ms; everything shares the cores)"
        )
        _report(trees, loaded, p50)
    finally:
        await tear_down((proc for proc, _ in gateways.values()), nginx, mock_proc, redis, prefix)


if __name__ == "__main__":
    asyncio.run(main())
