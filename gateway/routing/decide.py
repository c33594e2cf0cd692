"""The router seam: one request's route list, thinking decision and reasons.

`Decider.decide` sees the normalized request (messages, tools, the prepared prompt's token
count and block hashes, the client's explicit thinking switch in `request.thinking`, the
front-end protocol), the key's policy, and the local engine's load and prefix cache, and returns
a `Decision`. Provider health (the breakers) is applied as each route is tried, so a skipped
route costs no time.

Thinking, first rule that applies:
  1. the key's policy "off" / "on"                       reason policy:off | policy:on
  2. the client's explicit switch, if the policy is "client"   reason client
     (under policy "auto" the switch is refused: noted as client=refused)
  3. static models: the route's forced mode, else the client's, else the provider's default
                                                          reason route | default
  4. auto models: rules, the conversation's mode for a turn that continues the work, the
     learned model                                        (see judge.py)
A "shadow" model is served as static, and what "auto" would have done is reported beside it.
Local or upstream (auto models): see local_first.py; a key limited to the local engine never
gets an upstream route.
The conversation's stored mode (turns of auto and shadow models that continue the work: a tool
result, "continue"; see ask.py) is read by `recall`,
which the planner starts before the prompt is prepared so the round trip overlaps that work.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Mapping

from gateway.config.providers import RoutingMode
from gateway.config.routing import RoutingSettings
from gateway.errors import PermissionDenied
from gateway.routing.aliases import Route
from gateway.routing.ask import Ask, turn_of
from gateway.routing.judge import Judge, Verdict
from gateway.routing.local_first import LoadChoice, LocalFirst
from gateway.routing.policy import KeyPolicy
from gateway.routing.sticky import Stickiness, conversation_id
from plumbing.record import record
from providers.types import ChatRequest


@record
class RoutingInput:
    request: ChatRequest  # normalized; `thinking` is the client's explicit switch (or None)
    protocol: str  # chat | completions | responses | messages
    public_model: str
    routes: tuple[Route, ...]
    mode: RoutingMode
    policy: KeyPolicy
    key_id: str
    prompt_tokens: int  # the prepared prompt's (exact where a route prepared it)
    ask: Ask | None = None  # the judge's ask, where it was read with the prompt's preparation


@record
class Decision:
    routes: tuple[Route, ...]  # in the order to try
    thinking: bool | None  # None: per route (its forced mode, else the client's switch)
    reason: str
    client_thinking: bool | None = None
    score: float | None = None
    shadow: Verdict | None = None  # what "auto" would have decided, for a shadow model
    notes: tuple[str, ...] = ()  # "client=refused", "cached=4096", "kept=prefix", ...
    load: LoadChoice = "none"  # the local-or-upstream choice (local_first.py)

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
        providers: Mapping[str, object],
        stickiness: Stickiness | None,
    ) -> None:
        """`local`: the names of local-engine providers; `providers`: every provider by name
        (the local ones tell their load and prefix cache: local_first.LocalEngine)."""
        self.judge = Judge(settings)
        self._local = local
        self._local_first = LocalFirst(settings, local, providers)
        self._stickiness = stickiness

    def is_local(self, route: Route) -> bool:
        return route.provider_name in self._local

    def reads_ask(self, mode: RoutingMode, policy: KeyPolicy, request: ChatRequest) -> bool:
        """Whether `decide` will run the judge on the request (so its ask may be read ahead,
        with the prompt's preparation)."""
        return _model_decides(mode, policy, request.thinking)

    def recall(
        self,
        request: ChatRequest,
        public_model: str,
        mode: RoutingMode,
        policy: KeyPolicy,
        key_id: str,
    ) -> asyncio.Task[bool | None] | None:
        """Start reading the conversation's stored mode where `decide` will need it (a turn
        that continues the work, the model deciding thinking), so the round trip runs
        meanwhile."""
        sticky = self._stickiness
        if sticky is None or not _model_decides(mode, policy, request.thinking):
            return None
        if turn_of(request) == "new":
            return None
        conversation = conversation_id(key_id, public_model, request)
        return sticky.recall(conversation) if conversation is not None else None

    async def decide(
        self, inp: RoutingInput, recalled: Awaitable[bool | None] | None = None
    ) -> Decision:
        """`recalled`: what `recall` started for this request (read here when not given)."""
        policy, client = inp.policy, inp.request.thinking
        routes = inp.routes
        if policy.providers != "any":
            routes = tuple(r for r in routes if policy.may_use(self.is_local(r)))
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
        load: LoadChoice = "none"
        if inp.mode == "auto":
            order = self._local_first.order(routes, inp.prompt_tokens, inp.request.prepared)
            routes, load = order.routes, order.choice
            notes.extend(order.notes())
        fixed = tuple(notes)
        if policy.thinking in ("off", "on"):
            on = policy.thinking == "on"
            return Decision(routes, on, f"policy:{policy.thinking}", client, notes=fixed, load=load)
        if client is not None and policy.thinking == "client":
            return Decision(routes, client, "client", client, notes=fixed, load=load)
        allowed = client if policy.thinking == "client" else None  # "auto" refuses it
        if inp.mode == "static":
            return Decision(routes, None, "static", allowed, notes=fixed, load=load)
        verdict = await self._auto(inp, recalled)
        if inp.mode == "shadow":
            return Decision(routes, None, "static", allowed, shadow=verdict, notes=fixed)
        return Decision(
            routes, verdict.thinking, verdict.reason, client, verdict.score, notes=fixed, load=load
        )

    async def _auto(self, inp: RoutingInput, recalled: Awaitable[bool | None] | None) -> Verdict:
        request = inp.request
        sticky = self._stickiness
        conversation = conversation_id(inp.key_id, inp.public_model, request)
        if sticky is None or conversation is None:
            return self.judge.judge(request, inp.protocol, inp.prompt_tokens, ask=inp.ask)
        mode: bool | None = None
        if recalled is not None:
            mode = await recalled
        elif turn_of(request) != "new":
            mode = await sticky.mode(conversation)
        verdict = self.judge.judge(request, inp.protocol, inp.prompt_tokens, mode, inp.ask)
        if verdict.reason != "sticky" and verdict.thinking != mode:
            sticky.remember(conversation, verdict.thinking)  # in the background
        return verdict


def _model_decides(mode: RoutingMode, policy: KeyPolicy, client: bool | None) -> bool:
    """Whether `decide` asks the auto decision (rules, the conversation's mode, the scorer)."""
    if mode == "static" or policy.thinking in ("off", "on"):
        return False
    return client is None or policy.thinking != "client"
