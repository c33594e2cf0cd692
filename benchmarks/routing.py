"""Routing by difficulty on the evaluation set (testkit/routing_eval/prompts.jsonl).

Prints, for the default routing settings (or --config's), the threshold chosen on the tuning
half, the agreement with the labels on the held-out half (overall, per language), its confusion
matrix, the reasons decisions were made for, and the cost of one decision, p50 and p99 over every
prompt, repeated:
  - the judge alone (rules + signals + scorer);
  - the whole router seam (`Decider.decide`) for an auto model with a local and an upstream
    route, each prompt the last turn of a conversation of `--prompt-tokens` prepared tokens
    whose every reusable block the local engine caches, its queue over `local_max_queue`: the
    judge, the conversation's hash, the background stickiness write (its task; the Redis round
    trip itself is not on the request's path), the engine's load and the prefix lookup by
    `LocalProvider.fit`, through a real `AsyncEngine` and `BlockManager` (no model, the engine's
    thread not started), and the kept=prefix choice.
Also the cost of hashing that prompt's blocks, paid once while it is prepared, off the loop.
`--fit` first fits the scorer's weights by logistic regression on the tuning half and prints them
as a `[routing.scorer]` block for settings.toml.

  .venv/bin/python benchmarks/routing.py [--config settings.toml] [--repeat 200] [--fit]
      [--prompt-tokens 4096] [--block-size 64]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import time
from collections import Counter
from dataclasses import MISSING, fields
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from backend.engine.async_engine import AsyncEngine  # noqa: E402
from backend.engine.blocks import BlockManager  # noqa: E402
from backend.engine.engine_config import EngineConfig  # noqa: E402
from backend.engine.interface import EngineStats  # noqa: E402
from backend.engine.request import Request  # noqa: E402
from backend.engine.sampling_params import SamplingParams  # noqa: E402
from gateway.config.routing import RoutingSettings, ScorerSettings  # noqa: E402
from gateway.config.settings import load_settings  # noqa: E402
from gateway.pipeline.prompt_estimates import estimate_prompt_tokens  # noqa: E402
from gateway.routing.aliases import Route  # noqa: E402
from gateway.routing.decide import Decider, RoutingInput  # noqa: E402
from gateway.routing.judge import Judge  # noqa: E402
from gateway.routing.policy import KeyPolicy  # noqa: E402
from gateway.routing.signals import SIGNALS, signals_of  # noqa: E402
from gateway.routing.sticky import Stickiness  # noqa: E402
from providers.local.provider import LocalProvider  # noqa: E402
from providers.types import ChatRequest, Message, PreparedPrompt  # noqa: E402
from testkit.routing_eval import (  # noqa: E402
    Item,
    agreement,
    best_threshold,
    decisions,
    load,
    verdicts,
)


def fit(tune: list[Item], l2: float) -> ScorerSettings:
    """Logistic regression (batch gradient descent, L2) of the labels on the signals."""
    x = np.array([signals_of(i.text).values for i in tune])
    y = np.array([i.think for i in tune], dtype=float)
    w, b = np.zeros(x.shape[1]), 0.0
    for _ in range(20000):
        p = 1 / (1 + np.exp(-(x @ w + b)))
        g = p - y
        w -= 0.5 * (x.T @ g / len(y) + l2 * w)
        b -= 0.5 * float(g.mean())
    weights = {name: round(float(v), 2) for name, v in zip(SIGNALS, w, strict=True)}
    return ScorerSettings(bias=round(b, 2), weights=weights)


def confusion(items: list[Item], thinking: list[bool]) -> str:
    c = Counter((i.think, t) for i, t in zip(items, thinking, strict=True))
    return (
        "                 decided think  decided direct\n"
        f"  label think    {c[True, True]:>13}  {c[True, False]:>14}\n"
        f"  label direct   {c[False, True]:>13}  {c[False, False]:>14}"
    )


class Samples:
    """Each decision's wall-clock time, and this thread's CPU time over all of them (on a shared
    machine the wall clock also counts the time other processes held the core), microseconds."""

    def __init__(self) -> None:
        self.wall: list[float] = []
        self._cpu_started = time.thread_time_ns()
        self._start = 0

    def start(self) -> None:
        self._start = time.perf_counter_ns()

    def stop(self) -> None:
        self.wall.append((time.perf_counter_ns() - self._start) / 1000)

    def __str__(self) -> str:
        cpu_mean = (time.thread_time_ns() - self._cpu_started) / 1000 / len(self.wall)
        p50, p99 = percentiles(self.wall)
        return (
            f"p50 {p50:.1f} us, p99 {p99:.1f} us wall-clock; CPU {cpu_mean:.1f} us a decision, "
            f"the loop included ({len(self.wall)} decisions)"
        )


def percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[int(len(ordered) * 0.99)]


def cost_us(judge: Judge, items: list[Item], repeat: int) -> Samples:
    """The judge's cost per decision (each prompt decided `repeat` times)."""
    requests = [i.request() for i in items]
    tokens = [estimate_prompt_tokens(r) for r in requests]
    samples = Samples()
    for _ in range(repeat):
        for request, n in zip(requests, tokens, strict=True):
            samples.start()
            judge.judge(request, "chat", n)
            samples.stop()
    return samples


class CachedEngine:
    """What `AsyncEngine` (the engine a local provider serves from, whose `stats` and
    `cached_prefix_blocks` the router calls) reads of an `LLMEngine`, without a model: a real
    block manager holding the blocks of `ids` (computed, then freed: cached as after an earlier
    turn), and stats saying `waiting` requests wait with every slot taken."""

    def __init__(self, ids: list[int], block_size: int, waiting: int) -> None:
        self.config = EngineConfig(block_size=block_size)
        self.hash_seed = b"benchmark-checkpoint"
        self.max_model_len = 2 * len(ids)
        self.block_manager = BlockManager(2 * len(ids) // block_size, block_size, self.hash_seed)
        earlier = Request("earlier", ids, SamplingParams())
        self.block_manager.allocate(earlier)
        earlier.num_computed_tokens = len(ids) - 1
        self.block_manager.cache_full_blocks(earlier)
        self.block_manager.free(earlier)
        required = {f.name: 0 for f in fields(EngineStats) if f.default is MISSING}
        self._stats = EngineStats(**{**required, "num_waiting": waiting, "num_running": 32})

    def stats(self) -> EngineStats:
        return self._stats


class NoRedis:
    """Stickiness's Redis, answering at once (its round trip is not what is measured)."""

    async def get(self, key: str) -> None:
        return None

    def pipeline(self, transaction: bool) -> NoRedis:
        return self

    async def __aenter__(self) -> NoRedis:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    def set(self, key: str, value: str, ex: int, nx: bool) -> None:
        return None

    async def execute(self) -> None:
        return None


async def seam_cost_us(
    routing: RoutingSettings, items: list[Item], repeat: int, num_tokens: int, block_size: int
) -> tuple[Samples, float, int]:
    """The cost of `Decider.decide` (see the module), the hashing cost at preparation in
    microseconds, and the cached tokens the decisions saw."""
    rng = random.Random(0)
    ids = [rng.randrange(2, 120_000) for _ in range(num_tokens)]
    stub = CachedEngine(ids, block_size, waiting=routing.local_max_queue + 1)
    engine = AsyncEngine(stub)  # type: ignore[arg-type]
    local = LocalProvider("local", engine, None, "m", slots=32)  # type: ignore[arg-type]
    started = time.perf_counter_ns()
    for _ in range(20):
        local._block_chain(ids)
    hashing_us = (time.perf_counter_ns() - started) / 20 / 1000
    prepared = PreparedPrompt("local", ids, False, True, False, False, local._block_chain(ids))
    upstream = type("Upstream", (), {"name": "up"})()
    routes = (Route(local, "m", None), Route(upstream, "m", None))
    stickiness = Stickiness(NoRedis(), "bench:", 60)  # type: ignore[arg-type]
    decider = Decider(routing, frozenset({"local"}), {"local": local}, stickiness)
    system = Message(
        "system", " ".join(f"Rule {i}: answer in the house style." for i in range(400))
    )
    inputs = [
        RoutingInput(
            ChatRequest(model="m", messages=(system, Message("user", i.text)), prepared=prepared),
            "chat", "auto-local", routes, "auto", KeyPolicy(), "key_bench", num_tokens,
        )
        for i in items
    ]  # fmt: skip
    samples = Samples()
    cached = 0
    for _ in range(repeat):
        for inp in inputs:
            samples.start()
            decision = await decider.decide(inp)
            samples.stop()
            assert decision.load == "prefix", decision.notes
            cached = int(decision.notes[0].removeprefix("cached="))
            await asyncio.sleep(0)  # the loop runs the background write, as between requests
    await stickiness.drain()
    return samples, hashing_us, cached


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", help="settings.toml whose [routing] to evaluate")
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--fit", action="store_true", help="fit the scorer on the tuning half")
    parser.add_argument("--l2", type=float, default=0.005)
    parser.add_argument("--prompt-tokens", type=int, default=4096)
    parser.add_argument("--block-size", type=int, default=64)
    args = parser.parse_args()
    routing = load_settings(args.config).routing if args.config else RoutingSettings()
    items = load()
    tune = [i for i in items if i.split == "tune"]
    held = [i for i in items if i.split == "heldout"]
    if args.fit:
        scorer = fit(tune, args.l2)
        routing = routing.model_copy(update={"scorer": scorer})
        print("[routing.scorer]  # fitted on the tuning half")
        print(f"bias = {scorer.bias}")
        print("weights = {" + ", ".join(f"{k} = {v}" for k, v in scorer.weights.items()) + "}")
        print()
    judge = Judge(routing)
    threshold = best_threshold(tune, verdicts(judge, tune))
    held_verdicts = verdicts(judge, held)
    chosen = decisions(held_verdicts, threshold)
    configured = decisions(held_verdicts, judge.scorer.threshold)
    print(f"evaluation set: {len(items)} prompts ({len(tune)} tuning, {len(held)} held out)")
    print(f"threshold chosen on the tuning half: {threshold:.3f}  (configured: "
          f"{judge.scorer.threshold:.3f})")  # fmt: skip
    print(f"held-out agreement at the chosen threshold:     {agreement(held, chosen):.1%}")
    print(f"held-out agreement at the configured threshold: {agreement(held, configured):.1%}"
          "   (target >= 85%)")  # fmt: skip
    for lang in ("en", "zh"):
        pairs = [(i, t) for i, t in zip(held, configured, strict=True) if i.lang == lang]
        part = agreement([p[0] for p in pairs], [p[1] for p in pairs])
        print(f"  {lang}: {part:.1%} of {len(pairs)}")
    print("confusion matrix (held out, configured threshold):")
    print(confusion(held, configured))
    reasons = Counter(v.reason for v in held_verdicts)
    print("decided by: " + ", ".join(f"{r} {n}" for r, n in reasons.most_common()))
    wrong = [i for i, t in zip(held, configured, strict=True) if i.think != t]
    for item in wrong:
        print(f"  disagrees: {item.id} ({item.label}): {item.text[:70]!r}")
    print(f"cost per decision, the judge alone: {cost_us(judge, items, args.repeat)}")
    seam, hashing_us, cached = asyncio.run(
        seam_cost_us(routing, items, args.repeat, args.prompt_tokens, args.block_size)
    )
    print(f"cost per decision, the router seam with the prefix lookup ({args.prompt_tokens}-token "
          f"prompt, {cached} tokens cached, blocks of {args.block_size}), target p99 < 100 us:\n"
          f"  {seam}")  # fmt: skip
    print(f"hashing that prompt's blocks while it is prepared (off the event loop, once): "
          f"{hashing_us:.0f} us")  # fmt: skip


if __name__ == "__main__":
    main()
