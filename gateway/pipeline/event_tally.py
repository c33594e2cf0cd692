"""What the pipeline keeps of a provider's event stream: a tally of what the client was sent
(for settlement when no Usage arrives) and the wrappers the stream passes through."""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from providers.types import (
    Event,
    Finish,
    FinishReason,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
    Usage,
)

if TYPE_CHECKING:
    from gateway.errors import GatewayError
    from gateway.routing import Route


@dataclass(slots=True)
class Tally:
    """What the client has been sent so far, for settlement when no Usage arrives, and the
    route that answered (None until one did)."""

    route: Route | None = None
    deltas: int = 0
    first_at: float | None = None
    usage: Usage | None = None
    finish: FinishReason | None = None
    failed: bool = False  # the provider failed after the first event (counts for its breaker)
    failed_with: str = ""  # that failure, for the breaker's last error
    breaker_key: tuple[str, str, str] | None = None  # the route key that answered
    failure: GatewayError | None = None  # what ended a stream after its headers were sent
    settled: bool = False  # settled before the answer's last bytes (the `finally` need not)

    def see(self, event: Event) -> None:
        if isinstance(event, TextDelta | ReasoningDelta | ToolCallDelta):
            self.deltas += 1
            if self.first_at is None:
                self.first_at = time.perf_counter()
        elif isinstance(event, Usage):
            self.usage = event
        elif isinstance(event, Finish):
            self.finish = event.reason


async def empty() -> AsyncGenerator[Event, None]:
    return
    yield


async def prepend(
    first: Event | None, rest: AsyncGenerator[Event, None], tally: Tally
) -> AsyncGenerator[Event, None]:
    try:
        if first is not None:
            yield first
        async for event in rest:
            tally.see(event)
            yield event
    finally:
        await rest.aclose()


async def without_reasoning(events: AsyncGenerator[Event, None]) -> AsyncGenerator[Event, None]:
    """The events without reasoning (a key whose policy is thinking "off" never receives any,
    even from an upstream that reasons anyway)."""
    try:
        async for event in events:
            if not isinstance(event, ReasoningDelta):
                yield event
    finally:
        await events.aclose()
