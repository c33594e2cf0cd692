"""Redis connection, with a private embedded `redis-server` when the configured one is down.

The embedded server runs as a child process with append-only persistence under
`redis.data_dir`, listens on a unix socket there (no port to collide with), and is stopped on exit.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import structlog
from redis.asyncio import BlockingConnectionPool, Redis, UnixDomainSocketConnection
from redis.exceptions import ConnectionError as RedisConnectionError

from gateway.redact import redact_url
from gateway.settings import RedisSettings

log = structlog.get_logger("gateway.redis")


async def _reachable(client: Redis) -> bool:
    try:
        return bool(await asyncio.wait_for(client.ping(), timeout=2))
    except (RedisConnectionError, OSError, TimeoutError):
        return False


def _prepare(data_dir: Path) -> Path:
    data_dir = data_dir.resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    (data_dir / "redis.sock").unlink(missing_ok=True)
    return data_dir


@asynccontextmanager
async def embedded_redis(data_dir: Path) -> AsyncIterator[Path]:
    """Run a private redis-server; yields its unix socket path."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError(
            "Redis is unreachable and redis-server is not installed; "
            "run scripts/setup.sh or set redis.url"
        )
    data_dir = await asyncio.to_thread(_prepare, data_dir)
    sock = data_dir / "redis.sock"
    proc = await asyncio.create_subprocess_exec(
        binary,
        "--port",
        "0",
        "--unixsocket",
        str(sock),
        "--unixsocketperm",
        "700",
        "--dir",
        str(data_dir),
        "--appendonly",
        "yes",
        "--save",
        "",
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        for _ in range(100):
            if sock.exists():
                break
            await asyncio.sleep(0.05)
        log.info("embedded_redis_started", data_dir=str(data_dir), pid=proc.pid)
        yield sock
    finally:
        if proc.returncode is None:
            proc.terminate()
            await proc.wait()
        log.info("embedded_redis_stopped")


def _client(settings: RedisSettings, unix_socket: Path | None = None) -> Redis:
    """A client whose pool makes callers wait for a free connection (up to the socket timeout)
    rather than fail when every connection is busy."""
    if unix_socket is None:
        pool = BlockingConnectionPool.from_url(
            settings.url, max_connections=settings.max_connections, timeout=settings.timeout_s
        )
    else:
        pool = BlockingConnectionPool(
            connection_class=UnixDomainSocketConnection,
            path=str(unix_socket),
            max_connections=settings.max_connections,
            timeout=settings.timeout_s,
        )
    return Redis(connection_pool=pool, socket_timeout=settings.timeout_s)


@asynccontextmanager
async def open_redis(settings: RedisSettings) -> AsyncIterator[Redis]:
    client = _client(settings)
    if await _reachable(client):
        try:
            yield client
        finally:
            await client.aclose()
        return
    await client.aclose()
    if not settings.embedded:
        url = redact_url(settings.url)
        raise RuntimeError(f"Redis at {url} is unreachable and redis.embedded is false")
    log.warning("redis_unreachable_starting_embedded", url=redact_url(settings.url))
    async with embedded_redis(settings.data_dir) as sock:
        client = _client(settings, sock)
        if not await _reachable(client):
            raise RuntimeError("the embedded redis-server did not start")
        try:
            yield client
        finally:
            await client.aclose()
