"""The forwarding client against peers that misbehave at the socket level: one that accepts and
never answers (a frozen process), one that answered before and goes silent on the kept-alive
connection (a partition), one that stops mid-answer, and a slow one that keeps the connection
alive with empty lines. Real sockets, a peer of the test's own."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import aiohttp
import pytest

from backend.engine.interface import EngineError, RequestOutput
from backend.engine.sampling_params import SamplingParams
from providers.local.remote_engine import (
    ForwardDeadlines,
    PeerUnreachable,
    RemoteEngine,
    output_to_json,
)

DEADLINES = ForwardDeadlines(first_byte_s=0.5, idle_s=1.0)
PARAMS = SamplingParams(temperature=0.0, max_tokens=2)
HEADERS = (
    b"HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\nTransfer-Encoding: chunked\r\n\r\n"
)


def line(finished: bool) -> bytes:
    return output_to_json(RequestOutput("r", [7], finished, "length" if finished else None, 3, 0))


def chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


@dataclass
class Peer:
    """`answer(n, writer)` writes the answer to the n-th request (1-based) of a connection."""

    answer: Callable[[int, asyncio.StreamWriter], Awaitable[None]]
    url: str = ""
    requests: list[int] = field(default_factory=list)  # per connection opened
    release: asyncio.Event = field(default_factory=asyncio.Event)  # silent answers end

    async def silence(self) -> None:
        await self.release.wait()

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.requests.append(0)
        index = len(self.requests) - 1
        try:
            while not self.release.is_set():
                head = await reader.readuntil(b"\r\n\r\n")
                sizes = [
                    int(h.split(b":", 1)[1])
                    for h in head.split(b"\r\n")
                    if h.lower().startswith(b"content-length:")
                ]
                await reader.readexactly(sizes[0] if sizes else 0)
                self.requests[index] += 1
                await self.answer(self.requests[index], writer)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@asynccontextmanager
async def running(peer: Peer) -> AsyncIterator[RemoteEngine]:
    server = await asyncio.start_server(peer.serve, "127.0.0.1", 0)
    peer.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        async with aiohttp.ClientSession() as session:
            yield RemoteEngine(session, peer.url, "secret", DEADLINES)
    finally:
        peer.release.set()
        server.close()
        await server.wait_closed()


async def run(engine: RemoteEngine) -> list[RequestOutput]:
    async with asyncio.timeout(30):  # far past the deadlines: a hang fails here
        return [o async for o in engine.generate("r", [1, 2, 3], PARAMS)]


async def test_a_peer_that_accepts_and_never_answers_is_unreachable() -> None:
    peer = Peer(lambda n, w: peer.silence())
    async with running(peer) as engine:
        with pytest.raises(PeerUnreachable, match="sent nothing within 0.5s"):
            await run(engine)


async def test_a_peer_silent_on_a_kept_alive_connection_is_unreachable() -> None:
    async def answer(n: int, writer: asyncio.StreamWriter) -> None:
        if n == 1:
            writer.write(HEADERS + chunk(line(True)) + b"0\r\n\r\n")
        else:
            await peer.silence()  # partitioned: the connection stays open, nothing comes

    peer = Peer(answer)
    async with running(peer) as engine:
        assert [o.finished for o in await run(engine)] == [True]
        with pytest.raises(PeerUnreachable, match="sent nothing within"):
            await run(engine)
    assert peer.requests == [2]  # the second request went over the first connection


async def test_a_peer_that_stops_mid_answer_fails_the_request_after_the_idle_deadline() -> None:
    async def answer(n: int, writer: asyncio.StreamWriter) -> None:
        writer.write(HEADERS + chunk(line(False)))
        await writer.drain()
        await peer.silence()

    peer = Peer(answer)
    async with running(peer) as engine:
        outputs: list[RequestOutput] = []
        with pytest.raises(EngineError, match="sent nothing for 1s") as failed:
            async with asyncio.timeout(30):
                async for o in engine.generate("r", [1, 2, 3], PARAMS):
                    outputs.append(o)
        assert not isinstance(failed.value, PeerUnreachable)  # it generated: no fallback
        assert len(outputs) == 1


async def test_a_peer_silent_after_its_headers_before_any_output_is_unreachable() -> None:
    async def answer(n: int, writer: asyncio.StreamWriter) -> None:
        writer.write(HEADERS)
        await writer.drain()
        await peer.silence()

    peer = Peer(answer)
    async with running(peer) as engine:
        with pytest.raises(PeerUnreachable, match="sent nothing for 1s"):
            await run(engine)


async def test_keep_alive_lines_keep_a_slow_answer_going() -> None:
    """Empty lines every 0.1 s for longer than the idle deadline, then the answer."""

    async def answer(n: int, writer: asyncio.StreamWriter) -> None:
        writer.write(HEADERS)
        for _ in range(20):
            writer.write(chunk(b"\n"))
            await writer.drain()
            await asyncio.sleep(0.1)
        writer.write(chunk(line(False)) + chunk(line(True)) + b"0\r\n\r\n")

    peer = Peer(answer)
    async with running(peer) as engine:
        assert [o.finished for o in await run(engine)] == [False, True]
