"""`BusyWait`: keep an event loop polling, not sleeping, while it awaits a few fast answers.

Redis answers a script, and a nearby upstream (a vLLM/SGLang node, a mock) its first bytes, in tens
of microseconds; a sleeping virtual CPU takes about as long again to wake (at one client, polling
takes about 0.06 to 0.1 ms off a request's added latency). So for up to `Spin.seconds` after an
answer is awaited, while at most `Spin.max_waiting` answers are, one callback keeps the loop
turning: each turn polls the loop's sockets without a timeout and yields
the CPU to any process ready to run on it (Redis itself, on a busy machine). With more answers
awaited the loop is busy anyway, and spinning would only cost CPU: a loop that never sleeps takes
fewer events per poll, and pays more per event (so an upstream answer counts until it has been read
and its connection released, not only until its last byte arrived). One `BusyWait` per serving
process, shared by everything that waits (the Redis scripts, the upstream connections): one spin at
a time.

Callers pair `begin()` (an answer is now awaited) with exactly one `end()` (it came, failed or
was given up); an unpaired `begin` only keeps the spin off later (the count stays above the
bound), it never spins past `seconds`. Answers that are not worth polling for (an upstream
across a network) still count through `counting()`: they never start a spin, but while more
than `max_waiting` answers of any kind are awaited the process is busy, and a Redis reply
awaited then is not polled for either (without them, a gateway serving dozens of upstream
requests at once polled for nearly every Redis reply).
"""

from __future__ import annotations

import asyncio
import os
import time

from plumbing.record import record


@record
class Spin:
    """Poll instead of sleeping for up to `seconds` after an answer is awaited, while at most
    `max_waiting` answers are awaited (seconds 0: always sleep)."""

    seconds: float = 0.0
    max_waiting: int = 4


NO_SPIN = Spin()


class BusyWait:
    """The process's spin: `begin` when an answer is awaited, `end` when it is no longer."""

    def __init__(self, spin: Spin = NO_SPIN) -> None:
        self.spin = spin
        self.waiting = 0
        self._until = 0.0
        self._spinning = False

    def begin(self, loop: asyncio.AbstractEventLoop, answers: int = 1) -> None:
        """`answers` more are awaited on `loop` (the caller's: asking asyncio for it costs a
        getpid()): spin for up to `spin.seconds` from now if few are."""
        self.waiting += answers
        seconds = self.spin.seconds
        if not seconds or self.waiting > self.spin.max_waiting:
            return
        self._until = time.perf_counter() + seconds
        if not self._spinning:
            self._spinning = True
            loop.call_soon(self._turn, loop)

    def end(self, answers: int = 1) -> None:
        self.waiting -= answers

    def _turn(self, loop: asyncio.AbstractEventLoop) -> None:
        """One turn of the wait: a callback that stays ready makes the loop poll its sockets
        without sleeping."""
        waiting = self.waiting
        if 0 < waiting <= self.spin.max_waiting and time.perf_counter() < self._until:
            os.sched_yield()
            loop.call_soon(self._turn, loop)
        else:
            self._spinning = False


class Counting(BusyWait):
    """Answers awaited that count toward `shared`'s bound but never start its spin (see the
    module's docstring)."""

    def __init__(self, shared: BusyWait) -> None:
        super().__init__(NO_SPIN)
        self.shared = shared

    def begin(self, loop: asyncio.AbstractEventLoop, answers: int = 1) -> None:
        self.shared.waiting += answers

    def end(self, answers: int = 1) -> None:
        self.shared.waiting -= answers


def counting(busy: BusyWait) -> BusyWait:
    """A `BusyWait` for answers that count toward `busy`'s bound and never start a spin."""
    return Counting(busy)
