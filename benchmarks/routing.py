"""Routing by difficulty on the evaluation set (testkit/routing_eval/eval.jsonl).

Prints, for the default routing settings (or --config's), on the held-out split (never used to
fit or tune): agreement with the labels overall, adversarial vs not, per category, language and
client; the two error rates (fast sent to thinking: tokens and latency spent; think sent to
fast: quality lost); per rule (and the model, and stickiness) how many decisions it made, how
many were right and how many wrong each way; the same on the tune split;
and the cost of one decision, p50 and p99 over every item, repeated:
  - the judge alone (the ask's extraction, rules and the learned model), against the targets;
  - the whole router seam (`Decider.decide`) for an auto model with a local and an upstream
    route, each item's conversation behind a system prompt, its prepared prompt of
    `--prompt-tokens` tokens whose every reusable block the local engine caches, its queue over
    `local_max_queue`: the judge, the conversation's hash, the background stickiness write (its
    task; the Redis round trip itself is not on the request's path), the engine's load and the
    prefix lookup by `LocalProvider.fit`, through a real `AsyncEngine` and `BlockManager` (no
    model, the engine's thread not started), and the kept=prefix choice.
Also the cost of hashing that prompt's blocks, paid once while it is prepared, off the loop.
Targets: held-out agreement >= 93% overall, >= 88% in every language and >= 90% on the
adversarial half, fast sent to thinking < 7%, think sent to fast < 8%, judge p99 < 100 us.

  .venv/bin/python benchmarks/routing.py [--config settings.toml] [--repeat 50]
      [--prompt-tokens 4096] [--block-size 64] [--misses]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import time
from dataclasses import MISSING, fields
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


from backend.engine.async_engine import AsyncEngine  # noqa: E402
from backend.engine.blocks import BlockManager  # noqa: E402
from backend.engine.engine_config import EngineConfig  # noqa: E402
from backend.engine.interface import EngineStats  # noqa: E402
from backend.engine.request import Request  # noqa: E402
from backend.engine.sampling_params import SamplingParams  # noqa: E402
from gateway.config.routing import RoutingSettings  # noqa: E402
from gateway.config.settings import load_settings  # noqa: E402
from gateway.pipeline.prompt_estimates import estimate_prompt_tokens  # noqa: E402
from gateway.routing.aliases import Route  # noqa: E402
from gateway.routing.decide import Decider, RoutingInput  # noqa: E402
from gateway.routing.judge import Judge, Verdict  # noqa: E402
from gateway.routing.policy import KeyPolicy  # noqa: E402
from gateway.routing.sticky import Stickiness  # noqa: E402
from providers.local.provider import LocalProvider  # noqa: E402
from providers.types import ChatRequest, Message, PreparedPrompt  # noqa: E402
from testkit.routing_eval import Item, Report, by, load, verdicts  # noqa: E402


def line(name: str, report: Report) -> str:
    return (
        f"  {name:<22} {report.agreement:6.1%} of {report.n:>3}   fast->think "
        f"{report.fast_on:5.1%}   think->fast {report.think_off:5.1%}"
    )


def evaluate(judge: Judge, items: list[Item], title: str, misses: bool) -> None:
    """Agreement of the judge's decisions with `items`' labels, broken down (see the module)."""
    found = verdicts(judge, items)
    thinking = [v.thinking for v in found]
    overall = Report.of(items, thinking)
    print(f"{title}: {len(items)} items")
    print(line("overall", overall) + "   (targets: >= 93%, fast->think < 7%, think->fast < 8%)")
    adversarial = by(items, thinking, "adversarial")
    print(line("adversarial", adversarial["True"]) + "   (target: >= 90%)")
    print(line("not adversarial", adversarial["False"]))
    for key in ("lang", "client", "category"):
        print(f" per {key}:" + ("   (target: >= 88% each)" if key == "lang" else ""))
        for value, report in by(items, thinking, key).items():
            print(line(value, report))
    print(" per decider (rule, sticky or model): decisions, right, wrong as fast->think / "
          "think->fast")  # fmt: skip
    for reason, tally in per_reason(items, found).items():
        print(f"  {reason:<26} {tally[0]:>4} decided {tally[1]:>4} right   "
              f"{tally[2]:>3} fast->think {tally[3]:>3} think->fast")  # fmt: skip
    wrong = [(i, v) for i, v in zip(items, found, strict=True) if i.think != v.thinking]
    if misses:
        for item, v in wrong:
            score = "" if v.score is None else f" {v.score:.2f}"
            text = item.text()[-90:].replace("\n", " ")
            print(f"  miss {item.id} ({item.label}, {item.category}) {v.reason}{score}: {text!r}")
    print()


def per_reason(items: list[Item], found: list[Verdict]) -> dict[str, list[int]]:
    """For each reason a decision gave (rule:<name>@<v>, sticky, model): [decided, right,
    fast sent to thinking, think sent to fast], the rules first in the order they decided."""
    tallies: dict[str, list[int]] = {}
    for item, verdict in zip(items, found, strict=True):
        tally = tallies.setdefault(verdict.reason, [0, 0, 0, 0])
        tally[0] += 1
        if item.think == verdict.thinking:
            tally[1] += 1
        else:
            tally[2 if verdict.thinking else 3] += 1
    return dict(sorted(tallies.items(), key=lambda kv: (not kv[0].startswith("rule:"), kv[0])))


class Samples:
    """Each decision's wall-clock time and this thread's CPU time during it, microseconds (on a
    shared machine the wall clock also counts the time other processes held the core; the CPU
    time does not, so its p99 is the judge's own tail there)."""

    def __init__(self) -> None:
        self.wall: list[float] = []
        self.cpu: list[float] = []
        self._start = self._cpu_start = 0

    def start(self) -> None:
        self._cpu_start = time.thread_time_ns()
        self._start = time.perf_counter_ns()

    def stop(self) -> None:
        self.wall.append((time.perf_counter_ns() - self._start) / 1000)
        self.cpu.append((time.thread_time_ns() - self._cpu_start) / 1000)

    def __str__(self) -> str:
        p50, p99 = percentiles(self.wall)
        cpu50, cpu99 = percentiles(self.cpu)
        cpu_mean = sum(self.cpu) / len(self.cpu)
        return (
            f"p50 {p50:.1f} us, p99 {p99:.1f} us wall-clock; CPU p50 {cpu50:.1f} us, p99 "
            f"{cpu99:.1f} us, mean {cpu_mean:.1f} us ({len(self.wall)} decisions)"
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

    def set(self, key: str, value: str, ex: int) -> None:
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
            ChatRequest(model="m", messages=(system, *i.request().messages), prepared=prepared),
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
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--prompt-tokens", type=int, default=4096)
    parser.add_argument("--block-size", type=int, default=64)
    parser.add_argument("--misses", action="store_true", help="list every held-out miss")
    args = parser.parse_args()
    routing = load_settings(args.config).routing if args.config else RoutingSettings()
    items = load()
    judge = Judge(routing)
    print(f"threshold {judge.scorer.threshold:.2f}; rules: "
          + ", ".join(r.reason.removeprefix("rule:") for r in judge.rules))  # fmt: skip
    held = [i for i in items if i.split == "heldout"]
    evaluate(judge, held, "held-out split (never used to fit or tune)", args.misses)
    evaluate(judge, [i for i in items if i.split == "tune"], "tune split", False)
    cost = cost_us(judge, items, args.repeat)
    print(f"cost per decision, the judge alone (target p99 < 100 us):\n  {cost}")
    seam, hashing_us, cached = asyncio.run(
        seam_cost_us(routing, items, args.repeat, args.prompt_tokens, args.block_size)
    )
    print(f"cost per decision, the router seam with the prefix lookup ({args.prompt_tokens}-token "
          f"prompt, {cached} tokens cached, blocks of {args.block_size}):\n"
          f"  {seam}")  # fmt: skip
    print(f"hashing that prompt's blocks while it is prepared (off the event loop, once): "
          f"{hashing_us:.0f} us")  # fmt: skip


if __name__ == "__main__":
    main()
