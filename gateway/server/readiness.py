"""Readiness: whether this process can serve, from what it already knows (no upstream call).

Ready (200) when: Redis answers a PING (within `timeout_s`), every local engine provider is
loaded and running (an in-process check), and the process is not draining (a SIGTERM was
received). Otherwise 503. Upstream and model health never decide it by default: a provider
that fails fails on every replica alike, and a readiness that followed it would take every
replica, the local engine and the healthy providers out of the load balancer with it. A model
gates readiness only where its settings say so (`gates_readiness`): then it is ready only while
that model has a route that is not failing. Third-party providers are never called: their
health comes from the breakers and the outcomes of recent requests.

Body: `status` ("ready" | "not_ready"), `checks` (`redis`, `engine:<name>` per local engine,
`accepting`: not draining, and `models` where a model gates readiness: every such model has a
route that is not failing), `loading` (per local engine still loading, `engine:<name>`: what it
is doing and how far, e.g. "training demo 45%"), `failing_models` (configured models whose
every route is failing: an open breaker, or a local engine that is not running; the others
serve), `serving_models` (the rest), `engines_down` (per local engine that stopped on an error
or failed to load: its `reason` and, for the parallel engine, `ranks`: rank -> "exited with
code -9" or "stopped responding"; empty while every engine runs), and `providers`: per provider
`last_success_age_s`, `last_error` and `last_error_age_s` (null when none seen), `breakers`
(per upstream model, and account where it has several: `state`, `probe_in_s`, `times_opened`,
`consecutive_failures`, `last_error`) and `rate_limited` (per upstream model, and account:
seconds of back-off left).
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Mapping
from typing import Any, Protocol, runtime_checkable

from aiohttp import ChainMapProxy, web
from redis.asyncio import Redis

from gateway.observability.metrics import Metrics
from gateway.resources import BREAKERS, DRAINING, REDIS, ROUTER, SETTINGS
from gateway.routing import Router
from gateway.routing.breaker import Breakers, Key
from providers.base import Provider

STATE_LEVELS = {"closed": 0, "half_open": 1, "open": 2}


async def redis_ok(redis: Redis, timeout_s: float) -> bool:
    try:
        return bool(await asyncio.wait_for(redis.ping(), timeout=timeout_s))
    except Exception:  # any failure to answer means not ready
        return False


def failing_models(router: Router, breakers: Breakers, engines: Mapping[str, bool]) -> list[str]:
    """Configured models whose every route is known to be failing (an open breaker, or a
    local engine that is not running)."""
    failing = []
    for card in router.cards():
        routes = router.resolve(card.id)
        if all(
            not engines.get(r.provider_name, True) or breakers.is_failing(r.provider_name, r.model)
            for r in routes
        ):
            failing.append(card.id)
    return failing


@runtime_checkable
class DiagnosedEngine(Protocol):
    def engine_failure(self) -> dict[str, Any] | None: ...


@runtime_checkable
class LoadingEngine(Protocol):
    def loading(self) -> str | None:
        """What the engine's load is doing ("training demo 45%"); None once it serves."""
        ...


def engines_loading(providers: Mapping[str, Provider], local: Collection[str]) -> dict[str, str]:
    """`engine:<name>` -> what each local engine still loading is doing."""
    found: dict[str, str] = {}
    for name in local:
        provider = providers.get(name)
        state = provider.loading() if isinstance(provider, LoadingEngine) else None
        if state is not None:
            found[f"engine:{name}"] = state
    return found


def engines_down(
    providers: Mapping[str, Provider], local: Collection[str]
) -> dict[str, dict[str, Any]]:
    """Each local engine that stopped on an error: why, and the ranks at fault."""
    down: dict[str, dict[str, Any]] = {}
    for name in local:
        provider = providers.get(name)
        failure = provider.engine_failure() if isinstance(provider, DiagnosedEngine) else None
        if failure is not None:
            down[name] = failure
    return down


async def engines_ok(providers: Mapping[str, Provider], local: Collection[str]) -> dict[str, bool]:
    """Each local engine provider: loaded and taking requests (in-process, no network)."""
    found: dict[str, bool] = {}
    for name in local:
        provider = providers.get(name)
        try:
            found[name] = provider is not None and await provider.health()
        except Exception:  # an engine that cannot say is not ready
            found[name] = False
    return found


def _label(key: Key, accounts: bool) -> str:
    """A breaker's name within its provider: the model, and `@account` where there are several."""
    return f"{key[1]}@{key[2]}" if accounts and key[2] else key[1]


def provider_health(breakers: Breakers, names: Collection[str]) -> dict[str, dict[str, Any]]:
    """Per provider: breakers, back-offs, last success and last error (see the module)."""
    out: dict[str, dict[str, Any]] = {}
    for name in names:
        age = breakers.last_success_age_s(name)
        error = breakers.last_error(name)
        out[name] = {
            "last_success_age_s": None if age is None else round(age, 3),
            "last_error": None if error is None else error[1],
            "last_error_age_s": None if error is None else round(error[0], 3),
            "breakers": {},
            "rate_limited": {},
        }
    for key, breaker in breakers.items():
        entry = out.get(key[0])
        if entry is not None:
            entry["breakers"][_label(key, key[0] in breakers.accounts)] = {
                "state": breaker.state,
                "probe_in_s": round(breaker.probe_in_s(), 3),
                "times_opened": breaker.times_opened,
                "consecutive_failures": breaker.consecutive,
                "last_error": breaker.last_error,
            }
    for key, left in breakers.backoffs().items():
        entry = out.get(key[0])
        if entry is not None:
            entry["rate_limited"][_label(key, key[0] in breakers.accounts)] = round(left, 3)
    return out


async def readiness(
    redis: Redis,
    router: Router,
    breakers: Breakers,
    local: Collection[str],
    timeout_s: float = 2.0,
    *,
    gating: Collection[str] = (),
    draining: bool = False,
) -> tuple[bool, dict[str, Any]]:
    """(ready, the body of /readyz). `gating`: the models that gate readiness
    (`gates_readiness`); `draining`: the process is stopping."""
    checks: dict[str, bool] = {"redis": await redis_ok(redis, timeout_s)}
    engines = await engines_ok(router.providers, local)
    for name, ok in engines.items():
        checks[f"engine:{name}"] = ok
    checks["accepting"] = not draining
    failing = failing_models(router, breakers, engines)
    gated = [m for m in gating if m in failing]
    if gating:
        checks["models"] = not gated
    ready = all(checks.values())
    return ready, {
        "status": "ready" if ready else "not_ready",
        "checks": checks,
        "loading": engines_loading(router.providers, local),
        "failing_models": failing,
        "serving_models": [c.id for c in router.cards() if c.id not in failing],
        "engines_down": engines_down(router.providers, local),
        "providers": provider_health(breakers, router.providers),
    }


async def app_readiness(app: web.Application | ChainMapProxy) -> tuple[bool, dict[str, Any]]:
    """`readiness` of the serving app (or a sub-app's `config_dict`), from its resources and
    settings."""
    settings = app[SETTINGS]
    local = [n for n, p in settings.live_providers()[0].items() if p.kind == "local"]
    gating = [m for m, model in settings.models.items() if model.gates_readiness]
    draining = app[DRAINING].is_set()
    return await readiness(
        app[REDIS], app[ROUTER], app[BREAKERS], local, gating=gating, draining=draining
    )


def export(
    metrics: Metrics,
    breakers: Breakers,
    providers: Collection[str],
    ready: bool,
    state: Mapping[str, Any] | None = None,
) -> None:
    """Set the breaker and provider-health gauges from `breakers`, and from `state` (the body
    of /readyz) the ranks at fault of the engines that are down, which engines are loading
    and which models serve, at scrape time."""
    for gauge in (
        metrics.breaker_state,
        metrics.breaker_opened,
        metrics.provider_last_success_age,
        metrics.engine_rank_down,
        metrics.model_available,
        metrics.engine_loading,
    ):
        gauge.clear()
    state = state or {}
    down: Mapping[str, Mapping[str, Any]] = state.get("engines_down", {})
    for model in state.get("serving_models", ()):
        metrics.model_available.labels(model).set(1)
    for model in state.get("failing_models", ()):
        metrics.model_available.labels(model).set(0)
    for check in state.get("checks", {}):
        if check.startswith("engine:"):
            loading = check in state.get("loading", {})
            metrics.engine_loading.labels(check.partition(":")[2]).set(1 if loading else 0)
    for name, failure in down.items():
        for rank in failure.get("ranks", {}):
            metrics.engine_rank_down.labels(name, rank).set(1)
    open_count = dict.fromkeys(providers, 0)
    limited = dict.fromkeys(providers, 0)
    for key, breaker in breakers.items():
        metrics.breaker_state.labels(*key).set(STATE_LEVELS[breaker.state])
        metrics.breaker_opened.labels(*key).set(breaker.times_opened)
        if breaker.state != "closed" and key[0] in open_count:
            open_count[key[0]] += 1
    for key in breakers.backoffs():
        if key[0] in limited:
            limited[key[0]] += 1
    for name in providers:
        metrics.provider_open_breakers.labels(name).set(open_count[name])
        metrics.provider_rate_limited.labels(name).set(limited[name])
        age = breakers.last_success_age_s(name)
        if age is not None:
            metrics.provider_last_success_age.labels(name).set(age)
    metrics.ready.labels().set(1 if ready else 0)
