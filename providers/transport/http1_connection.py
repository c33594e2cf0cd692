"""One HTTP/1.1 connection of `providers/transport/http1.py`'s pool and the answer being read on it.

`Connection`: an asyncio protocol that parses the answer with httptools as it
arrives, buffers its body (reading pauses above 1 MiB unread), enforces the exchange's deadline
with one timer, and on `release()` goes back to its pool only when the answer was read to its end
and both sides keep the connection alive.

What an upstream may send is bounded (`AnswerLimits`, in providers/transport/http1_bounds.py): at
most `max_headers` header fields (a new name is counted as it arrives, a repeated one too, its
values joined once at the head's end), of at most `max_field_bytes` each (checked once, at the
head's end, and only when the bytes received could hold a field that long), a head of at most
`max_head_bytes` (checked per read: a field that never ends is cut off there), and a body of at most
`max_body_bytes` after decoding (providers/transport/http1_decode.py: gzip and deflate, any other
coding refused). A Transfer-Encoding other than plain `chunked` (`gzip, chunked`, say) is refused
too, by name: it would otherwise be handed on still encoded. Beyond a bound, the exchange fails
with `Http1Refused`.
Informational answers (1xx) before the final one are skipped. Bytes that arrive while no request
is outstanding (an unsolicited 408 on an idle connection) close the connection: they never
become part of the next exchange. A body that ends with the connection (no length, not chunked)
is complete only when the server closed it cleanly, not when the connection was reset.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Protocol, cast

import httptools

from plumbing.busy_wait import BusyWait
from plumbing.turn_writes import TurnWrites, WriteTurn
from providers.transport.http1_bounds import (
    AnswerLimits,
    Http1Error,
    Http1Refused,
    Http1Timeout,
    set_keepalive,
)
from providers.transport.http1_decode import DecodeError, Decoder, decoder_for
from providers.transport.http1_response import Http1Response

# Stop reading from the socket while this much body is buffered and unread.
_HIGH_WATER = 1 << 20
_NO_BODY_STATUSES = frozenset({204, 304})


class _Unsolicited(Exception):
    """An answer began while none was awaited (raised inside the parser to stop it)."""


class ConnectionPool(Protocol):
    """What a connection needs of the pool it belongs to (`providers.transport.http1.Http1Pool`)."""

    loop: asyncio.AbstractEventLoop
    limits: AnswerLimits
    turn: WriteTurn  # the pool's connections' writes, by loop turn
    keepalive_s: float  # TCP keepalive's idle time (0: off)
    busy: BusyWait

    def give_back(self, conn: Connection) -> None:
        """`conn` read its answer to the end and may serve the next request."""
        ...

    def forget(self, conn: Connection) -> None:
        """`conn` is closed: it leaves the pool."""
        ...


class Connection(asyncio.Protocol):
    """One TCP (or TLS) connection and the answer being read on it."""

    def __init__(self, pool: ConnectionPool) -> None:
        self._pool = pool
        self._loop = pool.loop
        self._limits = pool.limits
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
        self._decoder: Decoder | None = None
        self._headers: dict[str, str] = {}  # the answer being parsed's
        # Distinct header names the answer may still have: max_headers, less the fields of
        # informational answers before it and the repeats of a name (rare; counted apart).
        self._room = self._limits.max_headers
        self._head_bytes = 0  # bytes received while the final answer's head was incomplete
        self._head_done = False
        self._interim = False  # the answer being parsed is informational (1xx)
        self._repeated: dict[str, list[str]] | None = None  # values of repeated header names
        self._body_bytes = 0
        self._keep_alive = False
        self.idle_since = 0.0  # loop time it was last given back to the pool
        self._timer: asyncio.TimerHandle | None = None
        # From the request to the release: its answer is awaited or read (the pool's BusyWait
        # counts it; a process whose upstream answers wait to be read is busy, not waiting).
        self._awaited = False

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but have its methods.
        # Requests are sent once per loop turn, with the turn's others (turn_writes.py).
        self._transport = TurnWrites(cast(asyncio.Transport, transport), self._pool.turn)
        keepalive_s = self._pool.keepalive_s
        sock = transport.get_extra_info("socket")
        if keepalive_s and sock is not None:
            with contextlib.suppress(OSError):  # not a TCP socket: nothing to keep alive
                set_keepalive(sock, keepalive_s)

    def data_received(self, data: bytes) -> None:
        self._got_bytes = True
        if not self._head_done:
            self._head_bytes += len(data)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(Http1Error("the upstream switched protocols"))
        except httptools.HttpParserCallbackError as exc:
            cause = exc.__context__
            if isinstance(cause, _Unsolicited):
                self._drop_unsolicited()
            elif isinstance(cause, Http1Error):
                self._fail(cause)
            else:
                self._fail(Http1Error(f"malformed answer: {exc}"))
        except httptools.HttpParserError as exc:
            self._fail(Http1Error(f"malformed answer: {exc}"))
        else:
            if not self._head_done and self._head_bytes > self._limits.max_head_bytes:
                self._fail(
                    Http1Refused(
                        f"the answer's head is longer than {self._limits.max_head_bytes} bytes"
                    )
                )

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self._no_longer_awaited()
        self._pool.forget(self)
        if self._response is not None and self._until_eof and not self._complete:
            if exc is None:  # closed cleanly: the body ends here
                self._finish()
            else:  # reset: the body was cut
                self._fail(Http1Error(f"the upstream's answer was cut off: {exc}"))
        elif not self._complete:
            reason = f": {exc}" if exc else ""
            self._fail(Http1Error(f"the upstream closed the connection{reason}"))

    # httptools callbacks

    def on_message_begin(self) -> None:
        if self._headers_ready is None or self._complete:
            raise _Unsolicited  # no request outstanding: not this exchange's answer
        self._response = response = Http1Response(self)
        self._headers = response.headers
        self._repeated = None

    def on_status(self, status: bytes) -> None:  # may come in pieces
        assert self._response is not None
        self._response.reason += status.decode("latin-1")

    def on_header(self, name: bytes, value: bytes) -> None:
        key = name.decode("latin-1").lower()
        headers = self._headers
        if key not in headers:
            if len(headers) >= self._room:
                self._refuse_count()
            headers[key] = value.decode("latin-1")
        else:
            self._repeat(key, value.decode("latin-1"))

    def _repeat(self, key: str, text: str) -> None:
        """A name seen before in this head: its values are joined once, at the head's end."""
        self._room -= 1
        if len(self._headers) > self._room:
            self._refuse_count()
        repeated = self._repeated
        if repeated is None:
            repeated = self._repeated = {}
        values = repeated.get(key)
        if values is None:
            repeated[key] = [self._headers[key], text]
        else:
            values.append(text)

    def _refuse_count(self) -> None:
        raise Http1Refused(f"the answer has more than {self._limits.max_headers} header fields")

    def _check_fields(self) -> None:
        """Every header field within max_field_bytes (name and value; each value of a repeated
        name on its own)."""
        limit = self._limits.max_field_bytes
        fields = list(self._headers.items())
        for key, values in (self._repeated or {}).items():
            fields.extend((key, value) for value in values)
        for key, value in fields:
            if len(key) + len(value) > limit:
                raise Http1Refused(
                    f"the answer's header field {key[:40]!r} is longer than {limit} bytes"
                )

    def on_headers_complete(self) -> None:
        response = self._response
        assert response is not None
        response.status = status = self._parser.get_status_code()
        if status < 200:  # informational (100 Continue, 103 Early Hints): the answer follows
            self._interim = True
            self._room -= len(self._headers)
            return
        self._head_done = True
        headers = response.headers
        if self._head_bytes > self._limits.max_field_bytes:  # else no field can be that long
            self._check_fields()
        if self._repeated is not None:
            for key, values in self._repeated.items():
                headers[key] = ", ".join(values)
            self._repeated = None
        coded = headers.get("transfer-encoding")
        chunked = coded is not None
        if coded is not None and coded.strip().lower() != "chunked":  # e.g. "gzip, chunked"
            raise Http1Refused(
                f"the answer's Transfer-Encoding is {coded.strip()[:60]!r}; only 'chunked' is read"
            )
        self._until_eof = (
            "content-length" not in headers
            and not chunked
            and response.status not in _NO_BODY_STATUSES
        )
        coding = headers.get("content-encoding")
        if coding is not None:
            try:
                self._decoder = decoder_for(coding, self._limits.max_body_bytes)
            except DecodeError as exc:
                raise Http1Refused(str(exc)) from None
        if self._headers_ready is not None and not self._headers_ready.done():
            self._headers_ready.set_result(response)

    def on_body(self, body: bytes) -> None:
        if self._decoder is not None:
            try:
                pieces = self._decoder.feed(body)
            except DecodeError as exc:
                raise Http1Refused(str(exc)) from None
            for piece in pieces:
                self._buffer(piece)
            return
        self._body_bytes += len(body)
        if self._body_bytes > self._limits.max_body_bytes:
            raise Http1Refused(
                f"the answer's body is longer than {self._limits.max_body_bytes} bytes"
            )
        if body:
            self._buffer(body)

    def _buffer(self, body: bytes) -> None:
        self._body.append(body)
        self._buffered += len(body)
        if self._buffered > _HIGH_WATER and not self._paused and self._transport:
            self._paused = True
            self._transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        if self._interim:
            self._interim = False
            return
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
        self._decoder = None
        self._room = self._limits.max_headers
        self._head_bytes = 0
        self._head_done = False
        self._body_bytes = 0
        self.reused = True

    def _finish(self) -> None:
        if self._decoder is not None:
            decoder, self._decoder = self._decoder, None
            try:
                tail = decoder.end()
            except DecodeError as exc:
                self._fail(Http1Refused(str(exc)))
                return
            if tail:
                self._body.append(tail)
        self._complete = True
        self._wake()

    def _drop_unsolicited(self) -> None:
        """An answer no request asked for: the connection is closed (the answer already read
        stays readable, and the connection never goes back to the pool)."""
        self.abort()

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
