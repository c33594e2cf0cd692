"""The routing step of a request: model -> routes, the prompt prepared once, the decision.

`plan` resolves the public model (a model this gateway does not serve falls back to the key's
default model), checks the key may use it, starts reading the conversation's stored mode where
the decision will need it, prepares the prompt off the event loop meanwhile where a route's
provider prepares prompts (the local engine: the ids and their block hashes then travel with the
request to the router, admission, the engine and usage; nothing tokenizes or hashes it again;
where the decision will run the judge, its reading of the ask rides the same worker thread),
and asks the router seam for a decision. A fill-in-the-middle request keeps only the routes whose
provider can serve it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from gateway.access.contract import Principal, require_model
from gateway.errors import InvalidRequest, NotFound
from gateway.observability.metrics import Metrics
from gateway.pipeline.prompt_estimates import prompt_tokens
from gateway.routing.aliases import Route, Router
from gateway.routing.ask import Ask, ask_of
from gateway.routing.decide import Decider, Decision, RoutingInput
from gateway.routing.explain import on_off
from providers.errors import EngineLoading
from providers.types import ChatRequest


def fim_routes(public_model: str, routes: tuple[Route, ...]) -> tuple[Route, ...]:
    """The routes whose provider fills in the middle (its `supports_fim`: the local engine,
    OpenAI-style upstreams unless `fim = "none"`); a 400 when there is none."""
    able = tuple(r for r in routes if getattr(r.provider, "supports_fim", False))
    if not able:
        names = ", ".join(dict.fromkeys(r.provider_name for r in routes))
        raise InvalidRequest(
            f"Model '{public_model}' cannot fill in the middle: none of its providers "
            f"({names}) takes 'suffix'. Send the request without 'suffix', or to a model "
            "served by the local engine or an upstream configured with `fim`.",
            param="suffix",
            code="unsupported_value",
        )
    return able


class RoutePlanner:
    def __init__(self, router: Router, decider: Decider, metrics: Metrics) -> None:
        self.router = router
        self.decider = decider
        self.metrics = metrics
        self._counters: dict[tuple[str, ...], Any] = {}

    async def plan(
        self, principal: Principal, chat: ChatRequest, protocol: str
    ) -> tuple[str, ChatRequest, Decision]:
        """The public model served, the request (its prompt prepared), and the decision."""
        public_model, routes = self._resolve(chat.model, principal)
        require_model(principal, public_model)
        if chat.suffix is not None:
            routes = fim_routes(public_model, routes)
        mode = self.router.mode(public_model)
        policy, key_id = principal.policy, principal.key_id
        recalled = self.decider.recall(chat, public_model, mode, policy, key_id)
        reads_ask = self.decider.reads_ask(mode, policy, chat)
        chat, ask = await self._prepare(chat, routes, principal, reads_ask)
        decision = await self.decider.decide(
            RoutingInput(
                request=chat,
                protocol=protocol,
                public_model=public_model,
                routes=routes,
                mode=mode,
                policy=policy,
                key_id=key_id,
                prompt_tokens=prompt_tokens(chat),
                ask=ask,
            ),
            recalled,
        )
        return public_model, chat, decision

    def count(self, decision: Decision, route: Route) -> None:
        """The Prometheus count of the decision applied (and of the shadow one, if any)."""
        thinking = on_off(decision.thinking_for(route))
        provider, load = route.provider_name, decision.load
        self._counter(provider, thinking, decision.reason_for(route), "applied", load).inc()
        shadow = decision.shadow
        if shadow is not None:
            self._counter(provider, on_off(shadow.thinking), shadow.reason, "shadow", load).inc()

    def _counter(self, *labels: str) -> Any:
        """The labelled child, cached (reasons and load choices are bounded sets: rule names
        come from settings; gateway/routing/explain.py)."""
        child = self._counters.get(labels)
        if child is None:
            child = self._counters[labels] = self.metrics.routing_decisions.labels(*labels)
        return child

    def _resolve(self, model: str, principal: Principal) -> tuple[str, tuple[Route, ...]]:
        """The configured model served (a client's own id mapped by `model_patterns`, else the
        key's default model for an id this gateway does not serve) and its routes."""
        model = self.router.canonical(model)
        try:
            return model, self.router.resolve(model)
        except NotFound:
            default = principal.policy.default_model
            if default is None or default == model:
                raise
            return default, self.router.resolve(default)

    async def _prepare(
        self, chat: ChatRequest, routes: tuple[Route, ...], principal: Principal, reads_ask: bool
    ) -> tuple[ChatRequest, Ask | None]:
        """The request with its prompt prepared by the first route that prepares prompts (and,
        with `reads_ask`, the judge's ask read in the same worker thread). A local engine still
        loading prepares nothing: its route answers `engine_loading` when tried, and the next
        route serves."""
        for route in routes:
            provider = route.provider
            prepare = getattr(provider, "prepare", None)
            if prepare is None or not principal.policy.may_use(self.decider.is_local(route)):
                continue
            prepare_with = getattr(provider, "prepare_with", None) if reads_ask else None
            try:
                if prepare_with is not None:
                    prepared, ask = await prepare_with(chat, ask_of)  # may raise ProviderError
                    return replace(chat, prepared=prepared), ask
                return replace(chat, prepared=await prepare(chat)), None  # may raise, too
            except EngineLoading:
                continue
        return chat, None
