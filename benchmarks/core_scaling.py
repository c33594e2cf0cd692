"""How much more CPU-bound work this machine's cores do together than one of them does alone.

One round: a CPU-bound Python loop in one child process pinned to one core while the others
idle, and the same loop in one child per core, all at once (the order alternates from round to
round). The figure is the work done per second with every core busy over the work done with
one: on a machine whose cores are its own it reads the core count; on a guest whose virtual
CPUs share physical cores (SMT siblings) or a busy host, less. N serving processes can do at
most that many times one process's requests, and less once the load generator, the upstream
and Redis take their share of the same cores.

    .venv/bin/python benchmarks/core_scaling.py [--rounds 6] [--steps 5000000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys

# Run in each child: pinned to one core, the loop's wall-clock seconds on stdout.
_LOOP = """
import os, sys, time
os.sched_setaffinity(0, {int(sys.argv[1])})
t = time.perf_counter()
s = 0
for i in range(int(sys.argv[2])):
    s += i
print(time.perf_counter() - t)
"""


def _loops(cpus: list[int], steps: int) -> list[float]:
    """The loop's seconds in one child per cpu of `cpus`, all started at once."""
    children = [
        subprocess.Popen(
            [sys.executable, "-c", _LOOP, str(cpu), str(steps)], stdout=subprocess.PIPE, text=True
        )
        for cpu in cpus
    ]
    return [float(child.communicate()[0]) for child in children]


def scaling_rounds(rounds: int = 6, steps: int = 5_000_000) -> list[float]:
    """Per round: the work per second of every core busy over one core's alone."""
    cpus = sorted(os.sched_getaffinity(0))  # num_cores() of them
    ratios = []
    for i in range(rounds):
        if i % 2 == 0:
            alone, together = _loops(cpus[:1], steps)[0], _loops(cpus, steps)
        else:
            together, alone = _loops(cpus, steps), _loops(cpus[:1], steps)[0]
        ratios.append(sum(alone / t for t in together))
    return ratios


def num_cores() -> int:
    """The cores this process may run on: one loop each in `scaling_rounds`."""
    return len(os.sched_getaffinity(0))


def describe(ratios: list[float]) -> str:
    """The median and range of `scaling_rounds`."""
    return f"{statistics.median(ratios):.2f}x (rounds {min(ratios):.2f}..{max(ratios):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps", type=int, default=5_000_000)
    args = parser.parse_args()
    ratios = scaling_rounds(args.rounds, args.steps)
    print(f"{num_cores()} cores busy did {describe(ratios)} the work of one alone (a Python loop)")


if __name__ == "__main__":
    main()
