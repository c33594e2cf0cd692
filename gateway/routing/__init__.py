"""Routing: model aliases to routes, and per-request decisions for auto models.

`aliases`: the static table (public model -> ordered routes). The rest decide, per request, the
thinking mode and local vs upstream (`decide.Decider`, the router seam) from the client's switch,
the key's `policy`, and for auto models the `judge`: the `ask` of the last turn (the user's
instruction apart from pasted material and client wrappers), named `rules`, conversation
stickiness for turns that continue the work (`sticky`), and the learned `scorer` over the ask's
`features` (trained by `train`); then provider health (`breaker`) and load; `explain` writes
the `x-gateway-route` header.

May import `gateway.access.contract` (the contract), `gateway.pipeline.prompt_estimates`,
`gateway.config`, `gateway.errors`, `gateway.observability`, `providers` and `plumbing`."""

from gateway.routing.aliases import Route, Router

__all__ = ["Route", "Router"]
