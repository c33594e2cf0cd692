"""Writes on a group of connections, batched by turn of the event loop.

A `WriteTurn` stands for a group of connections (a server's, an upstream pool's); each of them
writes through a `TurnWrites` wrapping its transport. The first write of a loop turn on any of
them goes out at once, unless the group is under load (more than one of its connections waited
in the turn before); the turn's other writes are joined per connection and sent at the start of
the next turn, back to back, with no Python work between them. The process on the other end (a
client, an upstream, a proxy in front: on one host they share its cores) is then woken about
once a turn instead of once per answer, and preempts the gateway less. At one request at a time
nothing waits: deferring every write would put the CPU work the turn does after an answer in
front of that answer, a tenth of a millisecond or more for a lone request.

Contract: a connection's bytes go out in the order written (once one of its writes waits, its
later ones wait behind it); `close` sends what waits, then closes; `abort` drops it; once the
wrapped transport is closing, what waits is dropped, as a write to it would be;
`get_write_buffer_size` counts what waits. Everything else is the wrapped transport's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

Data = bytes | bytearray | memoryview


class WriteTurn:
    """One group's state in the current turn: whether a write went out, who waits, and whether
    the group is under load (more than one connection waited in the last turn)."""

    __slots__ = ("_loop", "_open", "_loaded", "_waiting")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._open = True  # no write has been made in this turn yet
        self._loaded = False
        self._waiting: list[TurnWrites] = []

    def first(self) -> bool:
        """True for the write that goes out at once: the turn's first, unless the group is
        under load (then every write of the turn waits)."""
        if not self._open:
            return False
        self._open = False
        self._loop.call_soon(self._next)
        return not self._loaded

    def wait(self, connection: TurnWrites) -> None:
        self._waiting.append(connection)

    def _next(self) -> None:
        """The next turn has begun: send what waits, and let its first write go at once."""
        waiting, self._waiting = self._waiting, []
        self._open = True
        self._loaded = len(waiting) > 1
        for connection in waiting:
            connection.flush()


class TurnWrites(asyncio.Transport):
    __slots__ = ("_inner", "_turn", "_queued", "_size")

    def __init__(self, inner: asyncio.Transport, turn: WriteTurn) -> None:
        super().__init__()
        self._inner = inner
        self._turn = turn
        self._queued: list[Data] = []
        self._size = 0

    # writing

    def write(self, data: Data) -> None:
        if data:
            self._send([data])

    def writelines(self, list_of_data: Iterable[Data]) -> None:
        parts = [data for data in list_of_data if data]
        if parts:
            self._send(parts)

    def _send(self, parts: list[Data]) -> None:
        if not self._queued and self._turn.first():
            if not self._inner.is_closing():
                if len(parts) == 1:
                    self._inner.write(parts[0])
                else:
                    self._inner.writelines(parts)
            return
        if not self._queued:
            self._turn.wait(self)
        self._queued.extend(parts)
        self._size += sum(len(part) for part in parts)

    def flush(self) -> None:
        """Send what waits now (the next turn does it on its own)."""
        queued = self._queued
        if not queued:
            return
        data = queued[0] if len(queued) == 1 else b"".join(queued)
        self._queued = []
        self._size = 0
        if not self._inner.is_closing():
            self._inner.write(data)

    def get_write_buffer_size(self) -> int:
        return self._inner.get_write_buffer_size() + self._size

    def write_eof(self) -> None:
        self.flush()
        self._inner.write_eof()

    def can_write_eof(self) -> bool:
        return self._inner.can_write_eof()

    # closing

    def close(self) -> None:
        self.flush()
        self._inner.close()

    def abort(self) -> None:
        self._queued = []
        self._size = 0
        self._inner.abort()

    def is_closing(self) -> bool:
        return self._inner.is_closing()

    # the wrapped transport's own

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._inner.get_extra_info(name, default)

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._inner.set_write_buffer_limits(high, low)

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._inner.get_write_buffer_limits()

    def pause_reading(self) -> None:
        self._inner.pause_reading()

    def resume_reading(self) -> None:
        self._inner.resume_reading()

    def is_reading(self) -> bool:
        return self._inner.is_reading()

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._inner.set_protocol(protocol)

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._inner.get_protocol()
