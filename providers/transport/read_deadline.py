"""Deadlines for a loop of reads from one response, at one timer for the whole response.

`asyncio.timeout` per read costs a timer handle armed and cancelled for every read of every
streamed answer. `ReadDeadline` keeps one timer: each read sets its own deadline (a float), and
the timer, when it fires, cancels the reading task only if a read is in progress and that read's
deadline has passed; otherwise it re-arms for the current read's deadline, or stays off until
the next read. Time spent between reads (the consumer holding the generator, e.g. while the
client drains) is never counted, as with a timeout around each read.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable

# A timer may run this much before its time (uvloop's timers have millisecond resolution).
_EARLY_S = 0.001


class ReadDeadline:
    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._handle: asyncio.TimerHandle | None = None
        self._reader: asyncio.Task[object] | None = None  # the task in a read, if any
        self._deadline = 0.0
        self._expired = False

    async def read(self, read: Awaitable[bytes], deadline: float) -> bytes:
        """`await read`, or TimeoutError when it has not completed by `deadline` (loop time)."""
        task = asyncio.current_task()
        assert task is not None
        self._deadline = deadline
        handle = self._handle
        if handle is None or handle.when() > deadline:
            if handle is not None:
                handle.cancel()
            self._handle = self._loop.call_at(deadline, self._fire)
        self._reader = task
        try:
            return await read
        except asyncio.CancelledError:
            if self._expired:
                self._expired = False
                if task.uncancel() == 0:  # only the deadline cancelled it
                    raise TimeoutError from None
            raise
        finally:
            self._reader = None

    def close(self) -> None:
        """No more reads: stop the timer."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _fire(self) -> None:
        self._handle = None
        reader = self._reader
        if reader is None:
            return  # between reads: the next read arms the timer again
        if self._loop.time() + _EARLY_S < self._deadline:
            self._handle = self._loop.call_at(self._deadline, self._fire)
            return
        self._expired = True
        reader.cancel()
