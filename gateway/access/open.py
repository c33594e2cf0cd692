"""Access control for `auth.enabled = false`: everyone is one anonymous principal, nothing is
limited or recorded. For private deployments behind their own authentication, and as the
baseline the access-control overhead is measured against."""

from __future__ import annotations

import asyncio
from typing import TypeVar

from gateway.access.contract import Grant, Outcome, Principal, Ticket

ANONYMOUS = Principal(key_id="anonymous", name="anonymous")
T = TypeVar("T")


class OpenAccess:
    """Answers at once: admission and settlement are futures already done (no task, no turn
    of the event loop)."""

    async def authenticate(self, token: str | None) -> Principal:
        return ANONYMOUS

    def admit(self, ticket: Ticket) -> asyncio.Future[Grant]:
        return _done(Grant(ticket=ticket, max_tokens=ticket.max_tokens, reserved_tokens=0))

    def settle(self, grant: Grant, outcome: Outcome) -> asyncio.Future[None]:
        return _done(None)

    def refused(self, ticket: Ticket, outcome: Outcome) -> asyncio.Future[None]:
        return _done(None)


def _done(value: T) -> asyncio.Future[T]:
    future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
    future.set_result(value)
    return future
