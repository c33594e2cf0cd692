"""How many output tokens a request reserves, and which limit (if any) is sent upstream.

The reservation is not a cap. A request that sets no max_tokens reserves the model's real output
limit (its worst case) and is sent upstream with no limit, unless the operator set the model's
`default_max_tokens`. The limit reserved is, first that applies: the model's `max_output_tokens`
in settings; a local engine's context length minus the prompt; `limits.default_max_tokens` (a
reservation only). A client's max_tokens is reserved up to that limit and always sent. A grant
below the reservation (a budget or TPM window nearly spent) is always sent: it is the cap that
keeps the key within its limits.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from gateway.config.providers import ModelSettings
from gateway.routing import Route
from plumbing.record import record


@record
class OutputPlan:
    reserve: int  # completion tokens admission reserves
    limit: int | None  # the client's max_tokens, else the model's default_max_tokens

    def upstream(self, granted: int) -> int | None:
        """The max_tokens to send upstream once admission granted `granted` tokens."""
        if self.limit is None and granted >= self.reserve:
            return None
        return granted


class OutputLimits:
    """Output limits per public model, from settings, and from the routes' providers."""

    def __init__(self, models: Mapping[str, ModelSettings], fallback: int) -> None:
        self._limits = {
            name: (model.max_output_tokens, model.default_max_tokens)
            for name, model in models.items()
        }
        self._fallback = fallback

    def plan(
        self, model: str, routes: Iterable[Route], prompt_tokens: int, requested: int | None
    ) -> OutputPlan:
        ceiling, default = self._limits.get(model, (None, None))
        if ceiling is None:
            ceiling = context_room(routes, prompt_tokens)
        limit = requested or default
        if limit is None:
            return OutputPlan(ceiling or self._fallback, None)
        return OutputPlan(min(limit, ceiling) if ceiling else limit, limit)


def context_room(routes: Iterable[Route], prompt_tokens: int) -> int | None:
    """The most tokens any route's provider can add after the prompt, for providers that know
    their context length (the local engine); None when none does."""
    rooms = [
        max(int(length) - prompt_tokens, 1)
        for route in routes
        if (length := getattr(route.provider, "context_length", None)) is not None
    ]
    return max(rooms) if rooms else None
