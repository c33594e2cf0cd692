"""plumbing/busy_wait.py: when the loop polls instead of sleeping, and when it stops."""

from __future__ import annotations

import asyncio

import pytest

from plumbing import busy_wait
from plumbing.busy_wait import NO_SPIN, BusyWait, Spin, counting


@pytest.fixture
def yields(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """One entry per turn of the spin."""
    turns: list[int] = []
    monkeypatch.setattr(busy_wait.os, "sched_yield", lambda: turns.append(1))
    return turns


async def _turns(n: int = 20) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def test_it_spins_while_an_answer_is_awaited_and_stops_when_none_is(
    yields: list[int],
) -> None:
    busy = BusyWait(Spin(5.0, 4))
    loop = asyncio.get_running_loop()
    busy.begin(loop)
    await _turns()
    assert len(yields) >= 10  # every turn of the loop polled
    busy.end()
    await _turns()
    spun = len(yields)
    await _turns()
    assert len(yields) == spun and busy.waiting == 0


async def test_it_is_bounded_in_time(yields: list[int]) -> None:
    busy = BusyWait(Spin(0.02, 4))
    busy.begin(asyncio.get_running_loop())
    await asyncio.sleep(0.05)  # a sleep the spin keeps the loop polling through, for 20 ms
    spun = len(yields)
    assert spun
    await asyncio.sleep(0.05)
    assert len(yields) == spun  # still awaited, but past its time: the loop sleeps
    busy.begin(asyncio.get_running_loop())  # a new answer awaited: a new window
    await _turns()
    assert len(yields) > spun


async def test_it_is_off_with_more_answers_awaited_or_no_time(yields: list[int]) -> None:
    loop = asyncio.get_running_loop()
    busy = BusyWait(Spin(5.0, 2))
    busy.begin(loop, 3)  # more than two awaited: the loop is busy anyway
    await _turns()
    assert not yields
    busy.end(2)  # one left: the next one awaited starts the spin
    busy.begin(loop)
    await _turns()
    assert yields
    busy.end(2)
    await _turns()
    off = BusyWait(NO_SPIN)
    yields.clear()
    off.begin(loop)
    await _turns()
    assert not yields and off.waiting == 1


async def test_counted_answers_hold_the_spin_off_but_never_start_it(yields: list[int]) -> None:
    loop = asyncio.get_running_loop()
    busy = BusyWait(Spin(5.0, 2))
    upstream = counting(busy)
    upstream.begin(loop)  # an answer not polled for: no spin
    await _turns()
    assert not yields and busy.waiting == 1
    upstream.begin(loop, 2)  # three awaited in all: a Redis reply awaited now is not polled for
    busy.begin(loop)
    await _turns()
    assert not yields and busy.waiting == 4
    upstream.end(3)  # one left, the Redis reply: the next one awaited polls again
    busy.begin(loop)
    await _turns()
    assert yields
    busy.end(2)
    assert busy.waiting == 0 and upstream.waiting == 0
