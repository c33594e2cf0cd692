"""plumbing/turn_writes.py: a turn's first write goes out at once, its later ones together at the
next turn, each connection's in order; closing sends them, aborting drops them. Against
recording transports, and over a real connection."""

from __future__ import annotations

import asyncio
from typing import Any

from plumbing.turn_writes import TurnWrites, WriteTurn


class Recording(asyncio.Transport):
    """What reached the wrapped transport, in order: (what, which transport, bytes written)."""

    def __init__(self, log: list[tuple[Any, ...]], name: str = "") -> None:
        super().__init__()
        self.log = log
        self.name = name
        self.closing = False

    def write(self, data: Any) -> None:
        self.log.append(("write", self.name, bytes(data)))

    def writelines(self, list_of_data: Any) -> None:
        self.log.append(("writelines", self.name, [bytes(d) for d in list_of_data]))

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


def _pair(log: list[tuple[Any, ...]]) -> tuple[TurnWrites, TurnWrites, Recording]:
    turn = WriteTurn(asyncio.get_running_loop())
    second = Recording(log, "2")
    return TurnWrites(Recording(log, "1"), turn), TurnWrites(second, turn), second


async def test_a_lone_write_in_each_turn_goes_out_at_once() -> None:
    log: list[tuple[Any, ...]] = []
    first, _, _ = _pair(log)
    first.write(b"request")
    assert log == [("write", "1", b"request")]
    await _next_turn()
    first.writelines([b"HTTP/1.1 200 OK\r\n", b"", bytearray(b"\r\n")])
    assert log[1:] == [("writelines", "1", [b"HTTP/1.1 200 OK\r\n", b"\r\n"])]
    assert first.get_write_buffer_size() == 7


async def test_a_turns_later_writes_go_out_at_the_next_turn_joined_and_in_order() -> None:
    log: list[tuple[Any, ...]] = []
    first, second, _ = _pair(log)
    first.write(b"one")
    second.write(b"two")
    first.write(memoryview(b"three"))
    second.writelines([b"four", b"five"])
    assert log == [("write", "1", b"one")]
    assert second.get_write_buffer_size() == 7 + len(b"twofourfive")
    await _next_turn()
    # in the order the connections began to wait
    assert log[1:] == [("write", "2", b"twofourfive"), ("write", "1", b"three")]
    assert second.get_write_buffer_size() == 7


async def test_under_load_a_turns_first_write_waits_too_until_the_load_ends() -> None:
    log: list[tuple[Any, ...]] = []
    first, second, _ = _pair(log)
    first.write(b"a1")
    first.write(b"a2")
    second.write(b"b1")  # two connections wait: the group is under load
    await _next_turn()
    del log[:]
    first.write(b"a3")  # the first write of a loaded turn waits with the rest
    assert log == []
    await _next_turn()  # only one connection waited: the load has ended
    assert log == [("write", "1", b"a3")]
    second.write(b"b2")
    assert log[1:] == [("write", "2", b"b2")]


async def test_a_connection_that_waits_keeps_its_order() -> None:
    log: list[tuple[Any, ...]] = []
    first, second, _ = _pair(log)
    asyncio.get_running_loop().call_soon(second.write, b"-2")  # runs before the turn flips
    first.write(b"x")
    second.write(b"1")
    await _next_turn()
    assert log == [("write", "1", b"x"), ("write", "2", b"1-2")]


async def test_close_sends_what_waits_and_abort_drops_it() -> None:
    log: list[tuple[Any, ...]] = []
    first, second, _ = _pair(log)
    first.write(b"at once")
    first.write(b"last words")
    first.close()
    second.write(b"never sent")
    second.abort()
    assert second.get_write_buffer_size() == 7
    await _next_turn()
    assert log == [
        ("write", "1", b"at once"),
        ("write", "1", b"last words"),
        ("close", "1"),
        ("abort", "2"),
    ]


async def test_what_waits_when_the_connection_closes_is_dropped() -> None:
    log: list[tuple[Any, ...]] = []
    first, second, inner = _pair(log)
    first.write(b"at once")
    second.write(b"too late")
    inner.closing = True  # the peer went away before the turn ended
    await _next_turn()
    assert log == [("write", "1", b"at once")]
    assert second.is_closing()


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
    wrapped = TurnWrites(transport, WriteTurn(loop))
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
