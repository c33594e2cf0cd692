"""What passes between callers' event loops and the engine thread of `AsyncEngine`: the
commands callers put in its inbox (`Add`, `Finish`), and each request's `OutputStream`, the
queue on the consumer's loop that the thread hands outputs to."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from backend.engine.interface import RequestOutput
from backend.engine.request import FinishReason
from backend.engine.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


@dataclass(slots=True, eq=False)
class OutputStream:
    """Where a request's outputs go: a queue owned by the consumer's event loop. `closed`
    (guarded by the engine's lock) once its consumer is gone or has its last item."""

    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[RequestOutput | BaseException]
    closed: bool = False

    def put(self, item: RequestOutput | BaseException) -> None:
        """Thread-safe hand-over; a closed loop has no consumer left to tell."""
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:
            logger.debug("dropped an output for a closed event loop")


@dataclass(frozen=True, slots=True)
class Add:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    stream: OutputStream
    grammar: object | None = None  # params.grammar compiled


@dataclass(frozen=True, slots=True)
class Finish:
    request_id: str
    reason: FinishReason
