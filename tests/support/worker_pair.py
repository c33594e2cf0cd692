"""Worker 0 (the engine) and worker 1 (no model) of `[server] workers = 2`, as two apps in this
process: each on a port of its own (so a test picks the worker it talks to), worker 0 also on
the engine socket, the same settings the supervisor hands the real processes."""

from __future__ import annotations

import asyncio
import socket
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from pydantic import SecretStr
from redis.asyncio import Redis

from gateway.app import create_app
from gateway.config.settings import Settings
from gateway.keys.records import KeyCreate
from gateway.keys.store import KeyStore
from gateway.resources import ROUTER
from gateway.server.http_server import GatewayRunner
from providers.local.provider import LocalProvider
from providers.local.worker_engine import SharedLocalProvider
from testkit.gateway_app import REDIS_URL, engines_loaded
from tests.support.local_gateway import local_settings

SECRET = "worker-pair-test-secret-0123456789"


def pair_settings(prefix: str, model_path: Path, engine_socket: Path, **engine: Any) -> Settings:
    """`local_settings` with two workers, as the supervisor passes them on."""
    base = local_settings(prefix, model_path, **engine)
    return base.model_copy(
        update={
            "server": base.server.model_copy(
                update={"workers": 2, "stream_headers_after_s": 30.0, "keepalive_s": 30.0}
            ),
            "cluster": base.cluster.model_copy(
                update={"secret": SecretStr(SECRET), "internal_socket": engine_socket}
            ),
            "messages": base.messages.model_copy(
                update={"signing_secret": SecretStr("worker-pair-signing")}
            ),
        }
    )


async def serve_worker(
    stack: AsyncExitStack, settings: Settings, worker: int
) -> tuple[web.Application, str]:
    """Start worker `worker` of `settings` on a free port (worker 0 also on the engine
    socket); it stops when `stack` closes."""
    app = create_app(settings, worker=worker)
    runner = GatewayRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=1)
    await runner.setup()
    stack.push_async_callback(runner.cleanup)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    await web.SockSite(runner, sock).start()
    if worker == 0:
        path = settings.cluster.internal_socket
        assert path is not None
        await web.UnixSite(runner, str(path)).start()
        await engines_loaded(app, 600)
    return app, f"http://127.0.0.1:{sock.getsockname()[1]}"


@dataclass
class WorkerPair:
    settings: Settings
    prefix: str
    stack: AsyncExitStack
    roots: dict[int, str] = field(default_factory=dict)  # worker index -> http root
    apps: dict[int, web.Application] = field(default_factory=dict)

    async def start(self, worker: int) -> None:
        self.apps[worker], self.roots[worker] = await serve_worker(
            self.stack, self.settings, worker
        )

    def provider(self, worker: int) -> Any:
        return self.apps[worker][ROUTER].providers["local"]

    @property
    def engine_provider(self) -> LocalProvider:
        provider = self.provider(0).local  # worker 0's, loaded
        assert isinstance(provider, LocalProvider)
        return provider

    @property
    def shared_provider(self) -> SharedLocalProvider:
        provider = self.provider(1)
        assert isinstance(provider, SharedLocalProvider)
        return provider

    async def key(self, **policy: Any) -> str:
        redis = Redis.from_url(REDIS_URL)
        try:
            body = KeyCreate(name="worker-pair", policy=policy or None)
            secret, _ = await KeyStore(redis, prefix=self.prefix).create(body)
        finally:
            await redis.aclose()
        return secret


async def until(check: Callable[[], Awaitable[bool]], within_s: float = 30.0) -> None:
    """Poll `check` until it holds (a readiness wait with a deadline, not a sleep)."""
    deadline = asyncio.get_running_loop().time() + within_s
    while not await check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"not within {within_s} s: {check.__name__}")
        await asyncio.sleep(0.02)


async def ready(root: str) -> bool:
    async with aiohttp.ClientSession() as session, session.get(f"{root}/readyz") as resp:
        return resp.status == 200


@asynccontextmanager
async def open_worker_pair(
    model_path: Path, workdir: Path, *, start_engine_first: bool = True, **engine: Any
) -> AsyncIterator[WorkerPair]:
    """Both workers started and ready (worker 1 polls until worker 0's engine answers); a
    unique Redis prefix, removed afterwards. `start_engine_first=False`: worker 1 starts first
    (the test then starts worker 0: `pair.start(0)`)."""
    prefix = f"test:{uuid.uuid4().hex}:"
    settings = pair_settings(prefix, model_path, workdir / f"{uuid.uuid4().hex[:8]}.sock", **engine)
    redis = Redis.from_url(REDIS_URL)
    async with AsyncExitStack() as stack:
        pair = WorkerPair(settings, prefix, stack)
        for worker in (0, 1) if start_engine_first else (1,):
            await pair.start(worker)
        if start_engine_first:
            await until(lambda: ready(pair.roots[1]))
        try:
            yield pair
        finally:
            keys = [k async for k in redis.scan_iter(match=f"{prefix}*", count=1000)]
            if keys:
                await redis.delete(*keys)
            await redis.aclose()
