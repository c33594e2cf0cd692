"""`[server] workers = N`: N serving processes on one port, one supervisor.

Each worker is a whole gateway (`serve.run_server`) in a spawned process of its own, with its own
event loop, upstream connections and Redis connections; all of them bind the same host and port
with SO_REUSEPORT, and the kernel spreads incoming connections over them. Everything they share
lives in Redis already (keys, limits, usage, stickiness), so a request may land on any worker.

The supervisor (this process) serves nothing. It
- opens the embedded Redis once when the configured one is unreachable, and hands its socket to
  the workers (one private `redis-server`, not one per worker);
- draws one thinking-signing secret when none is set, so a signature made by one worker is
  trusted by the others;
- with a local engine: names the socket where worker 0 serves it to the others
  (`cluster.internal_socket`, default `server.run_dir/engine-<port>.sock`) and draws the secret
  that opens it (`cluster.secret`) when none is set (gateway/engine_host/worker_share.py);
- forwards SIGTERM/SIGINT to every worker (each drains its streams within the grace period) and
  stops all of them when one exits on its own, with that worker's exit status.

Per-process state stays per process: Prometheus metrics (`/metrics` shows the worker that
answered the scrape), breakers and the 2 s key cache. The local engine lives in worker 0 only;
if worker 0 exits, the others are stopped like after any worker's exit (their requests in
flight on the engine have already failed with a clear error by then: the socket closed).
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import secrets
import signal
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess

import structlog
from pydantic import SecretStr

from gateway.config.cluster import ClusterSettings
from gateway.config.process import RedisSettings
from gateway.config.settings import Settings
from gateway.server.redis_server import open_redis
from gateway.server.serve import serve_process

log = structlog.get_logger("gateway.server.workers")

# How long past the grace period a worker gets before it is killed.
_KILL_AFTER_S = 5.0


def serve_workers(settings: Settings) -> int:
    """Run `settings.server.workers` workers until a signal (0) or a worker's own exit (its
    status, or 1)."""
    return asyncio.run(_supervise(settings))


@asynccontextmanager
async def _shared_redis(settings: RedisSettings) -> AsyncIterator[RedisSettings]:
    """The Redis settings the workers get: the configured server, or an embedded one that the
    supervisor runs for all of them."""
    async with open_redis(settings) as client:
        kwargs = client.connection_pool.connection_kwargs
        if "path" not in kwargs or settings.url.startswith("unix://"):
            yield settings
            return
        yield settings.model_copy(update={"url": f"unix://{kwargs['path']}", "embedded": False})


def worker_settings(settings: Settings, redis: RedisSettings) -> Settings:
    """What every worker is started with: the shared Redis, one signing secret, and with a
    local engine the socket and secret of worker 0's engine."""
    messages = settings.messages
    if messages.signing_secret is None:
        log.warning(
            "thinking_signing_secret_unset",
            hint="set GATEWAY_MESSAGES__SIGNING_SECRET so thinking signatures survive restarts",
        )
        secret = SecretStr(secrets.token_hex(32))
        messages = messages.model_copy(update={"signing_secret": secret})
    update: dict[str, object] = {"redis": redis, "messages": messages}
    if settings.shares_engine:
        update["cluster"] = _engine_link(settings)
    return settings.model_copy(update=update)


def _engine_link(settings: Settings) -> ClusterSettings:
    """The cluster settings naming worker 0's engine socket and the secret that opens it."""
    cluster = settings.cluster
    update: dict[str, object] = {"internal_socket": settings.engine_socket()}
    if cluster.secret is None:
        update["secret"] = SecretStr(secrets.token_hex(32))
    return cluster.model_copy(update=update)


async def _supervise(settings: Settings) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    ctx = mp.get_context("spawn")
    async with _shared_redis(settings.redis) as redis:
        shared = worker_settings(settings, redis)
        socket_path = shared.cluster.internal_socket if settings.shares_engine else None
        if socket_path is not None:
            socket_path.parent.mkdir(parents=True, exist_ok=True)
        procs = [
            ctx.Process(target=_run_worker, args=(shared, i), name=f"gateway-worker-{i}")
            for i in range(settings.server.workers)
        ]
        for proc in procs:
            proc.start()
        log.info("workers_started", pids=[p.pid for p in procs], port=settings.server.port)
        exited = asyncio.ensure_future(asyncio.to_thread(_any_exit, procs))
        stopping = asyncio.ensure_future(stop.wait())
        await asyncio.wait((exited, stopping), return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        status = 0 if stop.is_set() else _first_status(procs)
        if status:
            log.error("worker_exited", status=status)
        await asyncio.to_thread(_stop_all, procs, settings.server.grace_period_s + _KILL_AFTER_S)
        await exited
        if socket_path is not None:
            socket_path.unlink(missing_ok=True)  # a killed worker 0 leaves it behind
    return status


def _any_exit(procs: Sequence[BaseProcess]) -> None:
    """Blocks until one of `procs` has exited."""
    wait([p.sentinel for p in procs])


def _first_status(procs: Sequence[BaseProcess]) -> int:
    for proc in procs:
        if proc.exitcode is not None:
            return proc.exitcode or 1
    return 1


def _stop_all(procs: Sequence[BaseProcess], timeout_s: float) -> None:
    """SIGTERM every worker still running (each drains within its grace period), then wait;
    kill the ones that outlive `timeout_s`."""
    for proc in procs:
        if proc.exitcode is None:
            proc.terminate()
    for proc in procs:
        proc.join(timeout_s)
        if proc.exitcode is None:
            proc.kill()
            proc.join()


def _run_worker(settings: Settings, index: int) -> None:
    """A worker's entry point (in a spawned process)."""
    serve_process(settings, worker=index, reuse_port=True)
