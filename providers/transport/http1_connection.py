"""One HTTP/1.1 connection of `providers/transport/http1.py`'s pool and the answer being read on it.

The errors, `Http1Response` (status, reason, lower-case headers, then the body by `readany()` or
`read()`), and `Connection`: an asyncio protocol that parses the answer with httptools as it
arrives, buffers its body (reading pauses above 1 MiB unread), enforces the exchange's deadline
with one timer, and on `release()` goes back to its pool only when the answer was read to its end
and both sides keep the connection alive.
"""

from __future__ import annotations

import asyncio
import zlib
from typing import TYPE_CHECKING, cast

import httptools

from plumbing.turn_writes import TurnWrites

if TYPE_CHECKING:
    from providers.transport.http1 import Http1Pool

# Stop reading from the socket while this much body is buffered and unread.
_HIGH_WATER = 1 << 20
_NO_BODY_STATUSES = frozenset({204, 304})


class Http1Error(Exception):
    """The connection failed, or the answer ended before its end."""


class ConnectTimeout(Http1Error):
    """No connection within the connect timeout."""


class Http1Timeout(Http1Error):
    """The exchange's deadline passed (the connection is closed: its answer is abandoned)."""


class Http1Response:
    """One answer: `status`, `reason`, `headers` (lower-case names), then its body."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self.status = 0
        self.reason = ""
        self.headers: dict[str, str] = {}

    @property
    def content_type(self) -> str:
        """The media type without parameters, lower-case ("application/octet-stream" if none)."""
        value = self.headers.get("content-type")
        if not value:
            return "application/octet-stream"
        return value.partition(";")[0].strip().lower()

    async def readany(self) -> bytes:
        return await self._conn.readany()

    def disarm(self) -> None:
        """No deadline from now on (the caller times each read itself)."""
        self._conn.disarm()

    async def read(self) -> bytes:
        parts = []
        while chunk := await self._conn.readany():
            parts.append(chunk)
        return b"".join(parts)

    def close(self) -> None:
        self._conn.release()


class Connection(asyncio.Protocol):
    """One TCP (or TLS) connection and the answer being read on it."""

    def __init__(self, pool: Http1Pool) -> None:
        self._pool = pool
        self._loop = pool.loop
        self._transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self.lost = False
        self.reused = False
        self._response: Http1Response | None = None
        self._headers_ready: asyncio.Future[Http1Response] | None = None
        self._body: list[bytes] = []
        self._buffered = 0
        self._waiter: asyncio.Future[None] | None = None
        self._complete = False
        self._error: Http1Error | None = None
        self._paused = False
        self._got_bytes = False
        self._until_eof = False  # no length, not chunked: the body ends with the connection
        self._inflate: zlib._Decompress | None = None
        self._keep_alive = False
        self._timer: asyncio.TimerHandle | None = None
        # From the request to the release: its answer is awaited or read (the pool's BusyWait
        # counts it; a process whose upstream answers wait to be read is busy, not waiting).
        self._awaited = False

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but have its methods.
        # Requests are sent once per loop turn, with the turn's others (turn_writes.py).
        self._transport = TurnWrites(cast(asyncio.Transport, transport), self._pool.turn)

    def data_received(self, data: bytes) -> None:
        self._got_bytes = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(Http1Error("the upstream switched protocols"))
        except httptools.HttpParserError as exc:
            self._fail(Http1Error(f"malformed answer: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self._no_longer_awaited()
        self._pool.forget(self)
        if self._response is not None and self._until_eof and not self._complete:
            self._finish()
        elif not self._complete:
            reason = f": {exc}" if exc else ""
            self._fail(Http1Error(f"the upstream closed the connection{reason}"))

    # httptools callbacks

    def on_message_begin(self) -> None:
        self._response = Http1Response(self)

    def on_status(self, status: bytes) -> None:  # may come in pieces
        assert self._response is not None
        self._response.reason += status.decode("latin-1")

    def on_header(self, name: bytes, value: bytes) -> None:
        assert self._response is not None
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        headers = self._response.headers
        headers[key] = f"{headers[key]}, {text}" if key in headers else text

    def on_headers_complete(self) -> None:
        response = self._response
        assert response is not None
        response.status = self._parser.get_status_code()
        headers = response.headers
        chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        self._until_eof = (
            "content-length" not in headers
            and not chunked
            and response.status not in _NO_BODY_STATUSES
        )
        encoding = headers.get("content-encoding", "").strip().lower()
        if encoding in ("gzip", "x-gzip"):
            self._inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
        elif encoding == "deflate":
            self._inflate = zlib.decompressobj()
        if self._headers_ready is not None and not self._headers_ready.done():
            self._headers_ready.set_result(response)

    def on_body(self, body: bytes) -> None:
        if self._inflate is not None:
            try:
                body = self._inflate.decompress(body)
            except zlib.error as exc:
                self._fail(Http1Error(f"undecodable {exc}"))
                return
        if body:
            self._body.append(body)
            self._buffered += len(body)
            if self._buffered > _HIGH_WATER and not self._paused and self._transport:
                self._paused = True
                self._transport.pause_reading()
            self._wake()

    def on_message_complete(self) -> None:
        self._keep_alive = self._parser.should_keep_alive()  # valid only inside this callback
        self._finish()

    # the pool's and the response's side

    async def send(self, request: bytes, deadline: float) -> Http1Response:
        """Writes `request`; returns the answer once its headers are in, by `deadline`."""
        assert self._transport is not None
        self._headers_ready = self._loop.create_future()
        self._timer = self._loop.call_at(deadline, self._expire)
        self._transport.write(request)
        if not self._awaited:
            self._awaited = True
            self._pool.busy.begin(self._loop)
        return await self._headers_ready

    def disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expire(self) -> None:
        self._timer = None
        self._fail(Http1Timeout("the deadline passed"))

    async def readany(self) -> bytes:
        while not self._body:
            if self._error is not None:
                raise self._error
            if self._complete:
                return b""
            self._waiter = self._loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        data = b"".join(self._body) if len(self._body) > 1 else self._body[0]
        self._body.clear()
        self._buffered = 0
        if self._paused and self._transport is not None:
            self._paused = False
            self._transport.resume_reading()
        return data

    def release(self) -> None:
        """Back to the pool if the answer was read to its end and the connection lives on."""
        self.disarm()
        self._no_longer_awaited()
        reusable = (
            self._complete
            and not self._body
            and self._error is None
            and not self.lost
            and not self._until_eof
            and self._keep_alive
        )
        if reusable:
            self._reset()
            self._pool.give_back(self)
        else:
            self.abort()

    def abort(self) -> None:
        self.disarm()
        self.lost = True
        self._no_longer_awaited()
        if self._transport is not None:
            self._transport.abort()

    @property
    def answered(self) -> bool:
        """Whether any byte of the current answer arrived."""
        return self._got_bytes

    def _reset(self) -> None:
        self._parser = httptools.HttpResponseParser(self)
        self._response = None
        self._headers_ready = None
        self._complete = False
        self._got_bytes = False
        self._until_eof = False
        self._keep_alive = False
        self._inflate = None
        self.reused = True

    def _finish(self) -> None:
        if self._inflate is not None:
            tail = self._inflate.flush()
            self._inflate = None
            if tail:
                self._body.append(tail)
        self._complete = True
        self._wake()

    def _fail(self, error: Http1Error) -> None:
        if self._error is None:
            self._error = error
        ready = self._headers_ready
        if ready is not None and not ready.done():
            ready.set_exception(error)
        self._wake()
        if self._transport is not None and not self.lost:
            self.abort()

    def _no_longer_awaited(self) -> None:
        if self._awaited:
            self._awaited = False
            self._pool.busy.end()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
