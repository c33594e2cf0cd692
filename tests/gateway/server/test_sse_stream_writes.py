"""What a `KeptAliveStream` costs in writes: the headers, the opening frames and the first frames
the handler sends before it next waits leave in one write; the last frames and the end of the
chunked body in one more. Served by a real aiohttp server on 127.0.0.1, the writes recorded at
aiohttp's writer (each of them is one `transport.write`, one system call)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable

import aiohttp
import pytest
from aiohttp import web
from aiohttp.http_writer import StreamWriter
from aiohttp.test_utils import TestServer
from aiohttp.web_protocol import RequestHandler

from gateway.server.sse_stream import EventStreamResponse, KeepAlive, KeptAliveStream

OPENING = b"data: opening\n\n"


class _Encoder:
    def start(self) -> bytes:
        return OPENING

    def keepalive(self) -> bytes:
        return b": keep-alive\n\n"


@pytest.fixture
def writes(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """Every write aiohttp's server hands to a transport, in order (not the client's)."""
    seen: list[bytes] = []
    write, writelines = StreamWriter._write, StreamWriter._writelines

    def recorded_write(self: StreamWriter, chunk: bytes) -> None:
        if isinstance(self.protocol, RequestHandler):
            seen.append(bytes(chunk))
        write(self, chunk)

    def recorded_writelines(self: StreamWriter, chunks: Iterable[bytes]) -> None:
        chunks = list(chunks)
        if isinstance(self.protocol, RequestHandler):
            seen.append(b"".join(chunks))
        writelines(self, chunks)

    monkeypatch.setattr(StreamWriter, "_write", recorded_write)
    monkeypatch.setattr(StreamWriter, "_writelines", recorded_writelines)
    return seen


async def _until(condition: Callable[[], bool], deadline_s: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    give_up = loop.time() + deadline_s
    while not condition():
        assert loop.time() < give_up, "timed out"
        await asyncio.sleep(0.001)


async def _body(handler: web.Handler) -> bytes:
    app = web.Application()
    app.router.add_get("/", handler)
    async with (
        TestServer(app, host="127.0.0.1") as server,
        aiohttp.ClientSession() as session,
        session.get(server.make_url("/")) as resp,
    ):
        assert resp.status == 200
        return await resp.read()


async def test_headers_opening_and_first_frames_leave_in_one_write(writes: list[bytes]) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        response = EventStreamResponse(headers={"Content-Type": "text/event-stream"})
        stream = KeptAliveStream(request, response, _Encoder(), KeepAlive(headers_after_s=60))
        try:
            await stream.open()
            assert stream.send(b"data: 1\n\n") is None
            assert stream.send(b"data: 2\n\n") is None
            await _until(lambda: len(writes) == 1)  # the handler waits: what it queued goes out
            assert stream.send(b"data: 3\n\n") is None
            await stream.finish(b"data: [DONE]\n\n")
        finally:
            await stream.close()
        return response

    body = await _body(handler)
    assert body == OPENING + b"data: 1\n\ndata: 2\n\ndata: 3\n\ndata: [DONE]\n\n"
    first, last = writes  # two writes, not one per frame (nor one for the headers alone)
    assert first.startswith(b"HTTP/1.1 200") and first.endswith(b"data: 2\n\n\r\n")
    assert OPENING in first and b"data: 3" not in first
    assert last.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n")


async def test_a_stream_with_nothing_to_say_gets_its_headers_from_the_timer(
    writes: list[bytes],
) -> None:
    """The timer's opening is written at once: the client sees the headers while it waits."""
    headers_seen = asyncio.Event()

    async def handler(request: web.Request) -> web.StreamResponse:
        response = EventStreamResponse(headers={"Content-Type": "text/event-stream"})
        stream = KeptAliveStream(request, response, _Encoder(), KeepAlive(headers_after_s=0.01))
        try:
            await asyncio.wait_for(headers_seen.wait(), 10)
            await stream.open()  # already opened by the timer: nothing more is written
            await stream.finish(b"data: [DONE]\n\n")
        finally:
            await stream.close()
        return response

    async def watch() -> None:
        await _until(lambda: bool(writes))
        headers_seen.set()

    watcher = asyncio.ensure_future(watch())
    body = await _body(handler)
    await watcher
    assert body == OPENING + b"data: [DONE]\n\n"
    first, last = writes
    assert first.startswith(b"HTTP/1.1 200") and first.endswith(OPENING + b"\r\n")
    assert last.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n")


async def test_the_frames_of_one_upstream_read_leave_in_one_write(writes: list[bytes]) -> None:
    """As the pipeline sends an answer: every frame of one read is sent, waiting whenever
    `send` says a write is waiting for the client; then the next read. A write that has yet
    to begin is not waited for (that would split the read's frames into several writes)."""
    reads = [[f"data: {r}.{i}\n\n".encode() for i in range(5)] for r in range(3)]

    async def handler(request: web.Request) -> web.StreamResponse:
        response = EventStreamResponse(headers={"Content-Type": "text/event-stream"})
        stream = KeptAliveStream(request, response, _Encoder(), KeepAlive(headers_after_s=60))
        try:
            await stream.open()
            for n, frames in enumerate(reads):
                if n:
                    await asyncio.sleep(0)  # the next read
                for frame in frames:
                    if (busy := stream.send(frame)) is not None:
                        await busy
            await stream.finish(b"data: [DONE]\n\n")
        finally:
            await stream.close()
        return response

    body = await _body(handler)
    assert body == OPENING + b"".join(b"".join(frames) for frames in reads) + b"data: [DONE]\n\n"
    assert len(writes) == len(reads)  # the last read's frames leave with the end of the body
    for frames, write in zip(reads, writes, strict=True):
        assert all(frame in write for frame in frames)


async def test_a_slow_reader_gets_every_frame_in_order() -> None:
    """Frames far beyond the transport's buffer, one per upstream read: the handler waits for
    the writes the client has yet to take, and every frame arrives once, in order."""
    frames = [b"data: %d %s\n\n" % (i, b"x" * 60_000) for i in range(400)]
    waits = 0

    async def handler(request: web.Request) -> web.StreamResponse:
        nonlocal waits
        response = EventStreamResponse(headers={"Content-Type": "text/event-stream"})
        stream = KeptAliveStream(request, response, _Encoder(), KeepAlive(headers_after_s=60))
        try:
            await stream.open()
            for frame in frames:
                await asyncio.sleep(0)  # one upstream read per frame
                if (busy := stream.send(frame)) is not None:
                    waits += 1
                    await busy
            await stream.finish(b"data: [DONE]\n\n")
        finally:
            await stream.close()
        return response

    app = web.Application()
    app.router.add_get("/", handler)
    received = bytearray()
    async with (
        TestServer(app, host="127.0.0.1") as server,
        aiohttp.ClientSession() as session,
        session.get(server.make_url("/")) as resp,
    ):
        async for piece in resp.content.iter_chunked(256 * 1024):
            received += piece
            await asyncio.sleep(0.002)  # a reader slower than the writer
    assert bytes(received) == OPENING + b"".join(frames) + b"data: [DONE]\n\n"
    assert waits > 0  # the writer was held back by the reader
