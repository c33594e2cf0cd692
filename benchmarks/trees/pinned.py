"""Gateway CPU per request of two source trees, loaded at the same time on the same core.

Each tree (a checkout, e.g. `git worktree add /tmp/before HEAD~1`) serves from its own
`python -m gateway serve` process, and all of them are pinned to one CPU (taskset), which the
load generators, the upstreams and Redis do not use: in each round one wrk per gateway loads
them together for the same seconds, so a slow or fast moment of the machine falls on all of them
alike. Printed: each tree's CPU per request (user + system of its process over the round, from
/proc) per round and the median, and each tree's per-round ratio to the first tree's.

On a 2-core virtual machine whose speed moved by up to 2.5x within minutes, two copies of the
same tree read 0.96-1.05 per round this way, where bursts taken one after the other read
0.71-1.26. Compare changes of a few percent with 8 or more rounds.

    .venv/bin/python benchmarks/compare_trees.py pinned TREE TREE [TREE...] [--path open|keyed]
        [--mode json|stream] [--rounds 8] [--seconds 3] [--connections 64] [--cpu 1]
        [--no-usage-store]

By default the default configuration: the keyed path with the usage store on (each gateway's
own SQLite file; a tree from before the store has none). `TREE@off` or `TREE@on` sets the store
for that gateway alone, so that one tree runs with the store on and off side by side. Each
gateway's key is made through its own admin API, so a tree with another key format is measured
on its keyed path too.
The open path runs without the store, which records keyed requests only.

Needs wrk and nginx (apt-get install -y wrk nginx-light) and the shared Redis.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import statistics
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from redis.asyncio import Redis

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from testkit import wrk_load  # noqa: E402
from testkit.gateway_procs import (  # noqa: E402
    REDIS_URL,
    STREAM_MODEL,
    Nginx,
    drop_prefix,
    key_via_admin_api,
    mock_answer,
    request_body,
    start_gateway,
    start_python_mock,
    wait_ready,
)
from testkit.http_load import cpu_seconds  # noqa: E402

CHUNKS = 20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "trees", nargs="+", help="source trees (TREE, TREE@on, TREE@off); the first is the base"
    )
    parser.add_argument("--path", choices=("open", "keyed"), default="keyed")
    parser.add_argument("--mode", choices=("json", "stream"), default="json")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--connections", type=int, default=64, help="in all, split between trees")
    parser.add_argument("--cpu", default="1", help="the CPU (taskset list) the gateways share")
    parser.add_argument(
        "--usage-store",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="each gateway with its usage store (SQLite), but for trees given with @on/@off",
    )
    args = parser.parse_args()
    if len(args.trees) < 2:
        parser.error("give at least two trees")
    if not (wrk_load.available() and Nginx.available()):
        sys.exit("needs wrk and nginx: apt-get install -y wrk nginx-light")
    asyncio.run(run(args))


async def run(args: argparse.Namespace) -> None:
    keyed, stream = args.path == "keyed", args.mode == "stream"
    mock, mock_url = start_python_mock()
    nginx = Nginx(mock_answer(CHUNKS))
    nginx.start()
    redis = Redis.from_url(REDIS_URL)
    gateways: list[tuple[str, subprocess.Popen[bytes], str, str]] = []
    admin_key = f"bench-admin-{uuid.uuid4().hex}"
    try:
        for spec in args.trees:
            # The store records keyed requests only: the open path runs without it.
            tree, store = tree_and_store(spec, args.usage_store and keyed)
            if store and not keyed:
                raise SystemExit(f"{spec}: the usage store needs keys (--path keyed)")
            prefix = f"bench-sbs:{uuid.uuid4().hex[:8]}:"
            db = Path(tempfile.mkdtemp()) / "usage.db" if store else None
            proc, root = start_gateway(
                nginx.base_url, mock_url, CHUNKS, keyed, prefix, tree=tree, cpus=args.cpu,
                usage_db=db, admin_key=admin_key,
            )  # fmt: skip
            gateways.append((f"{tree} (store {'on' if store else 'off'})", proc, root, prefix))
        body = json.dumps(
            request_body(STREAM_MODEL if stream else "bench", CHUNKS, stream)
        ).encode()
        scripts = []
        for _, _, root, _ in gateways:
            await wait_ready(root)
            headers = {"Content-Type": "application/json"}
            if keyed:
                headers["Authorization"] = f"Bearer {await key_via_admin_api(root, admin_key)}"
            scripts.append(wrk_load.script(body, headers))
        per_tree = max(1, args.connections // len(gateways))
        urls = [f"{root}/v1/chat/completions" for _, _, root, _ in gateways]
        cpu: list[list[float]] = [[] for _ in gateways]
        rates: list[list[float]] = [[] for _ in gateways]  # requests/s of each round
        with ThreadPoolExecutor(len(gateways)) as pool:
            for warm_or_round in range(args.rounds + 1):
                before = [cpu_seconds(proc.pid) for _, proc, _, _ in gateways]
                bursts = [
                    pool.submit(wrk_load.run, url, script, per_tree, args.seconds)
                    for url, script in zip(urls, scripts, strict=True)
                ]
                results = [b.result() for b in bursts]
                after = [cpu_seconds(proc.pid) for _, proc, _, _ in gateways]
                if warm_or_round == 0:
                    continue  # the first burst warms every gateway up
                for i, result in enumerate(results):
                    cpu[i].append(1000 * (after[i] - before[i]) / result.requests)
                    rates[i].append(result.requests / args.seconds)
        report(args, [t for t, _, _, _ in gateways], cpu, rates)
    finally:
        for _, proc, _, prefix in gateways:
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=30)
            await drop_prefix(redis, prefix)
        await redis.aclose()
        nginx.stop()
        mock.terminate()


def tree_and_store(spec: str, default: bool) -> tuple[Path, bool]:
    """`TREE`, `TREE@on` or `TREE@off`: the tree and whether its usage store is on."""
    tree, _, store = spec.rpartition("@")
    if store in ("on", "off") and tree:
        return Path(tree), store == "on"
    return Path(spec), default


def report(
    args: argparse.Namespace, trees: list[str], cpu: list[list[float]], rates: list[list[float]]
) -> None:
    print(
        f"{args.path} {args.mode}, "
        f"{args.connections} connections in all, gateways on CPU "
        f"{args.cpu}, {args.rounds} rounds of {args.seconds:g} s"
    )
    print(f"{'tree':40s} {'CPU/req median':>15s}  per round (ms); ratio to the first tree")
    print_per_tree(trees, cpu, "ms", 3)
    print(f"{'tree':40s} {'req/s median':>15s}  per round; ratio to the first tree")
    print_per_tree(trees, rates, "/s", 0)


def print_per_tree(
    trees: Sequence[object], per_tree: list[list[float]], unit: str, digits: int
) -> None:
    """Each tree's median and per-round figures; each later tree's per-round ratio to the
    first tree's, and their median."""
    base = per_tree[0]
    for tree, figures in zip(trees, per_tree, strict=True):
        rounds = " ".join(f"{x:.{digits}f}" for x in figures)
        print(f"{str(tree):40s} {statistics.median(figures):12.{digits}f} {unit}  {rounds}")
        if figures is not base:
            ratios = [b / a for a, b in zip(base, figures, strict=True)]
            spread = " ".join(f"{r:.3f}" for r in ratios)
            print(f"{'':40s} ratio median {statistics.median(ratios):.3f}  ({spread})")


if __name__ == "__main__":
    main()
