"""An SSE response kept alive while it has nothing to say.

Clients give up on a stream that sends nothing for longer than their read timeout
(openai-python's `timeout`, Codex's stream idle timeout), and a first token may take minutes (a
thinking model, a queued local engine), as may a long silence later on (reasoning that is not
streamed). So a `KeptAliveStream`:
- sends nothing for `headers_after_s`: inside that window a failing route falls back unseen
  and a request that cannot be served still gets its HTTP error status;
- then sends the headers and the encoder's opening frames (`start`), whether or not the first
  event has come, and from then on
- writes the encoder's `keepalive` frame whenever nothing was written for `interval_s`. Each
  protocol supplies its own frame: an SSE comment for chat and completions, a
  `response.in_progress` event for Responses (Codex resets its idle timer only on events).

One timer per stream does it; a frame written costs one clock read. A keep-alive frame is
encoded and handed to the transport in one step of a task of its own, so frames (and a
protocol's sequence numbers) stay in order.

Frames are queued with `send` and go out when the handler next waits (a task it starts writes
every frame queued by the time the task runs): frames that are ready together (the several chunks
of one upstream read) cost one write and one system call instead of one each, and no frame waits
for a later one. The handler is told to wait only for a write that is waiting for the client
(backpressure), not for one that has yet to begin: that would split one read's frames. The
headers and opening frames that the handler's `open` sends are queued the same way, so they leave
with the first chunks of the answer (the timer's `open`, for a stream with nothing to say yet,
writes them at once).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Protocol

import structlog
from aiohttp import web

from plumbing.record import record

log = structlog.get_logger("gateway.server.sse_stream")


class KeepAliveEncoder(Protocol):
    def start(self) -> bytes:
        """The frames that open the stream."""
        ...

    def keepalive(self) -> bytes:
        """A frame that tells the client the answer is still coming (changes nothing else)."""
        ...


@record
class KeepAlive:
    headers_after_s: float = 2.0
    interval_s: float = 5.0
    # A write the client has not taken for this long (it reads nothing) drops the connection:
    # the handler is cancelled and the request's slot, reservation and engine work freed.
    stall_s: float = 60.0


class EventStreamResponse(web.StreamResponse):
    """A stream response whose headers go out with its first bytes (the opening frames, which
    `KeptAliveStream` writes right after `prepare`): one write instead of two. aiohttp's own
    `Response` buffers its headers the same way."""

    _send_headers_immediately = False


class KeptAliveStream:
    """Wraps one prepared-on-demand `StreamResponse`. Call `open` before the first frame (it
    is a no-op when the timer already opened the stream), queue frames with `send`, end the
    response with `finish`, and `close` once in a `finally`."""

    def __init__(
        self,
        request: web.Request,
        response: web.StreamResponse,
        encoder: KeepAliveEncoder,
        timing: KeepAlive,
    ) -> None:
        self._loop = asyncio.get_running_loop()
        self._request = request
        self._response = response
        self._encoder = encoder
        self._interval = timing.interval_s
        self._stall_s = timing.stall_s
        self._last = self._loop.time()
        # The write the handler waits for (backpressure), and since when: a stall if too long.
        self._awaited: asyncio.Future[None] | None = None
        self._awaited_since = 0.0
        self._committed = False  # the headers are sent or being sent
        self._opened = False  # the headers and opening frames are written
        self._task: asyncio.Task[None] | None = None  # the timer's opening or keep-alive write
        self._pending: list[bytes] = []  # frames sent, not yet written
        self._writing: asyncio.Task[None] | None = None  # the last write of queued frames
        self._write_begun = False  # that write's task has run (a write not done then waits)
        self._failed: BaseException | None = None  # why that write failed (the client left)
        self._closed = False
        self._broken: Exception | None = None  # why the timer could not open the stream
        self._timer: asyncio.TimerHandle | None = self._loop.call_later(
            timing.headers_after_s, self._tick
        )

    @property
    def committed(self) -> bool:
        """Whether the status line is out: an error can then only be reported in the stream."""
        return self._committed

    async def open(self) -> None:
        """Send the headers and opening frames, unless the timer did (or is doing) it. Sent
        here, they are queued as `send` queues a frame: they go out with the frames sent before
        the handler next waits (the first chunks of the answer), in one write."""
        if not self._committed:
            self._committed = True
            self._last = self._loop.time()
            await self._response.prepare(self._request)  # buffers the headers: see above
            self._opened = True
            self.send(self._encoder.start())
            if self._timer is not None:  # from now on the timer only keeps the stream alive
                self._timer.cancel()
                self._timer = self._loop.call_later(self._interval, self._tick)
        elif not self._opened and self._task is not None:
            await self._task
            if self._broken is not None:
                raise self._broken

    def write(self, frame: bytes) -> Awaitable[None]:
        """Write one frame (a plain method returning the write: no coroutine of its own)."""
        self._last = self._loop.time()
        return self._response.write(frame)

    def send(self, frame: bytes) -> Awaitable[None] | None:
        """Queue `frame`; the frames queued before the handler next waits go out as one write.
        Returns the earlier write when it is waiting for the client to read (await it:
        backpressure), else None. Raises what broke an earlier write."""
        if self._failed is not None:
            raise self._failed
        self._last = self._loop.time()
        self._pending.append(frame)
        writing = self._writing
        if writing is None or writing.done():
            self._write_begun = False
            self._writing = self._loop.create_task(self._write_queued())
            return None
        if not self._write_begun:
            return None  # that write has not begun (the handler has not waited): it takes this
        # A write that began and is not done waits for the client to take its bytes.
        self._awaited, self._awaited_since = writing, self._last
        return writing

    async def finish(self, frame: bytes = b"") -> None:
        """Write the queued frames and `frame` after any write in flight, and end the
        response, in one write (the last chunk and the chunked body's terminator)."""
        writing = self._writing
        if writing is not None and self._write_begun and not writing.done():
            await writing  # a write that has not begun finds its frames taken, and ends
        if self._failed is not None:
            raise self._failed
        self._pending.append(frame)
        data = b"".join(self._pending)
        self._pending.clear()
        self._last = self._awaited_since = self._loop.time()
        self._writing = self._awaited = self._loop.create_task(self._response.write_eof(data))
        await self._writing

    async def _write_queued(self) -> None:
        """Write every frame queued by the time this task runs (and any queued while it waits
        for the client), in as few writes as that allows."""
        self._write_begun = True
        try:
            while self._pending and not self._closed:
                data = b"".join(self._pending)
                self._pending.clear()
                await self._response.write(data)
        except Exception as exc:  # the client left: the next send raises it to the handler
            self._failed = exc

    async def close(self) -> None:
        """Stop the timer and any write in flight (the stream is over); drop unwritten frames
        (the handler was cancelled)."""
        self._closed = True
        self._pending.clear()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        writing = self._writing
        if writing is not None and not writing.done():
            writing.cancel()
            await asyncio.wait((writing,))
        task = self._task
        if task is not None and not task.done():
            task.cancel()
            await asyncio.wait((task,))

    async def _open(self) -> None:
        self._last = self._loop.time()
        await self._response.prepare(self._request)
        await self._response.write(self._encoder.start())
        self._opened = True

    def _tick(self) -> None:
        if self._broken is not None:
            return  # the client is gone; its handler is being cancelled
        if self._stalled():
            self._drop()
            return
        delay = self._interval
        if not self._committed:
            self._committed = True
            self._task = self._loop.create_task(self._open_quietly())
        elif self._opened and (self._task is None or self._task.done()):
            idle = self._loop.time() - self._last
            if idle >= self._interval:
                self._task = self._loop.create_task(self._beat())
            else:
                delay = self._interval - idle
        self._timer = self._loop.call_later(delay, self._tick)

    def _stalled(self) -> bool:
        """Whether the handler has waited `stall_s` for the client to take a write (checked at
        each tick, so a stall is noticed within `stall_s` + `interval_s`). A client that reads
        slowly but steadily lets each write finish, and is not stalled."""
        awaited = self._awaited
        if awaited is None or awaited.done():
            return False
        return self._loop.time() - self._awaited_since >= self._stall_s

    def _drop(self) -> None:
        """Drop a client that reads nothing: aiohttp then cancels its handler, whose `finally`
        settles the request and frees what it held."""
        log.warning("client_stalled", stall_s=self._stall_s)
        self._broken = ConnectionResetError(f"the client read nothing for {self._stall_s:g} s")
        transport = self._request.transport
        if transport is not None:
            transport.abort()

    async def _open_quietly(self) -> None:
        try:
            await self._open()
        except Exception as exc:  # the client left; `open` re-raises it to the handler
            self._broken = exc

    async def _beat(self) -> None:
        try:
            await self.write(self._encoder.keepalive())
        except Exception as exc:  # the client left: its handler is being cancelled
            log.debug("keepalive_failed", error=repr(exc))
