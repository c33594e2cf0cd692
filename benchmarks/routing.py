"""Routing by difficulty on the evaluation set (tests/gateway/routing_eval/prompts.jsonl).

Prints, for the default routing settings (or --config's), the threshold chosen on the tuning
half, the agreement with the labels on the held-out half (overall, per language), its confusion
matrix, the reasons decisions were made for, and the cost of one decision (rules + signals +
scorer, what every auto request pays on the CPU; the stickiness lookup is a Redis round trip on
follow-up turns only and is not part of it), p50 and p99 over every prompt, repeated.
`--fit` first fits the scorer's weights by logistic regression on the tuning half and prints them
as a `[routing.scorer]` block for settings.toml.

  .venv/bin/python benchmarks/routing.py [--config settings.toml] [--repeat 200] [--fit]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from gateway.routing.judge import Judge  # noqa: E402
from gateway.routing.signals import SIGNALS, signals_of  # noqa: E402
from gateway.routing_settings import RoutingSettings, ScorerSettings  # noqa: E402
from gateway.settings import load_settings  # noqa: E402
from gateway.tokens import estimate_prompt_tokens  # noqa: E402
from tests.gateway.routing_eval import (  # noqa: E402
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


def cost_us(judge: Judge, items: list[Item], repeat: int) -> tuple[float, float]:
    """p50 and p99 of one decision, in microseconds (each prompt decided `repeat` times)."""
    requests = [i.request() for i in items]
    tokens = [estimate_prompt_tokens(r) for r in requests]
    samples: list[float] = []
    clock = time.perf_counter_ns
    for _ in range(repeat):
        for request, n in zip(requests, tokens, strict=True):
            start = clock()
            judge.judge(request, "chat", n)
            samples.append((clock() - start) / 1000)
    samples.sort()
    return statistics.median(samples), samples[int(len(samples) * 0.99)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", help="settings.toml whose [routing] to evaluate")
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--fit", action="store_true", help="fit the scorer on the tuning half")
    parser.add_argument("--l2", type=float, default=0.005)
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
    p50, p99 = cost_us(judge, items, args.repeat)
    print(f"cost per decision: p50 {p50:.1f} us, p99 {p99:.1f} us   (target p99 < 100 us; "
          f"{len(items) * args.repeat} decisions)")  # fmt: skip


if __name__ == "__main__":
    main()
