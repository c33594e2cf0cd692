"""Keep-alive pacing for streams: an event iterator that also reports silences."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator
from typing import TypeVar

T = TypeVar("T")


async def paced(source: AsyncIterator[T], interval_s: float) -> AsyncGenerator[T | None, None]:
    """The items of `source`, with a None each time `interval_s` seconds pass without one.

    The pending read runs in a task of its own; closing this generator cancels it and waits for
    it, so `source` may be closed right afterwards.
    """
    pending: asyncio.Future[T] | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(anext(source))
            done, _ = await asyncio.wait((pending,), timeout=interval_s)
            if not done:
                yield None
                continue
            ready, pending = pending, None
            try:
                item = ready.result()
            except StopAsyncIteration:
                return
            yield item
    finally:
        if pending is not None:
            pending.cancel()
            await asyncio.wait((pending,))
            if not pending.cancelled():
                pending.exception()  # retrieved: a failure after the client left is not news
