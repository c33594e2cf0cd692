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

Upstream rows (a mock upstream of the row's own, short answers):

  model-failing    `--clients` clients on a healthy model while `--failing-clients` clients
                   ask another model of the same provider that answers 500, for `--duration`
                   seconds: healthy-model requests refused (target 0)
  upstream-back    `--clients` clients on the upstream's one model; the upstream is killed,
                   stays down `--down` seconds (its breaker opens), and restarts on its port:
                   seconds from the restart to the first 200 (target <= 1) and until every
                   client has had a 200 (full concurrency, target <= 2)

One more scenario runs two cluster nodes (the tiny demo checkpoint, a Redis of its own):

  frozen-peer    node b holds a system prompt; node a forwards turns that start with it to
                 b: `--mid-stream` long streamed answers, then b is frozen (SIGSTOP: its port
                 accepts, nothing answers) once each streamed a token, then `--conversations`
                 turns (half JSON, half streamed) reach a while b is frozen and still live.

Its row counts the forwarded requests (those a placed on b), how many were answered (served
by a), how many ended with an error (in the stream, for those b stopped mid-answer), how many
hung (nothing after `--hang` seconds), and the longest wait from b's freeze or the request's
send, whichever is later. Target: 0 hung, every request done within the forwarding deadlines
(`cluster.forward_first_byte_timeout_s`, `forward_idle_timeout_s`) plus the time to answer.

    .venv/bin/python benchmarks/faults.py [--clients 16] [--pause 7] [--down 3] [--lease 15]
        [--duration 5] [--failing-clients 16] [--conversations 8] [--mid-stream 2]
        [--only NAME ...] (a scenario, model-failing, upstream-back or frozen-peer)
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
sys.path.insert(0, str(ROOT / "benchmarks"))

from faults_frozen_peer import frozen_peer  # noqa: E402
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


SHORT = "echo-chunks-5"  # a short answer: the upstream rows time single answers


async def model_failing(args: argparse.Namespace, workdir: Path) -> str:
    """Healthy-model requests refused while another model of the same provider fails."""
    mock = MockUpstream()
    await mock.start()
    redis_server = RedisProcess(workdir)
    await redis_server.start()
    redis = Redis.from_url(redis_server.url)
    gateway = GatewayProcess(
        workdir, redis_server.url, mock.base_url, SHORT, models={"failing": "fail-500"}
    )
    try:
        await gateway.start()
        key, _ = await create_key(redis, budget_tokens=10**9, rpm=10**7)
        healthy = Load(gateway.root, key, args.clients)
        failing = Load(gateway.root, key, args.failing_clients, model="failing")
        healthy.start()
        failing.start()
        await asyncio.sleep(args.duration)
        await failing.stop()
        await healthy.stop()
        asked = sum(healthy.statuses.values())
        refused = asked - healthy.statuses["200"]
        failed = sum(failing.statuses.values())
        return (
            f"{'model-failing':<15} healthy {asked:>6} refused {refused:>4} (target 0) "
            f"{'met' if refused == 0 else 'MISSED'}; failing-model answers {failed} "
            f"{dict(failing.statuses)}"
        )
    finally:
        if gateway.proc is not None:
            await gateway.stop(signal.SIGTERM)
        await redis.aclose()
        redis_server.stop()
        await mock.stop()


async def upstream_back(args: argparse.Namespace, workdir: Path) -> str:
    """Seconds from an upstream's restart to the first 200 and to every client's."""
    mock = MockUpstream()
    url = await mock.start()
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    redis_server = RedisProcess(workdir)
    await redis_server.start()
    redis = Redis.from_url(redis_server.url)
    gateway = GatewayProcess(workdir, redis_server.url, url, SHORT)
    load: Load | None = None
    try:
        await gateway.start()
        key, _ = await create_key(redis, budget_tokens=10**9, rpm=10**7)
        load = Load(gateway.root, key, args.clients)
        load.start()
        await asyncio.sleep(args.warmup)
        await mock.stop()
        await asyncio.sleep(args.down)
        down = sum(load.statuses.values()) - load.statuses["200"]
        await mock.start(port)
        back = time.monotonic()
        for _ in range(3000):  # up to 30 s
            if load.all_ok_after(back) is not None:
                break
            await asyncio.sleep(0.01)
        first, full = load.first_ok_after(back), load.all_ok_after(back)
        first_s = None if first is None else first - back
        full_s = None if full is None else full - back
        met = first_s is not None and first_s <= 1 and full_s is not None and full_s <= 2
        shown = [f"{x:.3f}" if x is not None else "never" for x in (first_s, full_s)]
        return (
            f"{'upstream-back':<15} first 200 after {shown[0]} s (target <= 1), all "
            f"{args.clients} clients after {shown[1]} s (target <= 2) "
            f"{'met' if met else 'MISSED'}; {down} answers refused while down"
        )
    finally:
        if load is not None:
            await load.stop()
        if gateway.proc is not None:
            await gateway.stop(signal.SIGTERM)
        await redis.aclose()
        redis_server.stop()
        await mock.stop()


UPSTREAM_ROWS: dict[str, Callable[[argparse.Namespace, Path], Awaitable[str]]] = {
    "model-failing": model_failing,
    "upstream-back": upstream_back,
}

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
    parser.add_argument("--duration", type=float, default=5.0, help="model-failing seconds")
    parser.add_argument("--failing-clients", type=int, default=16, help="on the failing model")
    parser.add_argument(
        "--only", choices=sorted([*SCENARIOS, *UPSTREAM_ROWS, "frozen-peer"]), action="append"
    )
    parser.add_argument("--conversations", type=int, default=8, help="frozen-peer: new turns")
    parser.add_argument("--mid-stream", type=int, default=2, help="frozen-peer: cut answers")
    parser.add_argument("--hang", type=float, default=60.0, help="frozen-peer: seconds = hung")
    args = parser.parse_args()
    wanted = [n for n in SCENARIOS if not args.only or n in args.only]
    if wanted:
        mock = MockUpstream()
        await mock.start()
        print(
            f"{'scenario':<14} {'admitted':>8} {'lost':>6} {'slots':>6} {'tokens':>7} "
            f"{'recover s':>9}   {'target':<24} result"
        )
        try:
            for name in wanted:
                with tempfile.TemporaryDirectory() as workdir:
                    result = await run_scenario(name, SCENARIOS[name], mock, args, Path(workdir))
                print(result.line(), flush=True)
        finally:
            await mock.stop()
    for name, row in UPSTREAM_ROWS.items():
        if args.only and name not in args.only:
            continue
        with tempfile.TemporaryDirectory() as workdir:
            print(await row(args, Path(workdir)), flush=True)
    if not args.only or "frozen-peer" in args.only:
        print(
            f"{'scenario':<14} {'forwarded':>9} {'answered':>8} {'error':>6} {'hung':>5} "
            f"{'max s':>6}   target"
        )
        with tempfile.TemporaryDirectory() as workdir:
            print(await frozen_peer(args, Path(workdir)), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
