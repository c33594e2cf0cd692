"""An HTTP forward proxy on 127.0.0.1 for tests: CONNECT tunnels and absolute-form requests.

Each client connection's first request head is recorded in `heads` as (request line, lower-case
headers): `CONNECT host:port HTTP/1.1` is answered `200 Connection established` and then piped
both ways; any other request (absolute-form, `POST http://host:port/path HTTP/1.1`) is passed on
as it is to that host and the connection piped both ways. With `refuse` set, every request gets
`407 Proxy Authentication Required` instead.
"""

from __future__ import annotations

import asyncio
import contextlib
from urllib.parse import urlsplit


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError):
        pass
    finally:
        writer.close()


class RecordingProxy:
    def __init__(self, *, refuse: bool = False) -> None:
        self.refuse = refuse
        self.heads: list[tuple[str, dict[str, str]]] = []
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def __aenter__(self) -> RecordingProxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self._relay(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self._tasks.discard(task)
            writer.close()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        line, *fields = head.decode("latin-1").split("\r\n")
        headers = {}
        for field in fields:
            if field:
                name, _, value = field.partition(":")
                headers[name.strip().lower()] = value.strip()
        self.heads.append((line, headers))
        if self.refuse:
            writer.write(b"HTTP/1.1 407 Proxy Authentication Required\r\nContent-Length: 0\r\n\r\n")
            await writer.drain()
            return
        method, target, _ = line.split(" ", 2)
        if method == "CONNECT":
            host, _, port = target.rpartition(":")
            up_reader, up_writer = await asyncio.open_connection(host.strip("[]"), int(port))
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        else:
            url = urlsplit(target)
            assert url.hostname is not None
            up_reader, up_writer = await asyncio.open_connection(url.hostname, url.port or 80)
            up_writer.write(head)
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
