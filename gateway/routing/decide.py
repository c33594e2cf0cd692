"""The router seam: one request's route list, thinking decision and reasons.

`Decider.decide` sees the normalized request (messages, tools, the prepared prompt's token
count, the client's explicit thinking switch in `request.thinking`, the front-end protocol),
the key's policy, and the providers' load, and returns a `Decision`. Provider health (the
breakers) is applied as each route is tried, so a skipped route costs no time.

Thinking, first rule that applies:
  1. the key's policy "off" / "on"                       reason policy:off | policy:on
  2. the client's explicit switch, if the policy is "client"   reason client
     (under policy "auto" the switch is refused: noted as client=refused)
  3. static models: the route's forced mode, else the client's, else the provider's default
                                                          reason route | default
  4. auto models: rules, the conversation's mode, the scorer   (see judge.py)
A "shadow" model is served as static, and what "auto" would have done is reported beside it.
Local or upstream (auto models): the local route leads while the prompt fits its context and
its queue is at most `local_max_queue`; otherwise upstream routes the key may use go first.
A key limited to the local engine never gets an upstream route.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gateway.errors import PermissionDenied
from gateway.routing.aliases import Route
from gateway.routing.judge import Judge, Verdict
from gateway.routing.policy import KeyPolicy
from gateway.routing.sticky import Stickiness, conversation_id, is_follow_up
from gateway.routing_settings import RoutingSettings
from gateway.settings import RoutingMode
from providers.types import ChatRequest, ProviderLoad


@dataclass(frozen=True, slots=True)
class RoutingInput:
    request: ChatRequest  # normalized; `thinking` is the client's explicit switch (or None)
    protocol: str  # chat | completions | responses | messages
    public_model: str
    routes: tuple[Route, ...]
    mode: RoutingMode
    policy: KeyPolicy
    key_id: str
    prompt_tokens: int  # the prepared prompt's (exact where a route prepared it)


@dataclass(frozen=True, slots=True)
class Decision:
    routes: tuple[Route, ...]  # in the order to try
    thinking: bool | None  # None: per route (its forced mode, else the client's switch)
    reason: str
    client_thinking: bool | None = None
    score: float | None = None
    shadow: Verdict | None = None  # what "auto" would have decided, for a shadow model
    notes: tuple[str, ...] = ()  # "client=refused", "overflow=queue", ...

    def thinking_for(self, route: Route) -> bool | None:
        if self.thinking is not None:
            return self.thinking
        return route.thinking_for(self.client_thinking)

    def reason_for(self, route: Route) -> str:
        if self.reason != "static":
            return self.reason
        if route.thinking is not None:
            return "route"
        return "client" if self.client_thinking is not None else "default"


class Decider:
    def __init__(
        self,
        settings: RoutingSettings,
        local: frozenset[str],
        loads: Mapping[str, object],
        stickiness: Stickiness | None,
    ) -> None:
        self.judge = Judge(settings)
        self._local = local  # names of local-engine providers
        self._loads = dict(loads)  # provider name -> object with load() -> ProviderLoad
        self._stickiness = stickiness
        self._max_queue = settings.local_max_queue

    def is_local(self, route: Route) -> bool:
        return route.provider_name in self._local

    async def decide(self, inp: RoutingInput) -> Decision:
        policy, client = inp.policy, inp.request.thinking
        routes = tuple(r for r in inp.routes if policy.may_use(self.is_local(r)))
        if not routes:
            raise PermissionDenied(
                f"This API key may use only the local engine, and the model "
                f"'{inp.public_model}' is not served by it.",
                param="model",
                code="provider_not_allowed",
            )
        notes: list[str] = []
        if client is not None and policy.thinking == "auto":
            notes.append("client=refused")
        if inp.mode == "auto":
            routes = self._by_load(routes, inp.prompt_tokens, notes)
        if policy.thinking in ("off", "on"):
            fixed = policy.thinking == "on"
            return Decision(routes, fixed, f"policy:{policy.thinking}", client, notes=tuple(notes))
        if client is not None and policy.thinking == "client":
            return Decision(routes, client, "client", client, notes=tuple(notes))
        allowed = client if policy.thinking == "client" else None  # "auto" refuses it
        if inp.mode == "static":
            return Decision(routes, None, "static", allowed, notes=tuple(notes))
        verdict = await self._auto(inp)
        if inp.mode == "shadow":
            return Decision(routes, None, "static", allowed, shadow=verdict, notes=tuple(notes))
        return Decision(
            routes, verdict.thinking, verdict.reason, client, verdict.score, notes=tuple(notes)
        )

    async def _auto(self, inp: RoutingInput) -> Verdict:
        request = inp.request
        conversation = conversation_id(inp.key_id, inp.public_model, request)
        mode: bool | None = None
        sticky = self._stickiness if conversation is not None else None
        if sticky is not None and conversation is not None and is_follow_up(request):
            mode = await sticky.mode(conversation)
        verdict = self.judge.judge(request, inp.protocol, inp.prompt_tokens, mode)
        if sticky is not None and conversation is not None and mode is None:
            await sticky.remember(conversation, verdict.thinking)
        return verdict

    def _by_load(
        self, routes: tuple[Route, ...], prompt_tokens: int, notes: list[str]
    ) -> tuple[Route, ...]:
        """Local first while it can serve well; else the upstream routes first."""
        first = routes[0]
        upstream = tuple(r for r in routes if not self.is_local(r))
        if not self.is_local(first) or not upstream:
            return routes
        load = self._load(first.provider_name)
        if load is None:
            return routes
        if prompt_tokens >= load.max_context:
            notes.append("overflow=context")
        elif load.queue_after() > self._max_queue:
            notes.append("overflow=queue")
        else:
            return routes
        local = tuple(r for r in routes if self.is_local(r))
        return upstream + local

    def _load(self, provider: str) -> ProviderLoad | None:
        source = self._loads.get(provider)
        load = getattr(source, "load", None)
        return load() if load is not None else None
