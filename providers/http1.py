"""A lean HTTP/1.1 client for one origin: POST a body, read the answer as it arrives.

Why not aiohttp's client: the upstream call is the one request every relayed answer makes, and
aiohttp's client costs about as many instructions per request as aiohttp's whole server side
(a request object, header multidicts, a writer task, a cookie/redirect/auth machinery the
gateway never uses). This client builds the request's bytes in one join, writes them in one
`transport.write`, and parses the answer with httptools (llhttp, the parser Node.js uses).

Contract:
- `Http1Pool.post(path, headers, body, deadline)` returns an `Http1Response` once the status
  line and the headers are in, or raises `Http1Timeout` when `deadline` (loop time) passes first;
  the deadline stays armed over the body's reads until `disarm()` (one timer for the whole
  exchange: no `asyncio.timeout` per step). Its body is read with `readany()` (the bytes
  buffered so far, b"" at the end) or `read()` (the whole body). `close()` hands the
  connection back to the pool when the answer was read to its end and both sides keep it alive,
  and closes it otherwise (an abandoned, timed-out or cancelled read never leaves a half-read
  connection in the pool).
- Errors are `Http1Error` (the connection failed, or closed before the answer ended) and
  `ConnectTimeout` (no connection within the pool's connect timeout). A pooled connection that
  the server closed while idle is noticed before use or, if it dies before the first byte of
  the answer, the request is sent once more on a new connection.
- No compression is asked for; an upstream that compresses anyway (gzip or deflate) is read
  through zlib. No proxies, cookies or redirects (the upstream session never used them).
"""

from __future__ import annotations

import asyncio
import ssl
import zlib
from collections.abc import Mapping
from typing import cast
from urllib.parse import urlsplit

import httptools

# Stop reading from the socket while this much body is buffered and unread.
_HIGH_WATER = 1 << 20
_NO_BODY_STATUSES = frozenset({204, 304})


def _by_lower_name(
    base: Mapping[str, str] | Mapping[str, tuple[str, str]], extra: Mapping[str, str]
) -> dict[str, tuple[str, str]]:
    """Headers as lower-case name -> (name, value); a name in `extra` replaces the same name in
    `base` whatever its case. `base` is either plain headers or an earlier result."""
    merged: dict[str, tuple[str, str]] = {}
    for name, value in base.items():
        merged[name.lower()] = value if isinstance(value, tuple) else (name, value)
    for name, value in extra.items():
        if "\r" in name + value or "\n" in name + value:
            raise ValueError(f"a header may not hold a line break: {name!r}")
        merged[name.lower()] = (name, value)
    return merged


class Http1Error(Exception):
    """The connection failed, or the answer ended before its end."""


class ConnectTimeout(Http1Error):
    """No connection within the connect timeout."""


class Http1Timeout(Http1Error):
    """The exchange's deadline passed (the connection is closed: its answer is abandoned)."""


class Http1Response:
    """One answer: `status`, `reason`, `headers` (lower-case names), then its body."""

    def __init__(self, conn: _Connection) -> None:
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


class _Connection(asyncio.Protocol):
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

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but have its methods.
        self._transport = cast(asyncio.Transport, transport)

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

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class Http1Pool:
    """Connections to the origin of `base_url`: at most `max_connections` open, idle ones kept."""

    def __init__(
        self,
        base_url: str,
        headers: Mapping[str, str],
        *,
        connect_timeout_s: float,
        max_connections: int,
    ) -> None:
        url = urlsplit(base_url)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        self.loop = asyncio.get_running_loop()
        self._host = url.hostname
        self._port = url.port or (443 if url.scheme == "https" else 80)
        self._ssl = ssl.create_default_context() if url.scheme == "https" else None
        default_port = self._port == (443 if url.scheme == "https" else 80)
        host = f"[{self._host}]" if ":" in self._host else self._host
        authority = host if default_port else f"{host}:{self._port}"
        self._fixed = _by_lower_name(
            {"Host": authority, "Accept": "*/*", "User-Agent": "deepseek-gateway"}, headers
        )
        self._connect_timeout_s = connect_timeout_s
        self._limit = max_connections
        self._idle: list[_Connection] = []
        self._open: set[_Connection] = set()  # connected, in use or idle
        self._slot_waiters: list[asyncio.Future[None]] = []
        self._connecting = 0  # connects under way (they count against the limit)

    def path_of(self, url: str) -> str:
        """The request target of an absolute `url` on this origin."""
        parts = urlsplit(url)
        return (parts.path or "/") + (f"?{parts.query}" if parts.query else "")

    async def post(
        self, path: str, headers: Mapping[str, str], body: bytes, deadline: float
    ) -> Http1Response:
        merged = _by_lower_name(self._fixed, headers) if headers else self._fixed
        lines = [f"POST {path} HTTP/1.1"]
        lines.extend(f"{name}: {value}" for name, value in merged.values())
        lines.append(f"Content-Length: {len(body)}\r\n\r\n")
        request = "\r\n".join(lines).encode("latin-1") + body
        conn = self._idle_connection() or await self._connection_by(deadline)
        try:
            return await self._send(conn, request, deadline)
        except Http1Timeout:
            raise
        except Http1Error:
            if not conn.reused or conn.answered:
                raise
        # The server had closed the idle connection as the request went out: once more, anew.
        return await self._send(await self._connection_by(deadline), request, deadline)

    @staticmethod
    async def _send(conn: _Connection, request: bytes, deadline: float) -> Http1Response:
        try:
            return await conn.send(request, deadline)
        except BaseException:  # cancelled or failed before the headers: nobody will close it
            conn.abort()
            raise

    def _idle_connection(self) -> _Connection | None:
        while self._idle:
            conn = self._idle.pop()
            if not conn.lost:
                return conn
        return None

    async def _connection_by(self, deadline: float) -> _Connection:
        try:
            async with asyncio.timeout_at(deadline):
                return await self._connection()
        except TimeoutError:
            raise Http1Timeout("the deadline passed waiting for a connection") from None

    async def _connection(self) -> _Connection:
        """An idle connection, a new one, or (all `max_connections` busy) the next one freed."""
        while True:
            if (conn := self._idle_connection()) is not None:
                return conn
            if not self._open_or_connecting_full():
                return await self._connect()
            slot = self.loop.create_future()
            self._slot_waiters.append(slot)
            try:
                await slot
            finally:
                if slot in self._slot_waiters:
                    self._slot_waiters.remove(slot)

    async def _connect(self) -> _Connection:
        self._connecting += 1
        conn: _Connection | None = None
        try:
            async with asyncio.timeout(self._connect_timeout_s):
                _, conn = await self.loop.create_connection(
                    lambda: _Connection(self),
                    self._host,
                    self._port,
                    ssl=self._ssl,
                    server_hostname=self._host if self._ssl else None,
                )
        except TimeoutError:
            raise ConnectTimeout(
                f"no connection to {self._host}:{self._port} within {self._connect_timeout_s:g} s"
            ) from None
        except OSError as exc:
            raise Http1Error(f"cannot connect to {self._host}:{self._port}: {exc}") from exc
        finally:
            self._connecting -= 1
            if conn is None:
                self._wake_one()  # a failed connect frees its place
            else:
                self._open.add(conn)
        return conn

    def give_back(self, conn: _Connection) -> None:
        self._idle.append(conn)
        self._wake_one()

    def forget(self, conn: _Connection) -> None:
        if conn in self._open:
            self._open.discard(conn)
            self._wake_one()

    def _open_or_connecting_full(self) -> bool:
        return len(self._open) + self._connecting >= self._limit

    def _wake_one(self) -> None:
        while self._slot_waiters:
            slot = self._slot_waiters.pop(0)
            if not slot.done():
                slot.set_result(None)
                return

    def close(self) -> None:
        """Closes every connection, idle or in use."""
        for conn in list(self._open):
            conn.abort()
        self._idle.clear()
        self._open.clear()
