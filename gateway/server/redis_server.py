"""Redis connection, with a private embedded `redis-server` when the configured one is down.

The embedded server runs as a child process with append-only persistence under
`redis.data_dir`, listens on a unix socket there (no port to collide with), logs to
`redis.log` there, and is stopped on exit. A server that restarts on a large append-only file
answers LOADING for a while: start-up waits for it to be ready for up to `redis.start_timeout_s`,
notices a child that exited, and says why it failed (the tail of the server's log). A
configured server that takes its connection but is slow to answer the first PING (busy, paused)
is waited for the same way, never taken for a down one: an embedded server started beside a live
one would split the keys between them.

One data directory has at most one embedded server: whoever starts it holds an exclusive lock
on `redis.lock` there for the server's lifetime. A process that finds the server of another one
running (a `keys` command beside the running gateway) uses it through its socket instead of
starting a second one; one that finds the lock held but nothing answering yet waits for it up
to `redis.start_timeout_s`, then fails saying who holds the directory.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import structlog
from redis.asyncio import BlockingConnectionPool, Redis, UnixDomainSocketConnection
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import BusyLoadingError, RedisError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from gateway.config.process import RedisSettings
from gateway.observability.redact import redact_url

log = structlog.get_logger("gateway.redis")

_POLL_S = 0.05


class RedisNotReady(RuntimeError):
    """Redis did not become ready: why, in words an operator can act on."""


async def _probe(client: Redis, timeout_s: float) -> bool | None:
    """True when Redis answers PING, False when nothing listens (refused, reset), None when
    something listens but does not answer within `timeout_s` (a busy or paused server: there,
    not gone). A server still loading its data raises BusyLoadingError."""
    try:
        return bool(await asyncio.wait_for(client.ping(), timeout=timeout_s))
    except BusyLoadingError:
        raise
    except (TimeoutError, RedisTimeoutError):
        return None
    except (RedisError, OSError):
        return False


async def wait_ready(
    client: Redis,
    *,
    deadline_s: float,
    timeout_s: float,
    child: asyncio.subprocess.Process | None = None,
    log_file: Path | None = None,
) -> None:
    """Wait until Redis answers PING (not LOADING) within `deadline_s`, or raise RedisNotReady
    saying why: the child exited (with its log's tail), it was still loading, or it never
    answered."""
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline_s
    loading = False
    while True:
        if child is not None and child.returncode is not None:
            raise RedisNotReady(
                f"the embedded redis-server exited with status {child.returncode}" + _tail(log_file)
            )
        try:
            if await _probe(client, timeout_s):
                if loading:
                    log.info("redis_loaded")
                return
        except BusyLoadingError:
            if not loading:
                log.info("redis_loading_data", deadline_s=deadline_s)
            loading = True
        if loop.time() >= end:
            what = "was still loading its data" if loading else "did not answer"
            raise RedisNotReady(
                f"Redis {what} after {deadline_s:g}s (redis.start_timeout_s)" + _tail(log_file)
            )
        await asyncio.sleep(_POLL_S)


def _tail(log_file: Path | None, lines: int = 5) -> str:
    if log_file is None or not log_file.exists():
        return ""
    last = log_file.read_text(errors="replace").splitlines()[-lines:]
    return "; its log ends: " + " | ".join(line.strip() for line in last) if last else ""


def _data_dir(data_dir: Path) -> Path:
    data_dir = data_dir.resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    return data_dir


def _lock(data_dir: Path) -> int | None:
    """An open descriptor holding the directory's exclusive lock, or None when another
    process holds it (the lock goes with the descriptor, or with its process)."""
    fd = os.open(data_dir / "redis.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def _holder(data_dir: Path) -> str:
    try:
        pid = (data_dir / "redis.lock").read_text().strip()
    except OSError:
        return "another process"
    return f"process {pid}" if pid else "another process"


async def _listening(settings: RedisSettings, sock: Path) -> bool:
    """Whether a server listens on `sock` (answering, loading its data, or busy)."""
    client = _client(settings, sock)
    try:
        return await _probe(client, settings.timeout_s) is not False
    except BusyLoadingError:
        return True
    finally:
        await client.aclose()


@asynccontextmanager
async def embedded_redis(settings: RedisSettings) -> AsyncIterator[Path]:
    """The embedded redis-server of `redis.data_dir`, ready; yields its unix socket path. One
    already running there (another process's) is used as it is; else this process starts one
    and holds the directory's lock until it stopped it."""
    data_dir = await asyncio.to_thread(_data_dir, settings.data_dir)
    sock = data_dir / "redis.sock"
    lock = None
    if not await _listening(settings, sock):
        lock = await asyncio.to_thread(_lock, data_dir)
    if lock is None:  # another process's server, running or starting: wait for it, use it
        holder = _holder(data_dir)
        client = _client(settings, sock)
        try:
            await wait_ready(
                client, deadline_s=settings.start_timeout_s, timeout_s=settings.timeout_s
            )
        except RedisNotReady as exc:
            raise RedisNotReady(
                f"the embedded Redis of {data_dir} belongs to {holder} (it holds "
                f"{data_dir / 'redis.lock'}), and its server did not answer: {exc}"
            ) from None
        finally:
            await client.aclose()
        log.info("embedded_redis_in_use", data_dir=str(data_dir), holder=holder)
        yield sock
        return
    try:
        async with _own_server(settings, data_dir) as own:
            yield own
    finally:
        os.close(lock)


@asynccontextmanager
async def _own_server(settings: RedisSettings, data_dir: Path) -> AsyncIterator[Path]:
    """Start redis-server on `data_dir` (whose lock this process holds) and stop it on exit."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise RedisNotReady(
            "Redis is unreachable and redis-server is not installed; "
            "run scripts/setup.sh or set redis.url"
        )
    sock, log_file = data_dir / "redis.sock", data_dir / "redis.log"
    # a server that died left it behind: no one answers there
    await asyncio.to_thread(sock.unlink, missing_ok=True)
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
        "--logfile",
        str(log_file),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        client = _client(settings, sock)
        try:
            await wait_ready(
                client,
                deadline_s=settings.start_timeout_s,
                timeout_s=settings.timeout_s,
                child=proc,
                log_file=log_file,
            )
        finally:
            await client.aclose()
        log.info("embedded_redis_started", data_dir=str(data_dir), pid=proc.pid)
        yield sock
    finally:
        if proc.returncode is None:
            proc.terminate()
            await proc.wait()
        log.info("embedded_redis_stopped")


def _client(settings: RedisSettings, unix_socket: Path | None = None) -> Redis:
    """A client whose pool makes callers wait for a free connection (up to `timeout_s`) rather
    than fail when every connection is busy. The socket timeouts go to the pool: redis-py
    ignores the client's own when it is handed a pool. A command that finds its pooled
    connection dead (Redis restarted) is tried once more on a new one; one that timed out is
    not (that would double the wait)."""
    seconds = settings.timeout_s
    options: dict[str, Any] = {
        "max_connections": settings.max_connections,
        "protocol": 2,  # the replies the scripts and readers are written for (RESP3 maps differ)
        "timeout": seconds,
        "socket_timeout": seconds,
        "socket_connect_timeout": seconds,
        "retry": Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
        "retry_on_error": [RedisConnectionError],
    }
    if unix_socket is None:
        pool = BlockingConnectionPool.from_url(settings.url, **options)
    else:
        pool = BlockingConnectionPool(
            connection_class=UnixDomainSocketConnection, path=str(unix_socket), **options
        )
    return Redis(connection_pool=pool)


@asynccontextmanager
async def open_redis(settings: RedisSettings) -> AsyncIterator[Redis]:
    client = _client(settings)
    try:
        up = await _probe(client, min(settings.timeout_s, 2.0))
    except BusyLoadingError:
        up = None
    if up is None:  # the configured server is there, loading its data or slow: wait for it
        await wait_ready(client, deadline_s=settings.start_timeout_s, timeout_s=settings.timeout_s)
        up = True
    if up:
        try:
            yield client
        finally:
            await client.aclose()
        return
    await client.aclose()
    if not settings.embedded:
        url = redact_url(settings.url)
        raise RedisNotReady(f"Redis at {url} is unreachable and redis.embedded is false")
    log.warning("redis_unreachable_starting_embedded", url=redact_url(settings.url))
    async with embedded_redis(settings) as sock:
        client = _client(settings, sock)
        try:
            yield client
        finally:
            await client.aclose()
