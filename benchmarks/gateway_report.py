"""The report of `gateway_overhead.py`: medians over rounds, the per-path table, the CPU each
process spends per request, the throughput bound it sets, and the targets."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from testkit.http_load import Burst, Level

Rounds = list[dict[tuple[str, Level], Burst]]


@dataclass
class Target:
    name: str
    unit: str
    limit: float
    below: bool  # met when the figure is below the limit (else at or above it)
    rounds: list[float]

    def line(self) -> str:
        value = statistics.median(self.rounds)
        met = value < self.limit if self.below else value >= self.limit
        digits = {" ms": 3, "x": 2}.get(self.unit, 1)
        spread = f"rounds {min(self.rounds):.{digits}f}..{max(self.rounds):.{digits}f}"
        sign = "<" if self.below else ">="
        return (
            f"  {self.name}: {value:.{digits}f}{self.unit} ({spread}; "
            f"{sign} {self.limit:g}{self.unit}: {'met' if met else 'NOT met'})"
        )


def median_burst(rounds: Rounds, label: str, level: Level) -> Burst:
    bursts = [r[(label, level)] for r in rounds]

    def med(get: Callable[[Burst], float | None]) -> float | None:
        values = [v for v in map(get, bursts) if v is not None]
        return statistics.median(values) if values else None

    width = min(len(b.process_cpu_ms) for b in bursts)
    return Burst(
        med(lambda b: b.rps) or 0.0,
        med(lambda b: b.p50_ms) or 0.0,
        med(lambda b: b.p99_ms) or 0.0,
        med(lambda b: b.gateway_cpu_ms),
        med(lambda b: b.redis_cpu_ms) or 0.0,
        med(lambda b: b.mock_cpu_ms) or 0.0,
        med(lambda b: b.load_cpu_ms) or 0.0,
        tuple(statistics.median(b.process_cpu_ms[i] for b in bursts) for i in range(width)),
        med(lambda b: b.gateway_reads),
        med(lambda b: b.gateway_writes),
    )


def print_table(rounds: Rounds, paths: Sequence[str], levels: Sequence[Level]) -> None:
    print(
        f"\n{'path':8} {'conc':>4} {'mode':6} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} "
        f"{'added p50':>10} {'gw cpu ms/req':>14} {'redis cpu ms/req':>17} {'req/s vs direct':>16}"
        f" {'gw reads/writes per req':>24}"
    )
    for label in paths:
        for level in levels:
            b = median_burst(rounds, label, level)
            added = [
                r[(label, level)].p50_ms - r[("direct", level)].p50_ms
                for r in rounds
                if label != "direct"
            ]
            added_s = f"{statistics.median(added):10.3f}" if added else ""
            cpu = "" if b.gateway_cpu_ms is None else f"{b.gateway_cpu_ms:14.3f}"
            ratio = b.rps / median_burst(rounds, "direct", level).rps
            calls = (
                ""
                if b.gateway_reads is None or b.gateway_writes is None
                else f"{b.gateway_reads:.2f} / {b.gateway_writes:.2f}"
            )
            print(
                f"{label:8} {level.concurrency:4d} {level.mode:6} {b.rps:9.0f} {b.p50_ms:8.3f} "
                f"{b.p99_ms:8.3f} {added_s:>10} {cpu:>14} {b.redis_cpu_ms:17.3f} {ratio:16.2f}"
                f" {calls:>24}"
            )


def print_cpu_split(rounds: Rounds, paths: Sequence[str], level: Level, cores: int) -> None:
    """CPU per request of every process on each path at `level`, the throughput that `cores`
    cores allow at that cost (cores / total), and what that bound leaves a second worker."""
    print(
        f"\nCPU per request at c={level.concurrency} {level.mode}, ms (medians over rounds):\n"
        f"{'path':8} {'gateway':>8} {'redis':>7} {'upstream':>9} {'load gen':>9} {'total':>7} "
        f"{'req/s':>7} {'bound':>7} {'busy':>5}  gateway by process"
    )
    for label in paths:
        b = median_burst(rounds, label, level)
        bound = cores / b.total_cpu_ms * 1000
        each = " + ".join(f"{c:.3f}" for c in b.process_cpu_ms)
        print(
            f"{label:8} {b.gateway_cpu_ms or 0.0:8.3f} {b.redis_cpu_ms:7.3f} {b.mock_cpu_ms:9.3f} "
            f"{b.load_cpu_ms:9.3f} {b.total_cpu_ms:7.3f} {b.rps:7.0f} {bound:7.0f} "
            f"{b.rps / bound:5.0%}  {each}"
        )
    if "keyed" in paths and "keyed2" in paths:
        # R2 <= cores / (total CPU per request with 2 workers); R1 <= 1 / (one worker's CPU).
        measured = [
            cores / r[("keyed2", level)].total_cpu_ms * 1000 / r[("keyed", level)].rps
            for r in rounds
        ]
        ceiling = [
            cores * (r[("keyed", level)].gateway_cpu_ms or 0.0) / r[("keyed2", level)].total_cpu_ms
            for r in rounds
        ]
        print(
            f"2 workers / 1, bounded by CPU: at most {statistics.median(measured):.2f}x the "
            f"1-worker req/s measured here ({cores} cores / the 2-worker path's total CPU per "
            f"request), and at most {statistics.median(ceiling):.2f}x one worker that has a "
            "whole core to itself (as on an idle machine: cores x 1-worker gateway CPU / "
            "2-worker total)."
        )
