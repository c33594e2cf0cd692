"""Access control for `auth.enabled = false`: everyone is one anonymous principal, nothing is
limited or recorded. For private deployments behind their own authentication, and as the
baseline the access-control overhead is measured against."""

from __future__ import annotations

from gateway.access import Grant, Outcome, Principal, Ticket

ANONYMOUS = Principal(key_id="anonymous", name="anonymous")


class OpenAccess:
    async def authenticate(self, token: str | None) -> Principal:
        return ANONYMOUS

    async def admit(self, ticket: Ticket) -> Grant:
        return Grant(ticket=ticket, max_tokens=ticket.max_tokens, reserved_tokens=0)

    async def settle(self, grant: Grant, outcome: Outcome) -> None:
        return None
