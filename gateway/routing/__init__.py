"""Routing: model aliases to routes, and per-request decisions for auto models.

`aliases`: the static table (public model -> ordered routes). The rest decide, per request, the
thinking mode and local vs upstream (`decide.Decider`, the router seam) from the client's switch,
the key's `policy`, named `rules`, the `scorer` over cheap `signals`, conversation stickiness
(`sticky`) and provider health (`breaker`) and load; `explain` writes the `x-gateway-route`
header.
"""

from gateway.routing.aliases import Route, Router

__all__ = ["Route", "Router"]
