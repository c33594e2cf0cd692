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
- Errors are `Http1Error` (the connection failed, or closed before the answer ended;
  `CertificateError` when the origin's TLS certificate could not be verified),
  `Http1Refused` (the answer broke one of the `AnswerLimits` or came in an encoding the client
  does not read) and `ConnectTimeout` (no connection within the pool's connect timeout). A
  pooled connection that the server closed while idle is noticed before use or, if it dies
  before the first byte of the answer, the request is sent once more on a new connection.
- Idle connections are closed after `idle_expiry_s` unused (a NAT or load balancer may have
  dropped them silently by then), and TCP keepalive probes every connection after
  `keepalive_s` idle (0: off).
- `Accept-Encoding: identity` is asked for; an upstream that compresses anyway (gzip or
  deflate) is decoded, within the body limit (providers/transport/http1_decode.py).
- `proxy`: an http proxy every request goes through (providers/transport/http1_proxy.py): a CONNECT
  tunnel for an https origin, the absolute-form request target for an http one, with the
  proxy's credentials as Proxy-Authorization. No cookies or redirects.
- While few answers are awaited, the loop polls for them instead of sleeping (`BusyWait`;
  default: one that never spins).
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Mapping
from urllib.parse import urlsplit

from plumbing.busy_wait import BusyWait
from plumbing.turn_writes import WriteTurn
from providers.transport.http1_bounds import (
    AnswerLimits,
    CertificateError,
    ConnectTimeout,
    Http1Error,
    Http1Refused,
    Http1Timeout,
)
from providers.transport.http1_connection import Connection
from providers.transport.http1_proxy import Proxy, open_tunnel
from providers.transport.http1_response import Http1Response

__all__ = [
    "AnswerLimits",
    "CertificateError",
    "ConnectTimeout",
    "Http1Error",
    "Http1Pool",
    "Http1Refused",
    "Http1Response",
    "Http1Timeout",
    "Proxy",
]

_MAX_HEADS = 64  # request heads kept per pool; others are built per request
DEFAULT_LIMITS = AnswerLimits()


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
        limits: AnswerLimits = DEFAULT_LIMITS,
        idle_expiry_s: float = 15.0,
        keepalive_s: float = 30.0,
        proxy: Proxy | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        """`busy`: the process's `BusyWait`; an answer counts as awaited from its request until
        its connection is released (default: one of the pool's own that never spins).
        `ssl_context`: for an https origin (default: the system's trust store)."""
        url = urlsplit(base_url)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        self.loop = asyncio.get_running_loop()
        self.busy = busy or BusyWait()
        self.turn = WriteTurn(self.loop)  # the connections' writes, by loop turn
        self.limits = limits
        self.keepalive_s = keepalive_s
        self._idle_expiry_s = idle_expiry_s
        self._sweep: asyncio.TimerHandle | None = None
        self._host = url.hostname
        self._port = url.port or (443 if url.scheme == "https" else 80)
        https = url.scheme == "https"
        self._ssl = (ssl_context or ssl.create_default_context()) if https else None
        default_port = self._port == (443 if https else 80)
        host = f"[{self._host}]" if ":" in self._host else self._host
        authority = host if default_port else f"{host}:{self._port}"
        fixed = {
            "Host": authority,
            "Accept": "*/*",
            "Accept-Encoding": "identity",
            "User-Agent": "deepseek-gateway",
        }
        # Through a proxy: https in a CONNECT tunnel; http to the proxy, in absolute form.
        self._proxy = proxy
        self._tunnel = proxy if proxy is not None and https else None
        self._target_prefix = ""
        if proxy is not None and not https:
            self._target_prefix = f"http://{authority}"
            if proxy.authorization:
                fixed["Proxy-Authorization"] = proxy.authorization
        self._fixed = _by_lower_name(fixed, headers)
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
            lines = [f"POST {self._target_prefix}{path} HTTP/1.1"]
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
        """The connection given back last (those idle too long were closed by `_expire_idle`)."""
        while self._idle:
            conn = self._idle.pop()
            if not conn.lost:
                return conn
        return None

    def _expire_idle(self) -> None:
        """Closes the connections idle longer than `idle_expiry_s`, and times the next look for
        when the oldest left would expire (one timer per pool, not one per connection)."""
        self._sweep = None
        idle = self._idle
        cutoff = self.loop.time() - self._idle_expiry_s
        expired = 0
        while expired < len(idle) and (idle[expired].lost or idle[expired].idle_since <= cutoff):
            expired += 1
        for conn in idle[:expired]:
            conn.abort()
        del idle[:expired]
        if idle:
            self._sweep = self.loop.call_at(
                idle[0].idle_since + self._idle_expiry_s, self._expire_idle
            )

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
        via = f" through the proxy at {self._proxy.address}" if self._proxy else ""
        try:
            async with asyncio.timeout(self._connect_timeout_s):
                conn = await self._open_connection()
        except TimeoutError:
            raise ConnectTimeout(
                f"no connection to {self._host}:{self._port}{via} "
                f"within {self._connect_timeout_s:g} s"
            ) from None
        except ssl.SSLCertVerificationError as exc:
            raise CertificateError(exc.verify_message or str(exc)) from exc
        except OSError as exc:
            raise Http1Error(f"cannot connect to {self._host}:{self._port}{via}: {exc}") from exc
        finally:
            self._connecting -= 1
            if conn is None:
                self._wake_one()  # a failed connect frees its place
            else:
                self._open.add(conn)
        return conn

    async def _open_connection(self) -> Connection:
        if self._tunnel is None:  # direct, or to an http origin's proxy
            proxy = self._proxy
            _, conn = await self.loop.create_connection(
                lambda: Connection(self),
                proxy.host if proxy else self._host,
                proxy.port if proxy else self._port,
                ssl=self._ssl,
                server_hostname=self._host if self._ssl else None,
            )
            return conn
        assert self._ssl is not None
        raw = await open_tunnel(self.loop, self._tunnel, self._host, self._port)
        conn = Connection(self)
        try:
            tls = await self.loop.start_tls(raw, conn, self._ssl, server_hostname=self._host)
        except BaseException:
            raw.abort()
            raise
        if tls is None:  # the tunnel closed as TLS started
            raise Http1Error("the proxy closed the tunnel")
        conn.connection_made(tls)
        return conn

    def give_back(self, conn: Connection) -> None:
        conn.idle_since = self.loop.time()
        self._idle.append(conn)
        if self._sweep is None:
            expiry = conn.idle_since + self._idle_expiry_s
            self._sweep = self.loop.call_at(expiry, self._expire_idle)
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
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        for conn in list(self._open):
            conn.abort()
        self._idle.clear()
        self._open.clear()
