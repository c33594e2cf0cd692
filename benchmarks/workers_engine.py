"""Requests per second through the local engine with `[server] workers` = 1 and = 2.

Two gateways (`python -m gateway serve`) on the same tiny demo checkpoint (fp32, one engine
thread), auth off unless `--keyed`: one with one worker, one with two (worker 0 holds the engine,
worker 1 reaches it over its unix socket). Short greedy answers (`--max-tokens`, default 2) keep
the engine's share small, so what differs is the serving processes' HTTP and tokenizing work.
Rounds alternate the order of the two gateways (the shared machine drifts); each round runs one
burst of `--requests` at `--concurrency` on each, and the figures printed are medians over the
rounds with the per-round ratio. CPU per request is the whole gateway's (supervisor, workers and
the engine thread), from /proc.

    flock /tmp/heavy.lock .venv/bin/python benchmarks/workers_engine.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import aiohttp
from redis.asyncio import Redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from testkit.gateway_procs import (  # noqa: E402
    REDIS_URL,
    ROOT,
    drop_prefix,
    free_port,
    high_limit_key,
)
from testkit.http_load import cpu_seconds, load  # noqa: E402

CHECKPOINT = ROOT / ".data" / "bench-tiny"


def tiny_checkpoint() -> Path:
    if not (CHECKPOINT / "config.json").is_file():
        import torch

        from backend.demo_checkpoint import write_demo_checkpoint

        write_demo_checkpoint(CHECKPOINT, "tiny", seed=0, dtype=torch.float32)
    return CHECKPOINT


def start(
    workers: int, keyed: bool, prefix: str, workdir: Path
) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    config = workdir / f"workers{workers}.toml"
    config.write_text(f"""
[server]
host = "127.0.0.1"
port = {port}
workers = {workers}
run_dir = "{workdir}"
[redis]
url = "{REDIS_URL}"
embedded = false
key_prefix = "{prefix}"
[logging]
format = "json"
level = "warning"
[auth]
enabled = {"true" if keyed else "false"}
[usage]
enabled = false
[engine]
model_path = "{tiny_checkpoint()}"
dtype = "float32"
block_size = 16
cache_memory_mb = 16
max_num_seqs = 64
max_batch_tokens = 2048
num_threads = 1
[providers.local]
kind = "local"
[models."bench"]
routes = [{{ provider = "local", model = "deepseek-v3.1", thinking = false }}]
""")
    env = {**os.environ, "GATEWAY_USE_PRESETS": "false", "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "gateway", "serve", "--config", str(config)]
    return subprocess.Popen(cmd, cwd=ROOT, env=env), f"http://127.0.0.1:{port}"


async def all_ready(root: str, workers: int, within_s: float = 300.0) -> None:
    """Until every worker has answered /readyz 200 (each probe on a fresh connection)."""
    ready: set[int] = set()
    deadline = time.monotonic() + within_s
    while len(ready) < workers:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{root}: workers {sorted(ready)} of {workers} ready")
        connector = aiohttp.TCPConnector(limit=1)
        try:
            async with aiohttp.ClientSession(connector=connector) as session:
                async with session.get(f"{root}/healthz") as resp:
                    worker = (await resp.json())["worker"]
                async with session.get(f"{root}/readyz") as resp:
                    if resp.status == 200:
                        ready.add(worker)
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.05)


def process_cpu(pid: int) -> list[float]:
    """CPU seconds of the gateway `pid` (itself and its children), then of each worker it
    started, in start order (none with one worker: `pid` serves)."""
    children = [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    workers = [c for c in children if b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes()]
    return [cpu_seconds(pid), *(cpu_seconds(c) for c in sorted(workers))]


async def burst(
    root: str, pid: int, headers: dict[str, str], args: argparse.Namespace
) -> tuple[float, list[float]]:
    """(requests per second, CPU ms per request of the whole gateway, then of each child
    process: the workers, in order, and multiprocessing's resource tracker) of one burst."""
    body = json.dumps(
        {
            "model": "bench",
            "messages": [{"role": "user", "content": "the quick brown fox"}],
            "max_tokens": args.max_tokens,
            "temperature": 0,
        }
    ).encode()
    headers = {**headers, "Content-Type": "application/json"}
    connector = aiohttp.TCPConnector(limit=args.concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        cpu0 = process_cpu(pid)
        url = f"{root}/v1/chat/completions"
        elapsed, _ = await load(
            session, url, headers, body, args.concurrency, args.requests, stream=False
        )
        cpu = [
            1000 * (after - before) / args.requests
            for before, after in zip(cpu0, process_cpu(pid), strict=True)
        ]
    return args.requests / elapsed, cpu


async def main(args: argparse.Namespace) -> None:
    prefix = f"bench:workers:{uuid.uuid4().hex[:8]}:"
    redis = Redis.from_url(REDIS_URL)
    workdir = Path(tempfile.mkdtemp(prefix="wk-"))
    procs = {w: start(w, args.keyed, prefix, workdir) for w in (1, 2)}
    headers = {}
    try:
        for w, (_, root) in procs.items():
            await all_ready(root, w)
        if args.keyed:
            headers = {"Authorization": f"Bearer {await high_limit_key(redis, prefix)}"}
        for proc, root in procs.values():  # warm-up
            await burst(root, proc.pid, headers, args)
        results: dict[int, list[tuple[float, list[float]]]] = {1: [], 2: []}
        for i in range(args.rounds):
            for w in (1, 2) if i % 2 == 0 else (2, 1):
                proc, root = procs[w]
                results[w].append(await burst(root, proc.pid, headers, args))
        report(results, args)
    finally:
        for proc, _ in procs.values():
            proc.terminate()
        for proc, _ in procs.values():
            proc.wait(60)
        await drop_prefix(redis, prefix)
        await redis.aclose()


def report(results: dict[int, list[tuple[float, list[float]]]], args: argparse.Namespace) -> None:
    print(
        f"local engine, tiny checkpoint, max_tokens={args.max_tokens}, c={args.concurrency}, "
        f"{args.requests} requests x {args.rounds} rounds, {'keyed' if args.keyed else 'auth off'}"
    )
    for w, rows in results.items():
        rps = [r for r, _ in rows]
        per = [statistics.median(c[i] for _, c in rows) for i in range(len(rows[0][1]))]
        split = ", ".join(f"worker {i} {ms:.2f}" for i, ms in enumerate(per[1:]))
        print(
            f"workers={w}: {statistics.median(rps):8.1f} req/s (rounds {min(rps):.1f}-"
            f"{max(rps):.1f}), {per[0]:.2f} ms CPU per request" + (f" ({split})" if split else "")
        )
    ratios = [two[0] / one[0] for one, two in zip(results[1], results[2], strict=True)]
    print(
        f"workers=2 / workers=1: {statistics.median(ratios):.2f}x "
        f"(rounds {min(ratios):.2f}-{max(ratios):.2f})"
    )
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--keyed", action="store_true")
    asyncio.run(main(parser.parse_args()))
