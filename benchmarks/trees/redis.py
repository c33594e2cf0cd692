"""Redis's CPU per keyed request (one admission and one settlement) of two source trees, side by
side in one run.

Each tree (a checkout, e.g. `git worktree add /tmp/before HEAD~1`) drives its own
`RedisAccessControl` in a process of its own: `--tasks` concurrent requests, each admitted,
then settled, as the gateway does them, against one key with every limit on. Rounds alternate
between the trees; Redis's CPU (`INFO cpu`, its main thread) over each round is divided by the
requests the round made. Printed: each tree's figure per round and the median, and each tree's
per-round ratio to the first tree's.

    .venv/bin/python benchmarks/compare_trees.py redis TREE TREE [--rounds 6] [--requests 12800]
        [--tasks 64] [--maxlen 1000000]

`--maxlen`: the usage stream's cap (`limits.usage_stream_maxlen`; the default is the setting's).
The rounds write `requests` records each, so a cap below that has the stream full, and trimmed
by every settlement, from the first round on: a gateway's steady state once its stream filled.

Needs the shared Redis (127.0.0.1:6379); its other clients' work lands in the figures, so run it
where nothing else uses that Redis.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from redis.asyncio import Redis

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.trees.pinned import print_per_tree  # noqa: E402
from gateway.config.settings import LimitSettings  # noqa: E402
from testkit.gateway_procs import REDIS_URL  # noqa: E402

# Run in each tree's own process (its code on sys.path): admissions and settlements.
_DRIVER = """
import asyncio, sys, tempfile, uuid
from pathlib import Path
from redis.asyncio import Redis
from gateway.access.contract import Outcome, Ticket
from gateway.keys.redis_access import RedisAccessControl
from gateway.keys.records import KeyCreate
from gateway.keys.store import KeyStore
from providers.types import Usage

async def main(url, requests, tasks, maxlen):
    redis = Redis.from_url(url)
    prefix = f"bench-redis-cost:{uuid.uuid4().hex[:8]}:"
    secret, _ = await KeyStore(redis, prefix=prefix).create(KeyCreate(
        name="bench", budget_tokens=10**12, rpm=10**8, tpm=10**11, max_concurrency=10**5))
    access = RedisAccessControl(redis, prefix=prefix, usage_stream_maxlen=maxlen,
                                spool_dir=Path(tempfile.mkdtemp()))
    await access.start()
    principal = await access.authenticate(secret)
    outcome = Outcome(Usage(prompt_tokens=10, completion_tokens=20), 200, provider="bench",
                      route_model="echo", latency_ms=1.5)
    async def one(t, n):
        for i in range(n):
            grant = await access.admit(Ticket(principal, "bench", f"r-{t}-{i}", 10, 28))
            await access.settle(grant, outcome)
    try:
        for line in sys.stdin:  # one line per round: go
            await asyncio.gather(*(one(t, requests // tasks) for t in range(tasks)))
            print(requests // tasks * tasks, flush=True)
    finally:
        await access.aclose()
        keys = [k async for k in redis.scan_iter(match=prefix + "*", count=1000)]
        if keys:
            await redis.delete(*keys)
        await redis.aclose()

asyncio.run(main(sys.argv[1], *map(int, sys.argv[2:5])))
"""


async def redis_cpu(redis: Redis) -> float:
    info = await redis.info("cpu")
    return float(info["used_cpu_sys_main_thread"]) + float(info["used_cpu_user_main_thread"])


def start_drivers(args: argparse.Namespace) -> list[subprocess.Popen[str]]:
    return [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                _DRIVER,
                REDIS_URL,
                *map(str, (args.requests, args.tasks, args.maxlen)),
            ],
            cwd=tree,
            env={**os.environ, "PYTHONPATH": str(tree.resolve())},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for tree in args.trees
    ]


async def run(args: argparse.Namespace, drivers: list[subprocess.Popen[str]]) -> None:
    redis = Redis.from_url(REDIS_URL)
    per_tree: list[list[float]] = [[] for _ in drivers]
    try:
        for round_ in range(args.rounds + 1):  # the first warms both up
            order = list(range(len(drivers)))
            if round_ % 2:
                order.reverse()
            for i in order:
                driver = drivers[i]
                assert driver.stdin is not None and driver.stdout is not None
                before = await redis_cpu(redis)
                driver.stdin.write("go\n")
                driver.stdin.flush()
                made = int(await asyncio.to_thread(driver.stdout.readline))
                if round_:
                    per_tree[i].append((await redis_cpu(redis) - before) * 1e6 / made)
    finally:
        for driver in drivers:
            if driver.stdin is not None:
                driver.stdin.close()
            driver.wait(timeout=60)
        await redis.aclose()
    report(args, per_tree)


def report(args: argparse.Namespace, per_tree: list[list[float]]) -> None:
    print(
        f"Redis CPU per keyed request (admission + settlement), {args.tasks} concurrent, "
        f"{args.rounds} rounds of {args.requests} requests, usage stream capped at {args.maxlen}"
    )
    print_per_tree(args.trees, per_tree, "us", 1)
    print(json.dumps({"medians_us": [statistics.median(f) for f in per_tree]}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trees", nargs="+", type=Path, help="source trees; the first is the base")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--requests", type=int, default=12_800)
    parser.add_argument("--tasks", type=int, default=64)
    parser.add_argument("--maxlen", type=int, default=LimitSettings().usage_stream_maxlen)
    args = parser.parse_args()
    if len(args.trees) < 2:
        parser.error("give at least two trees")
    asyncio.run(run(args, start_drivers(args)))


if __name__ == "__main__":
    main()
