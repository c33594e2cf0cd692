"""What the HTTP/1.1 client (providers/transport/http1.py) holds an upstream to: the bounds on an
answer (`AnswerLimits`), TCP keepalive on its connections, and the errors an exchange ends
with."""

from __future__ import annotations

import socket

from plumbing.record import record


class Http1Error(Exception):
    """The connection failed, or the answer ended before its end."""


class ConnectTimeout(Http1Error):
    """No connection within the connect timeout."""


class CertificateError(Http1Error):
    """The upstream's TLS certificate could not be verified (an unknown authority, a name that
    does not match, an expired certificate)."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"TLS certificate verification failed: {reason}")
        self.reason = reason


class Http1Timeout(Http1Error):
    """The exchange's deadline passed (the connection is closed: its answer is abandoned)."""


class Http1Refused(Http1Error):
    """The answer breaks a bound or uses an encoding the client does not read (the connection is
    closed; the same upstream would send it again, but another route may serve)."""


@record
class AnswerLimits:
    """The most an upstream's answer may hold (aiohttp's client has the same header bounds)."""

    max_headers: int = 128  # header fields, repeated names counted each time
    max_field_bytes: int = 8192  # one field's name and value together
    max_body_bytes: int = 64 << 20  # the body after decoding

    @property
    def max_head_bytes(self) -> int:
        """The bytes a head may take before it ends (status line and line ends included)."""
        return (self.max_headers + 1) * (self.max_field_bytes + 4)


def set_keepalive(sock: socket.socket, idle_s: float) -> None:
    """TCP keepalive on `sock`: the first probe after `idle_s` idle, then every `idle_s` / 3,
    given up after 3 unanswered (a connection a NAT dropped fails instead of hanging)."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    idle = max(1, round(idle_s))
    if hasattr(socket, "TCP_KEEPIDLE"):  # Linux; elsewhere the system's defaults apply
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, idle)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, max(1, idle // 3))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 3)
