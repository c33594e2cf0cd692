"""The Live page: the local engines, each provider's breakers and recent errors, and the
cluster's nodes, from the same functions as /readyz (`gateway.server.readiness`,
`gateway.cluster.membership`); its fragment refreshes every few seconds without a reload."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from gateway.admin.console.web import page
from gateway.cluster.membership import cluster_detail
from gateway.resources import CLUSTER, ROUTER
from gateway.server.readiness import app_readiness

REFRESH_S = 3


@dataclass
class Rates:
    """The previous sample of each engine's generated-token counter, for tokens/s."""

    last: dict[str, tuple[float, int]] = field(default_factory=dict)

    def tokens_per_s(self, name: str, total: int, now: float) -> float | None:
        before = self.last.get(name)
        self.last[name] = (now, total)
        if before is None or now <= before[0]:
            return None
        return max(0.0, (total - before[1]) / (now - before[0]))


RATES = web.AppKey("console_engine_rates", Rates)


def routes() -> list[web.RouteDef]:
    return [web.get("/live", live), web.get("/live/state", live_state)]


def engine_row(name: str, stats: Any, rate: float | None) -> dict[str, Any]:
    used = stats.num_total_blocks - stats.num_free_blocks
    queried = stats.prefix_cache_query_tokens_total
    proposed = stats.spec_proposed_tokens_total
    return {
        "name": name,
        "running": stats.num_running,
        "waiting": stats.num_waiting,
        "blocks_used": used,
        "blocks_total": stats.num_total_blocks,
        "prefix_hit_rate": stats.prefix_cache_hit_tokens_total / queried if queried else None,
        "mtp_acceptance": stats.spec_accepted_tokens_total / proposed if proposed else None,
        "tokens_per_s": rate,
        "generated": stats.num_generated_tokens_total,
    }


async def _state(request: web.Request) -> dict[str, Any]:
    app = request.config_dict
    router = app[ROUTER]
    ready, body = await app_readiness(app)
    rates = request.app[RATES]
    now = time.monotonic()
    engines = []
    for name, provider in router.providers.items():
        stats_of = getattr(provider, "engine_stats", None)
        if stats_of is None:
            continue
        stats = stats_of()
        engines.append(
            engine_row(name, stats, rates.tokens_per_s(name, stats.num_generated_tokens_total, now))
        )
    cluster = app.get(CLUSTER)
    return {
        "ready": ready,
        "banner": banner(ready, body["checks"], body["loading"]),
        "checks": body["checks"],
        "loading": body["loading"],
        "failing_models": body["failing_models"],
        "serving_models": body["serving_models"],
        "providers": body["providers"],
        "engines": engines,
        "cluster": cluster_detail(cluster) if cluster is not None else None,
        "refresh_s": REFRESH_S,
    }


def banner(ready: bool, checks: dict[str, bool], loading: dict[str, str]) -> str:
    """The Live page's headline, from what readiness found: whether this process serves, and
    if not, what is still loading (and how far) or down. Which models have no working route is
    said beside it, from `failing_models` and `serving_models`."""
    if ready:
        return "Ready"
    parts = [f"{name} {what}" for name, what in loading.items()]
    parts += [f"{name} down" for name, ok in checks.items() if not ok and name not in loading]
    return "Not ready: " + ", ".join(parts) if parts else "Not ready"


async def live(request: web.Request) -> web.Response:
    return page(request, "live.jinja", title="Live", **await _state(request))


async def live_state(request: web.Request) -> web.Response:
    return page(request, "live_state.jinja", **await _state(request))
