"""The routing judge's cost in two or more source trees, side by side, on this tree's evaluation
conversations (testkit/routing_eval/eval.jsonl, both splits: only the requests are read):

    .venv/bin/python benchmarks/routing_trees.py TREE TREE [...] [--rounds 2] [--tries 7]

Each tree's judge (its default routing settings) decides every conversation 5 times, `--tries`
times over, and the fastest try is kept: on a loaded machine that is the judge's own cost, where
a p99 over every decision measures the load. The trees run in turn, `--rounds` times, each in a
process of its own (`git worktree add /tmp/before HEAD~1`, or `git archive REV | tar -x -C DIR`,
makes a tree); the first is the baseline of the printed ratios.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EVAL = ROOT / "testkit" / "routing_eval" / "eval.jsonl"

# Run inside each tree: its judge on the conversations of EVAL (the request of each).
MEASURE = """
import json, statistics, sys, time
sys.path.insert(0, sys.argv[1])
from gateway.config.routing import RoutingSettings
from gateway.pipeline.prompt_estimates import estimate_prompt_tokens
from gateway.routing.judge import Judge
from gateway.routing.train import request_of
judge = Judge(RoutingSettings())
with open(sys.argv[2], encoding="utf-8") as fh:
    requests = [request_of(json.loads(line)["messages"]) for line in fh if line.strip()]
fastest = []
for request in requests:
    tokens = estimate_prompt_tokens(request)
    best = float("inf")
    for _ in range(int(sys.argv[3])):
        start = time.thread_time_ns()
        for _ in range(5):
            judge.judge(request, "chat", tokens)
        best = min(best, (time.thread_time_ns() - start) / 5000)
    fastest.append(best)
print(json.dumps(fastest))
"""


def measure(tree: Path, tries: int) -> list[float]:
    out = subprocess.run(
        [sys.executable, "-c", MEASURE, str(tree), str(EVAL), str(tries)],
        check=True,
        capture_output=True,
        text=True,
        cwd=tree,
    ).stdout
    return sorted(json.loads(out))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trees", type=Path, nargs="+")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--tries", type=int, default=7)
    args = parser.parse_args()
    base: tuple[float, float, float] | None = None
    for n in range(args.rounds):
        for tree in args.trees:
            us = measure(tree.resolve(), args.tries)
            p50, p99, mean = statistics.median(us), us[int(len(us) * 0.99)], statistics.fmean(us)
            if base is None or tree == args.trees[0]:
                base = (p50, p99, mean)
            ratio = f"{p50 / base[0]:.2f}x / {p99 / base[1]:.2f}x / {mean / base[2]:.2f}x"
            print(f"round {n + 1} {tree}: {len(us)} conversations, fastest of {args.tries}: "
                  f"p50 {p50:.1f} us, p99 {p99:.1f} us, mean {mean:.1f} us "
                  f"(against the first tree: {ratio})", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
