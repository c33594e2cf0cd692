"""What each part of the keyed path costs a request at one client, measured side by side in one run.

The keyed gateway (a real key with budget, rpm, tpm and concurrency limits set high) is run
beside copies of itself with parts replaced by answers made in the process
(benchmarks/stand_ins.py): `admit` (no admission round trip), `settle` (no settlement at all),
`send` (the settlement built but not sent), `admit,settle` (neither); beside copies of the keyed
and the open gateway that sleep while they wait for Redis and the upstream (`[server]
busy_wait_us = 0`); and beside the open gateway (auth off) and the direct path. One client
(wrk, JSON, nginx upstream as in benchmarks/gateway_overhead.py), in rounds whose order rotates;
medians over rounds of each path's added p50 (its p50 minus the direct path's in the same
round), the keyed path's p50 minus each variant's (what that part costs), and each sleeping
copy's p50 minus its path's (what the busy wait saves).

    .venv/bin/python benchmarks/keyed_breakdown.py [--seconds 2] [--rounds 5]

Needs wrk and nginx (apt-get install -y wrk nginx-light).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

from redis.asyncio import Redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import wrk_load  # noqa: E402
from benchmarks.gateway_procs import (  # noqa: E402
    REDIS_URL,
    Nginx,
    high_limit_key,
    mock_answer,
    request_body,
    start_gateway,
    start_python_mock,
    tear_down,
    wait_ready,
)
from benchmarks.http_load import cpu_jiffies, stolen_share  # noqa: E402

CHUNKS = 20


@dataclass(frozen=True)
class Variant:
    keyed: bool = True
    stand_ins: str = ""  # the parts replaced ("": none)
    busy_wait_us: int | None = None  # None: the default


VARIANTS: dict[str, Variant] = {
    "open": Variant(keyed=False),
    "open-sleeping": Variant(keyed=False, busy_wait_us=0),
    "keyed": Variant(),
    "keyed-sleeping": Variant(busy_wait_us=0),
    "keyed-admit": Variant(stand_ins="admit"),
    "keyed-settle": Variant(stand_ins="settle"),
    "keyed-send": Variant(stand_ins="send"),
    "keyed-admit,settle": Variant(stand_ins="admit,settle"),
}


async def _start(
    nginx: Nginx, mock_url: str, redis: Redis, prefix: str
) -> tuple[list[subprocess.Popen[bytes]], dict[str, tuple[str, Path]]]:
    """Every gateway, started and ready; label -> (URL, wrk script)."""
    procs: list[subprocess.Popen[bytes]] = []
    paths: dict[str, tuple[str, Path]] = {}
    direct_body = json.dumps(request_body(f"echo-chunks-{CHUNKS}", CHUNKS, False)).encode()
    json_headers = {"Content-Type": "application/json"}
    paths["direct"] = (
        f"{nginx.base_url}/chat/completions",
        wrk_load.script(direct_body, json_headers),
    )
    body = json.dumps(request_body("bench", CHUNKS, False)).encode()
    secret = await high_limit_key(redis, prefix)
    for label, variant in VARIANTS.items():
        proc, root = start_gateway(
            nginx.base_url,
            mock_url,
            CHUNKS,
            variant.keyed,
            prefix,
            stand_ins=variant.stand_ins,
            busy_wait_us=variant.busy_wait_us,
        )
        procs.append(proc)
        await wait_ready(root)
        auth = {"Authorization": f"Bearer {secret}"} if variant.keyed else {}
        headers = {**json_headers, **auth}
        paths[label] = (f"{root}/v1/chat/completions", wrk_load.script(body, headers))
    return procs, paths


def _report(p50s: dict[str, list[float]]) -> None:
    direct = p50s["direct"]
    rounds = len(direct)

    def med(values: list[float]) -> str:
        return f"{statistics.median(values):.3f} ms ({min(values):.3f}..{max(values):.3f})"

    print(f"one client, JSON, {rounds} rounds; medians (range over rounds)\n")
    print(f"{'path':20s} added p50 over direct")
    for label in VARIANTS:
        added = [p - d for p, d in zip(p50s[label], direct, strict=True)]
        print(f"{label:20s} {med(added)}")
    keyed = p50s["keyed"]
    print("\nwhat a part costs the keyed path (keyed p50 - the variant's, within each round)")
    for label in ("keyed-admit", "keyed-settle", "keyed-send", "keyed-admit,settle", "open"):
        saved = [k - p for k, p in zip(keyed, p50s[label], strict=True)]
        print(f"{label:20s} {med(saved)}")
    print("\nwhat the busy wait saves (the sleeping copy's p50 - the path's, within each round)")
    for label in ("open", "keyed"):
        saved = [s - p for s, p in zip(p50s[f"{label}-sleeping"], p50s[label], strict=True)]
        print(f"{label:20s} {med(saved)}")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="seconds per wrk burst")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    if not (wrk_load.available() and Nginx.available()):
        sys.exit("needs wrk and nginx: apt-get install -y wrk nginx-light")
    mock_proc, mock_url = start_python_mock()
    nginx = Nginx(mock_answer(CHUNKS))
    nginx.start()
    redis = Redis.from_url(REDIS_URL)
    prefix = f"bench:{uuid.uuid4().hex}:"
    procs: list[subprocess.Popen[bytes]] = []
    try:
        procs, paths = await _start(nginx, mock_url, redis, prefix)
        labels = list(paths)
        for label in labels:  # warm: connections, caches, the scripts in Redis
            wrk_load.run(paths[label][0], paths[label][1], 1, 1.0)
        p50s: dict[str, list[float]] = {label: [] for label in labels}
        jiffies = cpu_jiffies()
        for i in range(args.rounds):
            shift = i % len(labels)
            for label in labels[shift:] + labels[:shift]:
                url, lua = paths[label]
                p50s[label].append(wrk_load.run(url, lua, 1, args.seconds).p50_ms)
            print(f"round {i + 1}/{args.rounds} done", file=sys.stderr)
        _report(p50s)
        print(f"\nstolen by the host: {stolen_share(jiffies, cpu_jiffies()):.1%} of CPU time")
    finally:
        await tear_down(procs, nginx, mock_proc, redis, prefix)


if __name__ == "__main__":
    asyncio.run(main())
