"""The access-control contract the request pipeline calls: who asks, may they, and what it cost.

One request makes three calls, each at most one Redis round trip:
  authenticate(token)  -> Principal            (before the body is parsed)
  admit(ticket)        -> Grant                (reserve the worst case, count the request)
  settle(grant, outcome)                       (in a `finally`: charge actuals, release the rest)
or, when admission refuses it for its budget or a rate limit (429),
  refused(ticket, outcome)                     (record the refusal: no tokens, its status and code)
Failures raise `gateway.errors` exceptions (AuthenticationError, PermissionDenied, RateLimited,
QuotaExceeded), which the error middleware renders as OpenAI error JSON.
"""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import field
from typing import Protocol

from gateway.errors import PermissionDenied
from gateway.routing.policy import DEFAULT_POLICY, KeyPolicy
from plumbing.record import record
from providers.types import Usage


@record
class Principal:
    """An authenticated caller. `models` None means every model. `credential` is the access
    control's own handle on the presented secret (e.g. its digest), never the secret itself.
    `policy`: the key's routing policy (thinking, reasoning budget, providers, default model)."""

    key_id: str
    name: str
    models: frozenset[str] | None = None
    credential: str = ""
    policy: KeyPolicy = DEFAULT_POLICY

    def may_use(self, model: str) -> bool:
        return self.models is None or model in self.models


def require_model(principal: Principal, model: str) -> None:
    """Raise 403 `model_not_allowed` unless the key may use `model`."""
    if not principal.may_use(model):
        message = f"This API key may not use the model '{model}'."
        raise PermissionDenied(message, param="model", code="model_not_allowed")


@record
class Ticket:
    """What admission needs to know before the provider is called."""

    principal: Principal
    model: str
    request_id: str
    prompt_tokens: int  # estimated (a real tokenizer where the model has one)
    max_tokens: int  # the client's max_tokens, or the settings default
    # The bounded name metrics and usage counters use for `model` (Router.label); None: `model`.
    label: str | None = None
    # The routes that may serve it, (provider, provider-side model), in order: what a cost
    # budget prices the worst case by.
    routes: tuple[tuple[str, str], ...] = ()

    @property
    def counted_model(self) -> str:
        return self.model if self.label is None else self.label


@record
class Grant:
    """An admitted request. `max_tokens` may be lower than asked when the budget is nearly spent
    (the stream then ends with finish_reason "length"). `headers` are the x-ratelimit-* headers."""

    ticket: Ticket
    max_tokens: int
    reserved_tokens: int
    headers: dict[str, str] = field(default_factory=dict)
    token: str = ""  # the implementation's handle for settle (e.g. a concurrency slot id)
    reserved_cost: int = 0  # held against a cost budget, in millionths of the currency


@record
class Outcome:
    """What actually happened, for settlement and the usage record."""

    usage: Usage
    status: int  # HTTP status the client saw (a stream that failed mid-way: its 200)
    provider: str = ""
    route_model: str = ""
    thinking: bool | None = None
    latency_ms: float = 0.0
    ttft_ms: float | None = None
    # What went wrong, as the client was told (a stream that failed mid-way: its error event's)
    error_code: str | None = None
    route_reason: str = ""  # why this route and thinking mode (see gateway/routing/explain.py)
    route: str = ""  # the x-gateway-route header the client got


class AccessControl(Protocol):
    """`admit` and `settle` return awaitables (coroutines, or futures already under way: the
    Redis implementation sends its script at the call, without a task of its own)."""

    async def authenticate(self, token: str | None) -> Principal: ...

    def admit(self, ticket: Ticket) -> Awaitable[Grant]: ...

    def settle(self, grant: Grant, outcome: Outcome) -> Awaitable[None]: ...

    def refused(self, ticket: Ticket, outcome: Outcome) -> Awaitable[None]: ...
