"""Run Lua scripts on one pipelined Redis connection of their own.

Every request admits and settles with a script, so this is the hot path to Redis. All script
calls issued in one event-loop tick go out as one write (packed by hiredis, in C) on a connection
this batcher owns. A call made `at_once` while nothing is in flight or queued on the connection
goes out at once instead: the admission and the settlement of a request that is the only one
under way, which nothing would join (about 0.01 ms off a keyed request at one client, within
the noise of one run). Only then: with other requests under way more calls are coming, and one
write for them all costs less (with every call on a quiet connection sent at once, Redis spent
about 5% more CPU per request for two workers at 16 clients). Replies are parsed (by hiredis)
as they arrive and handed to their callers in order. Going through redis-py's pool instead
costs, per call, a pool checkout under a lock, a health check and a timeout task: several times
the CPU of the call itself on a gateway that serves thousands of requests a second. Each script
still runs atomically on its own.

- Scripts missing from the server's cache (a restart, SCRIPT FLUSH) are sent again as EVAL.
- A script's error reply fails only its caller (`ResponseError`).
- A caller may pass `parse`, which turns the raw reply (or the error the call failed with) into
  the future's result, or raises: it runs as the reply is read, so the caller's own work on the
  reply costs no extra turn of the event loop.
- Waiting for replies, the event loop keeps turning instead of sleeping, as the process's
  `BusyWait` (providers/busy_wait.py) says: each call awaited is one answer it waits for.
- No reply within `timeout_s` fails every call waiting on the connection with a redis-py
  `TimeoutError` and closes it; a lost connection fails them with `ConnectionError`. The next
  call opens a new connection. Both are `RedisError`s, which the gateway answers with a 503.
  Such a call may still have run (or may run later: a stalled Redis runs what it had read);
  a call that never reached Redis (no connection could be opened) fails with `Unsent`.
"""

from __future__ import annotations

import asyncio
import hashlib
import select
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

from hiredis import Reader, pack_command
from redis.asyncio import Redis
from redis.asyncio.connection import SSLConnection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import InvalidResponse, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from providers.busy_wait import BusyWait
from providers.record import record

Arg = str | int | bytes
# The raw reply, or the exception the call failed with -> the caller's result (or it raises).
Parse = Callable[[Any], Any]
# What makes a connection not quiet (see `_Channel.quiet`): a byte to read, or its end.
# POLLRDHUP (the peer closed its side) is Linux's; where there is no poll, nothing is quiet.
_POLL = getattr(select, "poll", None)
_READABLE = (
    select.POLLIN
    | select.POLLPRI
    | select.POLLERR
    | select.POLLHUP
    | getattr(select, "POLLRDHUP", 0)
    if _POLL is not None
    else 0
)


class Unsent(RedisConnectionError):
    """The call never reached Redis: it had no effect there."""


@record
class Script:
    source: str
    sha: str

    @classmethod
    def of(cls, source: str) -> Script:
        return cls(source, hashlib.sha1(source.encode()).hexdigest())


@dataclass(slots=True)
class _Call:
    command: tuple[Any, ...]  # hiredis types it as a 1-tuple; any length is packed
    future: asyncio.Future[Any]
    script: Script | None = None  # set while a NOSCRIPT reply may still be retried as EVAL
    deadline: float = 0.0
    parse: Parse | None = None

    @classmethod
    def evalsha(
        cls,
        script: Script,
        keys: Sequence[str],
        args: Sequence[Arg],
        future: asyncio.Future[Any],
        parse: Parse | None,
    ) -> _Call:
        return cls(("EVALSHA", script.sha, len(keys), *keys, *args), future, script, 0.0, parse)

    def as_eval(self) -> None:
        assert self.script is not None
        self.command = ("EVAL", self.script.source, *self.command[2:])
        self.script = None


def _resolve(call: _Call, reply: Any) -> None:
    future = call.future
    if future.done():  # the caller went away; it arranged for what it no longer waits for
        return
    if call.parse is not None:
        try:
            reply = call.parse(reply)
        except BaseException as exc:  # a refusal the caller's parse raised, or the failure
            reply = exc
    if isinstance(reply, BaseException):
        future.set_exception(reply)
    else:
        future.set_result(reply)


class _Channel(asyncio.Protocol):
    """One connection: writes batches of calls, answers them in order as replies arrive."""

    def __init__(
        self,
        timeout_s: float,
        loop: asyncio.AbstractEventLoop,
        busy: BusyWait,
    ) -> None:
        self._timeout_s = timeout_s
        self._busy = busy
        self._reader = Reader(protocolError=InvalidResponse, replyError=ResponseError)
        self._pending: deque[_Call] = deque()
        self._transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._poll: Any = None  # a select.poll on the socket, where there is one
        self.loop = loop  # kept: asking asyncio for it costs a getpid() each time (3.11)
        self.open = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport (uvloop's is not a subclass of asyncio.Transport).
        self._transport = cast(asyncio.Transport, transport)
        self.open = True
        sock = transport.get_extra_info("socket")
        if sock is not None and _POLL is not None:
            self._poll = _POLL()
            self._poll.register(sock.fileno(), _READABLE)

    def quiet(self) -> bool:
        """Open, no reply awaited, and nothing to read: no reply, and no end of the stream that
        the event loop has yet to see (Redis closed the connection; the next call must open a
        new one, not be written into this one). One poll(2) with no wait."""
        return self.open and not self._pending and self._poll is not None and not self._poll.poll(0)

    def send(self, calls: Sequence[_Call]) -> None:
        assert self._transport is not None
        loop = self.loop
        deadline = loop.time() + self._timeout_s
        for call in calls:
            call.deadline = deadline
        self._transport.write(b"".join(pack_command(call.command) for call in calls))
        self._pending.extend(calls)
        if self._timer is None:
            self._timer = loop.call_at(deadline, self._check_deadline)
        self._busy.begin(loop, len(calls))

    def _answered(self) -> _Call:
        """The oldest waiting call, no longer waited for."""
        self._busy.end()
        return self._pending.popleft()

    def data_received(self, data: bytes) -> None:
        self._reader.feed(data)
        retry: list[_Call] = []
        while self._pending:
            try:
                reply = self._reader.gets()
            except InvalidResponse as exc:
                self.fail(exc)
                return
            if reply is False:
                break
            call = self._answered()
            if (
                call.script is not None
                and isinstance(reply, ResponseError)
                and str(reply).startswith("NOSCRIPT")
            ):
                call.as_eval()
                retry.append(call)
            else:
                _resolve(call, reply)
        if retry:
            self.send(retry)

    def _check_deadline(self) -> None:
        self._timer = None
        if not self._pending:
            return
        loop = self.loop
        oldest = self._pending[0].deadline
        if oldest <= loop.time():
            self.fail(RedisTimeoutError(f"Redis did not answer within {self._timeout_s:g}s"))
        else:
            self._timer = loop.call_at(oldest, self._check_deadline)

    def fail(self, exc: BaseException) -> None:
        """Fail every waiting call with `exc` and drop the connection."""
        self.open = False
        while self._pending:
            _resolve(self._answered(), exc)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._transport is not None:
            self._transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self._poll = None  # its descriptor may soon stand for another file
        if self._pending:
            lost = RedisConnectionError("The connection to Redis was lost.")
            lost.__cause__ = exc
            self.fail(lost)
        self.open = False

    def close(self) -> None:
        self.open = False
        self._poll = None
        if self._transport is not None:
            self._transport.close()


class ScriptBatcher:
    """Runs scripts for many callers on one connection opened from `redis`'s settings."""

    def __init__(
        self, redis: Redis, *, timeout_s: float = 5.0, busy: BusyWait | None = None
    ) -> None:
        """`busy`: the process's `BusyWait` (default: one of its own that never spins)."""
        pool = redis.connection_pool
        self._busy = busy or BusyWait()
        self._kwargs = dict(pool.connection_kwargs)
        self._tls = issubclass(pool.connection_class, SSLConnection)
        self._timeout_s = timeout_s
        self._queue: list[_Call] = []  # the calls of this loop tick
        self._waiting: list[_Call] = []  # flushed while a connection is being opened
        self._channel: _Channel | None = None
        self._connecting: asyncio.Task[None] | None = None
        self._closed = False

    def run(
        self,
        script: Script,
        keys: Sequence[str],
        args: Sequence[Arg],
        parse: Parse | None = None,
        *,
        at_once: bool = False,
    ) -> asyncio.Future[Any]:
        """The script's result (through `parse`, if given), sent with whatever else this loop
        tick runs; or, `at_once`, at once if the connection is quiet."""
        channel = self._channel
        loop = channel.loop if channel is not None and channel.open else None
        loop = loop or asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        call = _Call.evalsha(script, keys, args, future, parse)
        if self._closed:
            _resolve(call, Unsent("The script connection is closed."))
            return future
        if not self._queue:
            if at_once and channel is not None and channel.quiet():
                channel.send([call])  # alone: nothing to batch it with, no tick to wait for
                return future
            loop.call_soon(self._flush)
        self._queue.append(call)
        return future

    async def aclose(self) -> None:
        self._closed = True
        if self._connecting is not None:
            self._connecting.cancel()
        if self._channel is not None:
            self._channel.close()
            self._channel = None

    def _flush(self) -> None:
        batch, self._queue = self._queue, []
        channel = self._channel
        if channel is not None and channel.open:
            channel.send(batch)
            return
        self._waiting += batch
        if self._connecting is None:
            self._connecting = asyncio.ensure_future(self._reconnect())

    async def _reconnect(self) -> None:
        try:
            channel = await asyncio.wait_for(self._open(), self._timeout_s)
            self._channel = channel
            waiting, self._waiting = self._waiting, []
            channel.send(waiting)
        except BaseException as exc:
            error = Unsent(f"Could not connect to Redis: {exc!r}")
            waiting, self._waiting = self._waiting, []
            for call in waiting:
                _resolve(call, error)
            if not isinstance(exc, Exception):
                raise
        finally:
            self._connecting = None

    async def _open(self) -> _Channel:
        loop = asyncio.get_running_loop()
        kw = self._kwargs

        def channel() -> _Channel:
            return _Channel(self._timeout_s, loop, self._busy)

        if "path" in kw:
            _, ch = await loop.create_unix_connection(channel, kw["path"])
        else:
            ssl = SSLConnection(**kw).ssl_context.get() if self._tls else None
            host = kw.get("host", "localhost")
            _, ch = await loop.create_connection(channel, host, kw.get("port", 6379), ssl=ssl)
        handshake: list[tuple[Arg, ...]] = []
        if kw.get("password"):
            user = (kw["username"],) if kw.get("username") else ()
            handshake.append(("AUTH", *user, kw["password"]))
        if kw.get("db"):
            handshake.append(("SELECT", kw["db"]))
        if handshake:
            calls = [_Call(command, loop.create_future()) for command in handshake]
            ch.send(calls)
            try:
                for call in calls:
                    await call.future
            except BaseException:
                ch.close()
                raise
        return ch
