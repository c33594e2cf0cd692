"""ReadDeadline: one timer for a loop of reads, each read with its own deadline."""

from __future__ import annotations

import asyncio

import pytest

from providers.transport.read_deadline import ReadDeadline


async def test_a_read_past_its_deadline_times_out() -> None:
    reads = ReadDeadline()
    never: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
    with pytest.raises(TimeoutError):
        await reads.read(never, asyncio.get_running_loop().time() + 0.05)
    reads.close()


async def test_reads_within_their_deadlines_return_and_time_between_reads_is_not_counted() -> None:
    loop = asyncio.get_running_loop()
    reads = ReadDeadline()
    first = loop.create_future()
    first.set_result(b"a")
    assert await reads.read(first, loop.time() + 0.05) == b"a"
    await asyncio.sleep(0.1)  # the consumer holds the stream past the first read's deadline
    later = loop.create_future()
    loop.call_soon(later.set_result, b"b")
    assert await reads.read(later, loop.time() + 60) == b"b"
    reads.close()


async def test_a_later_read_with_an_earlier_deadline_is_still_timed() -> None:
    loop = asyncio.get_running_loop()
    reads = ReadDeadline()
    done = loop.create_future()
    done.set_result(b"a")
    await reads.read(done, loop.time() + 60)  # arms the timer far ahead
    never: asyncio.Future[bytes] = loop.create_future()
    with pytest.raises(TimeoutError):
        await reads.read(never, loop.time() + 0.05)
    reads.close()


async def test_a_cancelled_reader_stays_cancelled() -> None:
    loop = asyncio.get_running_loop()
    reads = ReadDeadline()
    never: asyncio.Future[bytes] = loop.create_future()
    task = asyncio.ensure_future(reads.read(never, loop.time() + 60))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    reads.close()
