"""The pipeline's bookkeeping edges, with an AccessControl whose timing the test controls."""

from __future__ import annotations

import asyncio
import contextlib

from gateway.access.contract import Grant, Outcome, Principal, Ticket
from gateway.observability.metrics import Metrics
from gateway.pipeline.output_limits import OutputLimits
from gateway.pipeline.pipeline import Pipeline
from gateway.routing import Router
from gateway.wire.chat_response import ChatWire


class GatedAccess:
    """Admits only when the gate opens; records every settlement."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.settled: list[tuple[Grant, Outcome]] = []

    async def authenticate(self, token: str | None) -> Principal:
        return Principal("k", "n")

    async def admit(self, ticket: Ticket) -> Grant:
        await self.gate.wait()
        return Grant(ticket=ticket, max_tokens=ticket.max_tokens, reserved_tokens=42)

    async def settle(self, grant: Grant, outcome: Outcome) -> None:
        self.settled.append((grant, outcome))

    async def refused(self, ticket: Ticket, outcome: Outcome) -> None:
        raise AssertionError("nothing is refused here")


async def test_a_client_leaving_during_admission_gets_its_reservation_released() -> None:
    access = GatedAccess()
    pipeline = Pipeline(Router({}, {}), access, Metrics(), OutputLimits({}, fallback=100))
    ticket = Ticket(Principal("k", "n"), "m", "req-1", prompt_tokens=2, max_tokens=40)
    waiting = asyncio.ensure_future(pipeline._admit(ticket, ChatWire(include_usage=False)))
    await asyncio.sleep(0)
    waiting.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await waiting
    assert access.settled == []  # nothing was reserved yet
    access.gate.set()  # the reservation lands after the client left
    for _ in range(3):
        await asyncio.sleep(0)
    await pipeline.drain()
    ((grant, outcome),) = access.settled
    assert grant.reserved_tokens == 42 and grant.ticket.request_id == "req-1"
    assert outcome.status == 499 and outcome.error_code == "client_disconnected"
    assert outcome.usage.total_tokens == 0
