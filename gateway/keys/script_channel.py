"""One pipelined connection to Redis for script calls: the calls, and their replies in order.

`Channel` writes batches of calls and answers each as its reply is read (parsed by hiredis, in
C), retries a script unknown to the server as EVAL, fails every waiting call on a timeout or a
lost connection, and keeps the process's `BusyWait` turning while replies are due. The batcher
that feeds it, and what its calls guarantee, is `script_batch.py`.
"""

from __future__ import annotations

import asyncio
import hashlib
import select
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, cast

from hiredis import Reader, pack_command
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import InvalidResponse, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from plumbing.busy_wait import BusyWait
from plumbing.record import record

Arg = str | int | bytes
# The raw reply, or the exception the call failed with -> the caller's result (or it raises).
Parse = Callable[[Any], Any]
# What makes a connection not quiet (see `Channel.quiet`): a byte to read, or its end.
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
class Call:
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
    ) -> Call:
        return cls(("EVALSHA", script.sha, len(keys), *keys, *args), future, script, 0.0, parse)

    def as_eval(self) -> None:
        assert self.script is not None
        self.command = ("EVAL", self.script.source, *self.command[2:])
        self.script = None


class Waiter(Protocol):
    """A caller waiting for one reply."""

    @property
    def future(self) -> asyncio.Future[Any]: ...

    @property
    def parse(self) -> Parse | None: ...


def resolve(call: Waiter, reply: Any) -> None:
    """Hand `reply` (or the failure) to the caller waiting on `call`, through its parse."""
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


class Channel(asyncio.Protocol):
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
        self._pending: deque[Call] = deque()
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

    def send(self, calls: Sequence[Call]) -> None:
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

    def _answered(self) -> Call:
        """The oldest waiting call, no longer waited for."""
        self._busy.end()
        return self._pending.popleft()

    def data_received(self, data: bytes) -> None:
        self._reader.feed(data)
        retry: list[Call] = []
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
                resolve(call, reply)
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
            resolve(self._answered(), exc)
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
