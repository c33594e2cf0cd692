"""Deadlines for tests whose work is CPU-bound and long (compiling kernels, a subprocess that
imports torch): a deadline that fits an idle machine is scaled by how busy this one is, so the
suite does not fail on a loaded CI runner for lack of time alone.

`scaled(seconds)`: `seconds` times the machine's load per CPU (the larger of the 1- and 5-minute
load averages over the CPUs this process may use), at least 1 and at most `_MOST`;
`TEST_TIME_SCALE` in the environment sets the factor instead."""

from __future__ import annotations

import os

_MOST = 10.0  # a wedged test still ends


def load_factor() -> float:
    """How many times longer CPU-bound work takes here than on an idle machine (estimated)."""
    forced = os.environ.get("TEST_TIME_SCALE")
    if forced:
        return max(1.0, float(forced))
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    try:
        one, five, _ = os.getloadavg()
    except OSError:
        return 1.0
    return min(max(1.0, max(one, five) / cpus), _MOST)


def scaled(seconds: float) -> float:
    return seconds * load_factor()
