"""Local or upstream, per request of an auto model: the local engine leads while it serves well.

When the first of the routes a key may use is the local engine and an upstream route follows,
first that applies (`choice`, and the note `x-gateway-route` carries):
  context  overflow=context  the prompt does not fit the engine's context
  local    (no note)         requests that would wait for the engine, this one included, are at
                             most `local_max_queue`
  prefix   kept=prefix       more wait, but the engine caches at least
                             `prefix.wait_cost_tokens` x (queue - local_max_queue) of the
                             prompt's leading tokens (an upstream would recompute all of them),
                             and the queue is at most `prefix.max_queue`
  queue    overflow=queue    otherwise
On an overflow the upstream routes go first and the local one after them; "none" is no choice
(another first route, or no upstream the key may use: a local-only key waits for the engine).
`cached=<tokens>` says how much of the prompt the engine that would serve it holds: this
process's, or the cluster peer its placer would forward to (the placer's own scoring, so the
two agree). The lookup is dict membership tests over the block hashes computed when the prompt
was prepared: no hashing and no I/O here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal, Protocol, runtime_checkable

from gateway.config.routing import RoutingSettings
from gateway.routing.aliases import Route
from plumbing.record import record
from providers.types import EngineFit, PreparedPrompt, ProviderLoad

LoadChoice = Literal["none", "local", "prefix", "queue", "context"]
_NOTES = {"prefix": "kept=prefix", "queue": "overflow=queue", "context": "overflow=context"}


@runtime_checkable
class LocalEngine(Protocol):
    """What a local-engine provider tells the router (providers/local/provider.py)."""

    def load(self) -> ProviderLoad | None:
        """None: not ready (a serving worker whose engine in worker 0 has not answered)."""
        ...

    def fit(self, prompt: PreparedPrompt) -> EngineFit: ...


@record
class Order:
    routes: tuple[Route, ...]  # in the order to try
    choice: LoadChoice = "none"
    cached_tokens: int | None = None  # None: not looked up

    def notes(self) -> tuple[str, ...]:
        cached = () if self.cached_tokens is None else (f"cached={self.cached_tokens}",)
        note = _NOTES.get(self.choice)
        return (*cached, note) if note else cached


class LocalFirst:
    def __init__(
        self, settings: RoutingSettings, local: frozenset[str], providers: Mapping[str, object]
    ) -> None:
        """`local`: the names of local-engine providers (the others are upstreams)."""
        self._local = local
        self._engines = {
            n: p for n, p in providers.items() if n in local and isinstance(p, LocalEngine)
        }
        self._max_queue = settings.local_max_queue
        self._prefix = settings.prefix

    def order(
        self, routes: tuple[Route, ...], prompt_tokens: int, prepared: PreparedPrompt | None
    ) -> Order:
        name = routes[0].provider.name
        engine = self._engines.get(name)
        local = self._local
        if engine is None or all(r.provider.name in local for r in routes):
            return Order(routes)
        load = engine.load()
        if load is None:
            return Order(routes)
        if prompt_tokens >= load.max_context:
            return Order(self._overflow(routes), "context")
        queue = load.queue_after()
        if prepared is None or prepared.owner != name:
            if queue <= self._max_queue:
                return Order(routes, "local")
            return Order(self._overflow(routes), "queue")
        fit = engine.fit(prepared)
        queue = fit.queue_after(queue)
        cached = fit.cached_tokens
        if queue <= self._max_queue:
            return Order(routes, "local", cached)
        excess = queue - self._max_queue
        if queue <= self._prefix.max_queue and cached >= self._prefix.wait_cost_tokens * excess:
            return Order(routes, "prefix", cached)
        return Order(self._overflow(routes), "queue", cached)

    def _overflow(self, routes: tuple[Route, ...]) -> tuple[Route, ...]:
        """The upstream routes first, the local ones after them (each in its order)."""
        local = self._local
        upstream = [r for r in routes if r.provider.name not in local]
        return (*upstream, *(r for r in routes if r.provider.name in local))
