"""What faults cost: usage records lost, capacity still held, seconds to recover.

A keyed gateway process (`python -m gateway serve`) on a redis-server of this run's own
(append-only, fsync per write: what Redis acknowledged survives its SIGKILL, so any loss
measured is the gateway's), in front of a mock upstream whose streams last about a second,
under steady streaming load from `--clients` clients on a key with max_concurrency 24. Each
scenario runs on fresh state:

  redis-pause    Redis frozen (SIGSTOP) for `--pause` seconds under load, then resumed
  redis-kill     Redis killed (SIGKILL) under load, restarted `--down` seconds later
  gateway-term   the gateway stopped with SIGTERM under load, then started again
  gateway-kill   the gateway killed (SIGKILL) under load, then started again

Once the fault is over the load stops (its requests in flight finish) and the run waits until
every admitted request is recorded, no slot or token is held, and a new request succeeds; the
seconds from the end of the fault until then are printed. Lost = admitted requests without a
usage record (the larger of: requests the upstream served minus records, and admissions never
settled). Held = slots whose lease has not run out and the tokens they reserve.

Targets: 0 lost and 0 held after recovery, except gateway-kill, where only the requests in
flight at that instant may be lost (their capacity comes back within one lease, 15 s).

    .venv/bin/python benchmarks/faults.py [--clients 16] [--pause 7] [--down 3] [--lease 15]
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from redis.asyncio import Redis  # noqa: E402

from testkit.fault_drills import (  # noqa: E402
    Account,
    GatewayProcess,
    Load,
    RedisProcess,
    account,
    create_key,
    recovered,
)
from testkit.mock_upstream import MockUpstream  # noqa: E402

MODEL = "echo-chunks-20-gap-0.05"  # a stream of about one second


@dataclass
class Stage:
    """One scenario's world: its Redis, gateway, key and load."""

    redis_server: RedisProcess
    gateway: GatewayProcess
    redis: Redis
    key: str
    key_id: str
    load: Load


@dataclass
class Result:
    scenario: str
    account: Account
    seconds: float
    may_lose: int

    def line(self) -> str:
        a = self.account
        target = "0 lost, 0 held" if self.may_lose == 0 else f"<= {self.may_lose} lost (in flight)"
        ok = a.clean(self.may_lose)
        return (
            f"{self.scenario:<14} {a.served:>8} {a.lost:>6} {a.live_slots:>6} "
            f"{a.held_tokens:>7} {self.seconds:>9.1f}   {target:<24} {'met' if ok else 'MISSED'}"
        )


Fault = Callable[[Stage, argparse.Namespace], Awaitable[int]]


async def redis_pause(stage: Stage, args: argparse.Namespace) -> int:
    stage.redis_server.send(signal.SIGSTOP)
    await asyncio.sleep(args.pause)
    stage.redis_server.send(signal.SIGCONT)
    return 0


async def redis_kill(stage: Stage, args: argparse.Namespace) -> int:
    stage.redis_server.stop(signal.SIGKILL)
    await asyncio.sleep(args.down)
    await stage.redis_server.start()
    return 0


async def gateway_term(stage: Stage, args: argparse.Namespace) -> int:
    await stage.gateway.stop(signal.SIGTERM)
    await stage.gateway.start()
    return 0


async def gateway_kill(stage: Stage, args: argparse.Namespace) -> int:
    in_flight = (await account(stage.redis, stage.key_id, 0)).live_slots
    await stage.gateway.stop(signal.SIGKILL)
    await stage.gateway.start()
    return in_flight


SCENARIOS: dict[str, Fault] = {
    "redis-pause": redis_pause,
    "redis-kill": redis_kill,
    "gateway-term": gateway_term,
    "gateway-kill": gateway_kill,
}


async def run_scenario(
    name: str, fault: Fault, mock: MockUpstream, args: argparse.Namespace, workdir: Path
) -> Result:
    redis_server = RedisProcess(workdir)
    await redis_server.start()
    redis = Redis.from_url(redis_server.url)
    gateway = GatewayProcess(
        workdir, redis_server.url, mock.base_url, MODEL, lease_s=args.lease, timeout_s=1.0
    )
    await gateway.start()
    key, key_id = await create_key(redis, max_concurrency=24, budget_tokens=10**9, rpm=10**6)
    load = Load(gateway.root, key, args.clients)
    stage = Stage(redis_server, gateway, redis, key, key_id, load)
    served_before = sum(1 for r in mock.requests if r.path.endswith("/chat/completions"))
    try:
        load.start()
        await asyncio.sleep(args.warmup)
        may_lose = await fault(stage, args)
        fault_over = time.monotonic()
        await load.stop()
        await redis.connection_pool.disconnect()  # Redis may have restarted under it
        served = sum(1 for r in mock.requests if r.path.endswith("/chat/completions"))
        _, after = await recovered(
            redis, key_id, served - served_before, gateway.root, key, may_lose=may_lose
        )
        return Result(name, after, time.monotonic() - fault_over, may_lose)
    finally:
        if gateway.proc is not None:
            await gateway.stop(signal.SIGTERM)
        await redis.aclose()
        redis_server.stop()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--pause", type=float, default=7.0, help="seconds Redis is frozen")
    parser.add_argument("--down", type=float, default=3.0, help="seconds Redis is dead")
    parser.add_argument("--lease", type=float, default=15.0, help="limits.slot_lease_s")
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds of load first")
    parser.add_argument("--only", choices=sorted(SCENARIOS), action="append")
    args = parser.parse_args()
    mock = MockUpstream()
    await mock.start()
    print(
        f"{'scenario':<14} {'admitted':>8} {'lost':>6} {'slots':>6} {'tokens':>7} "
        f"{'recover s':>9}   {'target':<24} result"
    )
    try:
        for name, fault in SCENARIOS.items():
            if args.only and name not in args.only:
                continue
            with tempfile.TemporaryDirectory() as workdir:
                result = await run_scenario(name, fault, mock, args, Path(workdir))
            print(result.line(), flush=True)
    finally:
        await mock.stop()


if __name__ == "__main__":
    asyncio.run(main())
