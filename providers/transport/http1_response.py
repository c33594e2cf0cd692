"""`Http1Response`: one answer on a `Connection` (providers/transport/http1_connection.py):
status, reason, lower-case headers, then the body by `readany()` or `read()`."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from providers.transport.http1_connection import Connection


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
