"""Python function calls per request of two or more source trees: a count that the machine's
load does not move, where CPU time on a shared machine drifts by more than the differences
sought.

Each tree's gateway (the same configuration as `pinned`: keyed with the usage store on by
default, `TREE@on` / `TREE@off`, each key made through its own tree's admin API) is loaded by
wrk in turn while cProfile counts every call its process makes (C functions called from
Python included; its other threads, such as SQLite's, and work inside C functions are not
counted). Printed: each tree's calls per request and its ratio to the first tree's, then the
functions (by name, whatever module holds them) whose calls per request differ most from the
first tree's.

    .venv/bin/python benchmarks/compare_trees.py calls TREE TREE [TREE...] [--path open|keyed]
        [--mode json|stream] [--seconds 6] [--connections 32] [--top 25]

The profiler slows each gateway several-fold, so the count is of work, not of time: a change
that costs CPU inside one C call (a bigger JSON body, a slower query) does not show here; use
`pinned` for that. Needs wrk and nginx, like `pinned`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import pstats
import re
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path

from redis.asyncio import Redis

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.trees.pinned import CHUNKS, tree_and_store  # noqa: E402
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

# Imported first by each gateway (a directory before its tree on PYTHONPATH): SIGUSR1 starts
# counting, SIGUSR2 stops and writes the counts to the file the environment names.
_HOOK = """
import cProfile, os, signal
_out = os.environ.get("BENCH_CALLS_OUT")
if _out:
    _profile = cProfile.Profile()
    signal.signal(signal.SIGUSR1, lambda *_: _profile.enable())
    def _stop(*_):
        _profile.disable()
        _profile.dump_stats(_out)
    signal.signal(signal.SIGUSR2, _stop)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "trees", nargs="+", help="source trees (TREE, TREE@on, TREE@off); the first is the base"
    )
    parser.add_argument("--path", choices=("open", "keyed"), default="keyed")
    parser.add_argument("--mode", choices=("json", "stream"), default="json")
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--connections", type=int, default=32, help="each gateway's")
    parser.add_argument("--top", type=int, default=25, help="functions listed")
    args = parser.parse_args()
    if len(args.trees) < 2:
        parser.error("give at least two trees")
    if not (wrk_load.available() and Nginx.available()):
        sys.exit("needs wrk and nginx: apt-get install -y wrk nginx-light")
    asyncio.run(run(args))


async def run(args: argparse.Namespace) -> None:
    keyed, stream = args.path == "keyed", args.mode == "stream"
    hook = Path(tempfile.mkdtemp(prefix="bench-calls-"))
    (hook / "sitecustomize.py").write_text(_HOOK)
    mock, mock_url = start_python_mock()
    nginx = Nginx(mock_answer(CHUNKS))
    nginx.start()
    redis = Redis.from_url(REDIS_URL)
    admin_key = f"bench-admin-{uuid.uuid4().hex}"
    body = json.dumps(request_body(STREAM_MODEL if stream else "bench", CHUNKS, stream)).encode()
    counts: list[tuple[str, float, Counter[str]]] = []
    try:
        for spec in args.trees:
            tree, store = tree_and_store(spec, keyed)
            if store and not keyed:
                raise SystemExit(f"{spec}: the usage store needs keys (--path keyed)")
            out = hook / f"{len(counts)}.prof"
            prefix = f"bench-calls:{uuid.uuid4().hex[:8]}:"
            db = Path(tempfile.mkdtemp()) / "usage.db" if store else None
            proc, root = start_gateway(
                nginx.base_url, mock_url, CHUNKS, keyed, prefix, tree=tree, usage_db=db,
                admin_key=admin_key,
                extra_env={"PYTHONPATH": f"{hook}:{tree}", "BENCH_CALLS_OUT": str(out)},
            )  # fmt: skip
            try:
                requests = await _count(args, proc, root, body, keyed, admin_key)
                calls = await _read_counts(out)
            finally:
                proc.send_signal(signal.SIGINT)
                proc.wait(timeout=60)
                await drop_prefix(redis, prefix)
            label = f"{tree} (store {'on' if store else 'off'})"
            counts.append((label, sum(calls.values()) / requests, _per(calls, requests)))
    finally:
        await redis.aclose()
        nginx.stop()
        mock.terminate()
    report(args, counts)


async def _count(
    args: argparse.Namespace,
    proc: subprocess.Popen[bytes],
    root: str,
    body: bytes,
    keyed: bool,
    admin_key: str,
) -> int:
    """Warm the gateway up, then count its calls over one burst: the burst's requests."""
    await wait_ready(root)
    headers = {"Content-Type": "application/json"}
    if keyed:
        headers["Authorization"] = f"Bearer {await key_via_admin_api(root, admin_key)}"
    script = wrk_load.script(body, headers)
    url = f"{root}/v1/chat/completions"
    await asyncio.to_thread(wrk_load.run, url, script, args.connections, 2.0)
    proc.send_signal(signal.SIGUSR1)
    result = await asyncio.to_thread(wrk_load.run, url, script, args.connections, args.seconds)
    proc.send_signal(signal.SIGUSR2)
    return result.requests


async def _read_counts(path: Path, within_s: float = 60.0) -> Counter[str]:
    """The dump's calls per function name (`name [file]`), once it is written whole."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            stats = pstats.Stats(str(path)).stats  # type: ignore[attr-defined]
            break
        except (OSError, EOFError, ValueError):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the gateway wrote no counts to {path}") from None
            await asyncio.sleep(0.2)
    calls: Counter[str] = Counter()
    for (file, _line, name), (_, ncalls, *_rest) in stats.items():
        name = re.sub(r" at 0x[0-9a-f]+", "", name)  # a C function's label carries its address
        calls[f"{name} [{re.sub(r'.*/', '', file)}]"] += ncalls
    return calls


def _per(calls: Counter[str], requests: int) -> Counter[str]:
    return Counter({name: n / requests for name, n in calls.items()})


def report(args: argparse.Namespace, counts: list[tuple[str, float, Counter[str]]]) -> None:
    print(
        f"{args.path} {args.mode}, {args.connections} connections, {args.seconds:g} s each: "
        "Python function calls per request (cProfile)"
    )
    base_label, base_total, base = counts[0]
    for label, total, _ in counts:
        print(f"{label:50s} {total:9.1f}  ratio {total / base_total:.3f}")
    for label, _, per in counts[1:]:
        print(f"\n{label} against {base_label}: the largest differences in calls per request")
        names = set(per) | set(base)
        for name in sorted(names, key=lambda n: -abs(per[n] - base[n]))[: args.top]:
            print(f"  {base[name]:8.2f} {per[name]:8.2f} {per[name] - base[name]:+8.2f}  {name}")
