"""Keep-alive pacing for streams: an event iterator that also reports silences, and the frames
of a stream with keep-alive frames in its silences."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Protocol, TypeVar

from providers.types import Event

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


class FrameEncoder(Protocol):
    def encode(self, event: Event) -> bytes | None: ...
    def keepalive(self) -> bytes | None: ...


async def frames(
    events: AsyncIterator[Event], encoder: FrameEncoder, interval_s: float
) -> AsyncGenerator[bytes, None]:
    """The frames of `events` as `encoder` writes them; where the encoder has a keep-alive frame,
    it comes after every `interval_s` seconds in which no frame was yielded."""
    keepalive = encoder.keepalive()
    if keepalive is None:
        async for event in events:
            frame = encoder.encode(event)
            if frame is not None:
                yield frame
        return
    loop = asyncio.get_running_loop()
    written = loop.time()
    source = paced(events, interval_s)
    try:
        async for item in source:
            frame = encoder.encode(item) if item is not None else None
            if frame is None and loop.time() - written >= interval_s:
                frame = keepalive
            if frame is not None:
                yield frame
                written = loop.time()
    finally:
        await source.aclose()
