"""providers/turn_writes.py: a turn's writes go out together at the next turn, in order; closing
sends them, aborting drops them. Against a recording transport, and over a real connection."""

from __future__ import annotations

import asyncio
from typing import Any

from providers.turn_writes import TurnWrites


class Recording(asyncio.Transport):
    """What reached the wrapped transport, in order: ("write", bytes), ("close",), ("abort",)."""

    def __init__(self, log: list[tuple[Any, ...]], name: str = "") -> None:
        super().__init__()
        self.log = log
        self.name = name
        self.closing = False

    def write(self, data: Any) -> None:
        self.log.append(("write", self.name, bytes(data)))

    def close(self) -> None:
        self.closing = True
        self.log.append(("close", self.name))

    def abort(self) -> None:
        self.closing = True
        self.log.append(("abort", self.name))

    def is_closing(self) -> bool:
        return self.closing

    def get_write_buffer_size(self) -> int:
        return 7


async def _next_turn() -> None:
    await asyncio.sleep(0)


async def test_a_turns_writes_go_out_as_one_at_the_next_turn_in_order() -> None:
    log: list[tuple[Any, ...]] = []
    wrapped = TurnWrites(Recording(log), asyncio.get_running_loop())
    wrapped.write(b"HTTP/1.1 200 OK\r\n")
    wrapped.writelines([b"a: b\r\n", bytearray(b"\r\n"), b""])
    wrapped.write(memoryview(b"body"))
    assert log == []
    assert wrapped.get_write_buffer_size() == 7 + len(b"HTTP/1.1 200 OK\r\na: b\r\n\r\nbody")
    await _next_turn()
    assert log == [("write", "", b"HTTP/1.1 200 OK\r\na: b\r\n\r\nbody")]
    assert wrapped.get_write_buffer_size() == 7
    wrapped.write(b"more")
    await _next_turn()
    assert log[1:] == [("write", "", b"more")]


async def test_the_connections_written_to_in_a_turn_are_sent_to_in_the_next() -> None:
    log: list[tuple[Any, ...]] = []
    loop = asyncio.get_running_loop()
    first, second = TurnWrites(Recording(log, "1"), loop), TurnWrites(Recording(log, "2"), loop)
    first.write(b"one")
    second.write(b"two")
    first.write(b"three")
    await _next_turn()
    assert log == [("write", "1", b"onethree"), ("write", "2", b"two")]


async def test_close_sends_what_waits_and_abort_drops_it() -> None:
    log: list[tuple[Any, ...]] = []
    loop = asyncio.get_running_loop()
    closed, aborted = TurnWrites(Recording(log, "c"), loop), TurnWrites(Recording(log, "a"), loop)
    closed.write(b"last words")
    closed.close()
    aborted.write(b"never sent")
    aborted.abort()
    assert aborted.get_write_buffer_size() == 7
    await _next_turn()
    assert log == [("write", "c", b"last words"), ("close", "c"), ("abort", "a")]


async def test_what_waits_when_the_connection_closes_is_dropped() -> None:
    log: list[tuple[Any, ...]] = []
    inner = Recording(log)
    wrapped = TurnWrites(inner, asyncio.get_running_loop())
    wrapped.write(b"too late")
    inner.closing = True  # the peer went away before the turn ended
    await _next_turn()
    assert log == []
    assert wrapped.is_closing()


async def test_bytes_cross_a_real_connection_whole_and_in_order() -> None:
    received = bytearray()
    done = asyncio.Event()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        received.extend(await reader.read())  # to the end: the client's close
        done.set()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    loop = asyncio.get_running_loop()
    transport, _ = await loop.create_connection(asyncio.Protocol, "127.0.0.1", port)
    wrapped = TurnWrites(transport, loop)
    assert wrapped.get_extra_info("peername")[1] == port
    expected = bytearray()
    for turn in range(50):
        for part in range(turn % 4):
            chunk = f"{turn}.{part};".encode() * (1 + turn * 100)
            wrapped.write(chunk)
            expected.extend(chunk)
        await _next_turn()
    wrapped.write(b"end")
    expected.extend(b"end")
    wrapped.close()
    await asyncio.wait_for(done.wait(), 10)
    server.close()
    await server.wait_closed()
    assert received == expected
