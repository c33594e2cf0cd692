"""Egress proxies for upstream calls: which proxy a URL goes through, and a CONNECT tunnel.

Contract:
- `proxy_for(url, environ)` is the proxy URL for `url` from the conventional variables in
  `environ`: `https_proxy`/`HTTPS_PROXY` for https URLs, `http_proxy`/`HTTP_PROXY` for http ones
  (the lower-case name wins), None when unset or when `no_proxy`/`NO_PROXY` covers the host
  (comma-separated entries: `*`; a host name, which covers its subdomains, with or without a
  leading dot; an IP address or CIDR range; any of them with `:port` to cover that port only).
- `Proxy.parse(url)` reads an `http://[user:password@]host[:port]` proxy URL (port 80 unless
  given; a scheme-less `host:port` is taken as http); credentials become a `Proxy-Authorization:
  Basic` value. Errors are ValueError with the credentials left out. A `Proxy`'s repr never shows
  them either.
- `open_tunnel(loop, proxy, host, port)` connects to the proxy, asks it to `CONNECT host:port`
  and returns the raw transport once it answered 2xx (the caller starts TLS on it); a refusal or
  a malformed answer raises `TunnelError` with the proxy's status.
"""

from __future__ import annotations

import asyncio
import base64
import ipaddress
from collections.abc import Mapping
from dataclasses import field
from urllib.parse import unquote, urlsplit

import httptools

from plumbing.record import record

# The most a proxy's answer to CONNECT may take before its head ends.
_MAX_TUNNEL_HEAD = 16 * 1024


class TunnelError(OSError):
    """The proxy refused or broke the CONNECT tunnel."""


@record
class Proxy:
    host: str
    port: int
    authorization: str | None = field(default=None, repr=False)  # Proxy-Authorization value

    @property
    def address(self) -> str:
        """host:port, for messages (never the credentials)."""
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    @classmethod
    def parse(cls, url: str) -> Proxy:
        text = url.strip()
        if "://" not in text:
            text = "http://" + text
        parts = urlsplit(text)
        if parts.scheme.lower() != "http":
            raise ValueError(
                f"proxy scheme {parts.scheme!r} is not supported (only http:// proxies, which "
                "tunnel https with CONNECT)"
            )
        try:
            port = parts.port or 80
        except ValueError:
            raise ValueError(f"the proxy at {parts.hostname!r} has an invalid port") from None
        if not parts.hostname:
            raise ValueError("the proxy URL names no host")
        authorization = None
        if parts.username is not None:
            user, password = unquote(parts.username), unquote(parts.password or "")
            token = base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
            authorization = f"Basic {token}"
        return cls(parts.hostname, port, authorization)


def proxy_for(url: str, environ: Mapping[str, str]) -> str | None:
    """The proxy URL `environ` names for `url`, or None (direct)."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    name = f"{scheme}_proxy"
    proxy = environ.get(name) or environ.get(name.upper())
    if not proxy or parts.hostname is None:
        return None
    no_proxy = environ.get("no_proxy") or environ.get("NO_PROXY") or ""
    port = parts.port or (443 if scheme == "https" else 80)
    if _bypassed(parts.hostname.lower(), port, no_proxy):
        return None
    return proxy


def _bypassed(host: str, port: int, no_proxy: str) -> bool:
    """Whether a NO_PROXY list covers host:port."""
    try:
        address: ipaddress.IPv4Address | ipaddress.IPv6Address | None = ipaddress.ip_address(host)
    except ValueError:
        address = None
    for raw in no_proxy.split(","):
        entry = raw.strip().lower()
        if not entry:
            continue
        if entry == "*":
            return True
        entry_host, entry_port = entry, None
        if entry.startswith("["):  # [v6]:port
            entry_host, _, rest = entry[1:].partition("]")
            entry_port = rest[1:] if rest.startswith(":") else None
        elif entry.count(":") == 1:
            entry_host, _, entry_port = entry.partition(":")
        if entry_port is not None and entry_port != str(port):
            continue
        if address is not None:
            try:
                if address in ipaddress.ip_network(entry_host, strict=False):
                    return True
            except ValueError:
                pass
            continue
        entry_host = entry_host.lstrip("*").lstrip(".")
        if entry_host and (host == entry_host or host.endswith("." + entry_host)):
            return True
    return False


class _TunnelReply(asyncio.Protocol):
    """Reads the proxy's answer to CONNECT (its head only: nothing follows until TLS starts)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.status: asyncio.Future[int] = loop.create_future()
        self._parser = httptools.HttpResponseParser(self)
        self._bytes = 0

    def data_received(self, data: bytes) -> None:
        if self.status.done():
            return
        self._bytes += len(data)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._settle(TunnelError(f"malformed answer to CONNECT: {exc}"))
        if self._bytes > _MAX_TUNNEL_HEAD:
            self._settle(TunnelError("the answer to CONNECT has an endless head"))

    def on_headers_complete(self) -> None:
        if not self.status.done():
            self.status.set_result(self._parser.get_status_code())

    def connection_lost(self, exc: Exception | None) -> None:
        self._settle(TunnelError(f"the proxy closed the connection{f': {exc}' if exc else ''}"))

    def _settle(self, error: TunnelError) -> None:
        if not self.status.done():
            self.status.set_exception(error)


async def open_tunnel(
    loop: asyncio.AbstractEventLoop, proxy: Proxy, host: str, port: int
) -> asyncio.Transport:
    """A transport to host:port through `proxy`, ready for TLS (the caller bounds the time)."""
    transport, reply = await loop.create_connection(
        lambda: _TunnelReply(loop), proxy.host, proxy.port
    )
    try:
        authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        lines = [f"CONNECT {authority} HTTP/1.1", f"Host: {authority}"]
        if proxy.authorization:
            lines.append(f"Proxy-Authorization: {proxy.authorization}")
        transport.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        status = await reply.status
        if not 200 <= status < 300:
            raise TunnelError(f"the proxy at {proxy.address} refused the tunnel (HTTP {status})")
    except BaseException:
        transport.abort()
        raise
    return transport
