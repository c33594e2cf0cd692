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
- While few answers are awaited, the loop polls for them instead of sleeping (`BusyWait`).
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Mapping
from urllib.parse import urlsplit

from plumbing.busy_wait import BusyWait
from plumbing.turn_writes import WriteTurn
from providers.transport.http1_connection import (
    Connection,
    ConnectTimeout,
    Http1Error,
    Http1Response,
    Http1Timeout,
)

__all__ = ["ConnectTimeout", "Http1Error", "Http1Pool", "Http1Response", "Http1Timeout"]

_MAX_HEADS = 64  # request heads kept per pool; others are built per request


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


class Http1Pool:
    """Connections to the origin of `base_url`: at most `max_connections` open, idle ones kept."""

    def __init__(
        self,
        base_url: str,
        headers: Mapping[str, str],
        *,
        connect_timeout_s: float,
        max_connections: int,
        busy: BusyWait | None = None,
    ) -> None:
        """`busy`: the process's `BusyWait`; an answer counts as awaited from its request until
        its connection is released (default: one of the pool's own that never spins)."""
        url = urlsplit(base_url)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        self.loop = asyncio.get_running_loop()
        self.busy = busy or BusyWait()
        self.turn = WriteTurn(self.loop)  # the connections' writes, by loop turn
        self._host = url.hostname
        self._port = url.port or (443 if url.scheme == "https" else 80)
        self._ssl = ssl.create_default_context() if url.scheme == "https" else None
        default_port = self._port == (443 if url.scheme == "https" else 80)
        host = f"[{self._host}]" if ":" in self._host else self._host
        authority = host if default_port else f"{host}:{self._port}"
        self._fixed = _by_lower_name(
            {"Host": authority, "Accept": "*/*", "User-Agent": "deepseek-gateway"}, headers
        )
        self._heads: dict[tuple[object, ...], bytes] = {}
        self._connect_timeout_s = connect_timeout_s
        self._limit = max_connections
        self._idle: list[Connection] = []
        self._open: set[Connection] = set()  # connected, in use or idle
        self._slot_waiters: list[asyncio.Future[None]] = []
        self._connecting = 0  # connects under way (they count against the limit)

    def _head(self, path: str, headers: Mapping[str, str]) -> bytes:
        """The request's bytes up to its Content-Length value, kept for the few (path, headers)
        a provider sends (a path, and an account's key where it has several)."""
        key = (path, *headers.items())
        head = self._heads.get(key)
        if head is None:
            merged = _by_lower_name(self._fixed, headers) if headers else self._fixed
            lines = [f"POST {path} HTTP/1.1"]
            lines.extend(f"{name}: {value}" for name, value in merged.values())
            lines.append("Content-Length: ")
            head = "\r\n".join(lines).encode("latin-1")
            if len(self._heads) < _MAX_HEADS:
                self._heads[key] = head
        return head

    def path_of(self, url: str) -> str:
        """The request target of an absolute `url` on this origin."""
        parts = urlsplit(url)
        return (parts.path or "/") + (f"?{parts.query}" if parts.query else "")

    async def post(
        self, path: str, headers: Mapping[str, str], body: bytes, deadline: float
    ) -> Http1Response:
        request = b"%s%d\r\n\r\n%s" % (self._head(path, headers), len(body), body)
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
    async def _send(conn: Connection, request: bytes, deadline: float) -> Http1Response:
        try:
            return await conn.send(request, deadline)
        except BaseException:  # cancelled or failed before the headers: nobody will close it
            conn.abort()
            raise

    def _idle_connection(self) -> Connection | None:
        while self._idle:
            conn = self._idle.pop()
            if not conn.lost:
                return conn
        return None

    async def _connection_by(self, deadline: float) -> Connection:
        try:
            async with asyncio.timeout_at(deadline):
                return await self._connection()
        except TimeoutError:
            raise Http1Timeout("the deadline passed waiting for a connection") from None

    async def _connection(self) -> Connection:
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

    async def _connect(self) -> Connection:
        self._connecting += 1
        conn: Connection | None = None
        try:
            async with asyncio.timeout(self._connect_timeout_s):
                _, conn = await self.loop.create_connection(
                    lambda: Connection(self),
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

    def give_back(self, conn: Connection) -> None:
        self._idle.append(conn)
        self._wake_one()

    def forget(self, conn: Connection) -> None:
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
