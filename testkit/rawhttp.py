"""Raw HTTP/1.1 exchanges on a socket, for requests no HTTP client library will send
(bytes that are not UTF-8 in a header, a garbage request line, a lying Content-Length)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from multidict import CIMultiDict


@dataclass
class RawAnswer:
    status: int
    headers: CIMultiDict[str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def parse_answer(data: bytes) -> RawAnswer:
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers: CIMultiDict[str] = CIMultiDict()
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers.add(name.strip(), value.strip())
    if headers.get("Transfer-Encoding", "").lower() == "chunked":
        out, rest = b"", body
        while rest:
            size_line, _, rest = rest.partition(b"\r\n")
            size = int(size_line.split(b";")[0], 16)
            if size == 0:
                break
            out, rest = out + rest[:size], rest[size + 2 :]
        body = out
    elif "Content-Length" in headers:
        body = body[: int(headers["Content-Length"])]
    return RawAnswer(status, headers, body)


async def exchange(root: str, request: bytes, *, deadline_s: float = 10.0) -> RawAnswer:
    """Send `request` as is; read the first answer (up to its Content-Length, or until the
    server closes), within `deadline_s`."""
    parts = urlsplit(root)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    try:
        writer.write(request)
        await writer.drain()
        async with asyncio.timeout(deadline_s):
            data = await reader.readuntil(b"\r\n\r\n")
            answer = parse_answer(data)
            length = answer.headers.get("Content-Length")
            if length is not None:
                data += await reader.readexactly(int(length))
            else:
                data += await reader.read()
        return parse_answer(data)
    finally:
        writer.close()


def request_bytes(
    method: str, path: str, headers: dict[str, bytes | str], body: bytes = b""
) -> bytes:
    lines = [f"{method} {path} HTTP/1.1".encode(), b"Host: 127.0.0.1", b"Connection: close"]
    for name, value in headers.items():
        raw = value if isinstance(value, bytes) else value.encode()
        lines.append(name.encode() + b": " + raw)
    return b"\r\n".join(lines) + b"\r\n\r\n" + body
