"""Model alias -> ordered routes (provider + provider-side model + thinking policy).

A client asks for a public model id. Configured models map to their routes in order (the next one
is tried when a route fails before the first byte reached the client). `provider/model` addresses
a live provider's model directly, e.g. `deepseek/deepseek-chat`, only where that provider's
`direct_models` allows the model (a name or a glob pattern such as `deepseek-*`); direct
addressing is static. Each configured model has a routing mode (static, auto, shadow: see
gateway/routing/decide.py).

Metrics and usage counters name a model by `label`: a configured model id, or for a direct
address the `provider/pattern` that allowed it, so clients cannot create series or usage fields
by inventing names.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from fnmatch import fnmatchcase

from gateway.config.providers import ModelSettings, RoutingMode
from gateway.errors import NotFound
from plumbing.record import record
from providers.base import ModelCard, Provider


@record
class Route:
    provider: Provider
    model: str
    thinking: bool | None  # forced by the route; None leaves the client's choice

    @property
    def provider_name(self) -> str:
        return self.provider.name

    def thinking_for(self, requested: bool | None) -> bool | None:
        return self.thinking if self.thinking is not None else requested


class Router:
    def __init__(
        self,
        providers: Mapping[str, Provider],
        models: Mapping[str, ModelSettings],
        direct: Mapping[str, tuple[str, ...]] | None = None,
        patterns: Mapping[str, str] | None = None,
    ):
        """`direct`: per provider, the names or glob patterns of its models that clients may
        address as `provider/model` (none where a provider is absent). `patterns`: model-id
        patterns (fnmatch, first match wins) mapped to a configured model."""
        self.providers = dict(providers)
        self._direct = {name: tuple(p) for name, p in (direct or {}).items() if p}
        self._patterns = tuple((patterns or {}).items())
        self._created = int(time.time())  # what /v1/models reports as each model's `created`
        self._routes: dict[str, tuple[Route, ...]] = {}
        self._owners: dict[str, str] = {}
        self._modes: dict[str, RoutingMode] = {}
        for model_id, model in models.items():
            routes = tuple(
                Route(self.providers[r.provider], r.model, r.thinking)
                for r in model.routes
                if r.provider in self.providers
            )
            if routes:
                self._routes[model_id] = routes
                self._owners[model_id] = model.owned_by
                self._modes[model_id] = model.routing

    def canonical(self, model: str) -> str:
        """The configured model a client's id stands for: itself, or the target of the first
        model pattern it matches (configured ids and `provider/model` ids are never mapped)."""
        if model in self._routes or "/" in model:
            return model
        for pattern, target in self._patterns:
            if fnmatchcase(model, pattern):
                return target
        return model

    def resolve(self, model: str) -> tuple[Route, ...]:
        routes = self._routes.get(model)
        if routes:
            return routes
        if self._direct_pattern(model) is not None:
            provider_name, _, upstream_model = model.partition("/")
            return (Route(self.providers[provider_name], upstream_model, None),)
        raise NotFound(
            f"The model '{model}' does not exist or is not served by this gateway. "
            "GET /v1/models lists the available models.",
            param="model",
            code="model_not_found",
        )

    def _direct_pattern(self, model: str) -> str | None:
        """The `direct_models` pattern that lets `provider/model` through, if any."""
        provider_name, sep, upstream_model = model.partition("/")
        if not sep or not upstream_model or provider_name not in self.providers:
            return None
        for pattern in self._direct.get(provider_name, ()):
            if fnmatchcase(upstream_model, pattern):
                return pattern
        return None

    def label(self, model: str) -> str:
        """The bounded name `model` is counted under in metrics and usage (see the module)."""
        if model in self._routes:
            return model
        pattern = self._direct_pattern(model)
        if pattern is not None:
            return f"{model.partition('/')[0]}/{pattern}"
        return "other"

    def mode(self, model: str) -> RoutingMode:
        return self._modes.get(model, "static")

    def cards(self) -> list[ModelCard]:
        """The public model list (configured models; direct provider/model ids are not listed)."""
        return [ModelCard(m, self._owners[m], self._created) for m in self._routes]

    def card(self, model: str) -> ModelCard:
        """The card of whatever a request may name, under the id asked for: a configured model,
        a client id a model pattern maps to one, or a `provider/model` the provider allows."""
        target = self.canonical(model)
        if target in self._routes:
            return ModelCard(model, self._owners[target], self._created)
        if self._direct_pattern(model) is not None:
            return ModelCard(model, model.partition("/")[0], self._created)
        raise NotFound(f"The model '{model}' does not exist", param="model", code="model_not_found")
