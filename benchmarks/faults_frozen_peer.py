"""The frozen-peer row of benchmarks/faults.py (run it from there; its docstring says what the
row measures and its target): two cluster nodes on the tiny demo checkpoint and a Redis of
their own; b, holding a system prompt, is frozen while a forwards turns to it."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from testkit.cluster_nodes import (
    node_sections,
    start_node,
    wait_cluster,
    wait_for,
    write_node_config,
)
from testkit.fault_drills import RedisProcess
from testkit.scripted_model import build_tiny_checkpoint

# Deadlines of the frozen-peer nodes (the defaults: 5 s to the first byte, 10 s idle); b's
# liveness outlives the run, so a keeps placing turns on the frozen b.
FROZEN_CLUSTER = {
    "heartbeat_s": 0.2,
    "liveness_ttl_s": 300.0,
    "forward_first_byte_timeout_s": 5.0,
    "forward_idle_timeout_s": 10.0,
}
ANSWER_S = 5.0  # a turn served elsewhere after a deadline, answered within this
SYSTEM = "You keep the log of a lighthouse: weather, ships, the lamp and the stores. " * 3


@dataclass
class Freeze:
    at: float | None = None  # when b was frozen


@dataclass
class Forwarded:
    kind: str  # "json" | "stream" | "mid-stream"
    placed_on_b: bool = False
    outcome: str = "hung"  # "answered" | "error" | "hung"
    seconds: float = 0.0


def _turn(n: int) -> list[dict[str, str]]:
    """Conversation `n`'s turn: every conversation shares the system prompt, which b holds."""
    return [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": f"Entry {n}: what changed?"},
    ]


async def _send(
    session: aiohttp.ClientSession,
    root: str,
    messages: list[dict[str, str]],
    result: Forwarded,
    *,
    max_tokens: int,
    freeze: Freeze | None = None,
    started: asyncio.Event | None = None,
) -> None:
    """One turn through node a; `result` says what came back and when (seconds from the
    later of its send and b's freeze); `started` is set at its first token."""
    stream = result.kind != "json"
    body = {"model": "deepseek-chat", "messages": messages, "temperature": 0}
    body |= {"max_tokens": max_tokens, "stream": stream}
    sent = time.monotonic()
    async with session.post(root + "/v1/chat/completions", json=body) as resp:
        route = resp.headers.get("x-gateway-route", "")
        result.placed_on_b = "node=b" in route or "tried=b" in route
        if not stream:
            await resp.read()
            result.outcome = "answered" if resp.status == 200 else "error"
        else:
            async for line in resp.content:
                if started is not None and b'"content":"' in line:
                    started.set()
                if line.startswith(b"data: [DONE]"):
                    result.outcome = "answered"
                elif line.startswith(b'data: {"error"'):
                    result.outcome = "error"
    froze_at = freeze.at if freeze is not None and freeze.at is not None else sent
    result.seconds = time.monotonic() - max(sent, froze_at)


async def frozen_peer(args: argparse.Namespace, workdir: Path) -> str:
    checkpoint = await asyncio.to_thread(build_tiny_checkpoint, workdir / "tiny")
    redis_server = RedisProcess(workdir)
    await redis_server.start()
    sections = node_sections(
        "bench:", redis_server.url, checkpoint, auth=False, cluster=FROZEN_CLUSTER
    )
    config = write_node_config(workdir / "node.toml", sections)
    nodes = {name: start_node(name, config, workdir) for name in ("a", "b")}
    timeout = aiohttp.ClientTimeout(total=args.hang)
    results: list[Forwarded] = []
    try:
        async with aiohttp.ClientSession(timeout=timeout) as session:
            await wait_cluster(session, list(nodes.values()))
            a, b = nodes["a"].root, nodes["b"].root
            await _send(session, b, _turn(-1), Forwarded("json"), max_tokens=2)
            blocks = len(SYSTEM.split()) // 16  # about a token a word: a safe lower bound
            await wait_for(
                session,
                nodes["a"],
                lambda s: s["nodes"].get("b", {}).get("blocks", 0) >= blocks,
                what="saw b's blocks",
            )
            freeze = Freeze()
            mid = [Forwarded("mid-stream") for _ in range(args.mid_stream)]
            started = [asyncio.Event() for _ in mid]
            tasks = [
                asyncio.create_task(
                    _send(session, a, _turn(i), r, max_tokens=2000, freeze=freeze,
                          started=started[i])
                )
                for i, r in enumerate(mid)
            ]  # fmt: skip
            await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), args.hang)
            nodes["b"].freeze()
            freeze.at = time.monotonic()
            later = [
                Forwarded("json" if i % 2 == 0 else "stream") for i in range(args.conversations)
            ]
            tasks += [
                asyncio.create_task(_send(session, a, _turn(args.mid_stream + i), r, max_tokens=4))
                for i, r in enumerate(later)
            ]
            for task in tasks:
                with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                    await task  # one that raised is counted as hung
            results = mid + later
    finally:
        for node in nodes.values():
            node.stop()
        redis_server.stop()
    forwarded = [r for r in results if r.placed_on_b]
    count = {o: sum(1 for r in forwarded if r.outcome == o) for o in ("answered", "error", "hung")}
    worst = max((r.seconds for r in forwarded), default=0.0)
    deadline = max(
        FROZEN_CLUSTER["forward_first_byte_timeout_s"], FROZEN_CLUSTER["forward_idle_timeout_s"]
    )
    met = count["hung"] == 0 and worst <= deadline + ANSWER_S
    return (
        f"{'frozen-peer':<14} {len(forwarded):>9} {count['answered']:>8} {count['error']:>6} "
        f"{count['hung']:>5} {worst:>6.1f}   <= {deadline + ANSWER_S:g} s, 0 hung "
        f"({len(results)} sent)   {'met' if met else 'MISSED'}"
    )
