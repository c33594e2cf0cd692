"""What a request costs, from `[usage]` prices: computed once, at settlement."""

from __future__ import annotations

from gateway.config.usage import Price, UsageSettings

_FREE = Price()


class Pricing:
    """Price lookup, first match: `route_prices['<provider>/<route model>']`, then the local
    engine's price for a local provider, then `prices[<model asked for>]`, else free."""

    def __init__(self, settings: UsageSettings, local_providers: frozenset[str]) -> None:
        self.currency = settings.currency
        self._routes = settings.route_prices
        self._models = settings.prices
        self._local = settings.local_price
        self._local_providers = local_providers

    @property
    def free(self) -> bool:
        """No price set anywhere: every request costs 0 (settlement then prices nothing)."""
        local = self._local
        return (
            not self._routes
            and not self._models
            and local.input == 0
            and local.output == 0
            and not local.cached_input
        )

    def price(self, model: str, provider: str, route_model: str) -> Price:
        found = self._routes.get(f"{provider}/{route_model}")
        if found is not None:
            return found
        if provider in self._local_providers:
            return self._local
        return self._models.get(model, _FREE)

    def worst(self, model: str, routes: tuple[tuple[str, str], ...]) -> tuple[float, float]:
        """The dearest (input, output) price per million tokens over the routes that may serve
        a request for `model` ((provider, route model) pairs; none: the model's own price).
        Input is the dearer of cached and uncached input, as the cache hit is not known yet."""
        prices = [self.price(model, provider, route) for provider, route in routes] or [
            self._models.get(model, _FREE)
        ]
        dearest_in = max(max(p.input, p.cached_input or 0.0) for p in prices)
        return dearest_in, max(p.output for p in prices)

    def cost(
        self,
        model: str,
        provider: str,
        route_model: str,
        prompt_tokens: int,
        cached_tokens: int,
        completion_tokens: int,
    ) -> float:
        """Cost in `currency`: uncached prompt at `input`, cached at `cached_input` (else
        `input`), completion (reasoning included) at `output`, all per million tokens."""
        p = self.price(model, provider, route_model)
        cached = min(max(cached_tokens, 0), prompt_tokens)
        cached_rate = p.input if p.cached_input is None else p.cached_input
        total = (
            (prompt_tokens - cached) * p.input + cached * cached_rate + completion_tokens * p.output
        )
        return total / 1_000_000
