"""Route by route until one answers: each route's breaker checked first (on a provider of
several accounts, the conversation's own account first, then the others by their ranking), a
failure the next route can help with falls back, and when no route could be tried and some
were open those are tried anyway (panic mode). What the request path (`pipeline.py`) calls
between its decision and its first event."""

from __future__ import annotations

import math
from collections.abc import AsyncGenerator
from dataclasses import replace

import structlog
from aiohttp import web

from gateway.errors import RateLimited, ServiceUnavailable, provider_error_to_gateway
from gateway.observability import log_context
from gateway.observability.metrics import Metrics
from gateway.pipeline.event_tally import Tally, empty, prepend, without_reasoning
from gateway.routing import Route
from gateway.routing.breaker import (
    ALLOW,
    EXHAUSTED,
    OPEN,
    Breakers,
    Key,
    counts_as_failure,
    describe_error,
)
from gateway.routing.decide import Decision
from gateway.routing.explain import ROUTE, explain, note_placement, watch_placement
from gateway.routing.plan import RoutePlanner
from providers import errors as perr
from providers.types import ChatRequest, Event, Placed, ReasoningDelta, Sampling
from providers.upstream.affinity import conversation_key, rank

log = structlog.get_logger("gateway.pipeline.pipeline")


class RouteFallback:
    def __init__(self, planner: RoutePlanner, breakers: Breakers, metrics: Metrics) -> None:
        self.planner = planner
        self.breakers = breakers
        self.metrics = metrics

    async def open(
        self,
        request: web.Request,
        decision: Decision,
        chat: ChatRequest,
        sampling: Sampling,
        tally: Tally,
        label: str,
    ) -> AsyncGenerator[Event, None]:
        """Start the first route that answers (recorded in `tally`); fall back while nothing
        but keep-alives was sent to the client. A route whose breaker is open, or that the
        upstream asked to pause (429), is skipped at once; when no route could be tried and
        some were open, those are tried anyway (panic mode, `breaker.panic`; the first answer
        closes its breaker). `label` names the model in metrics."""
        failure: perr.ProviderError | None = None
        skipped: list[str] = []
        skipped_keys: list[Key] = []
        panicking: list[tuple[Route, Key]] = []
        breakers = self.breakers
        for route in decision.routes:
            tried: tuple[str, ...] = ()  # accounts of this route that failed this request
            while True:
                if route.provider_name in breakers.accounts:
                    verdict, key = self._gate(route, chat, tried)
                else:  # the common case: one account, one dict lookup
                    key = (route.provider_name, route.model, "")
                    verdict = breakers.check(key)
                if verdict == EXHAUSTED:
                    break
                if verdict != ALLOW:
                    if not tried:
                        skipped.append(route.provider_name)
                        skipped_keys.append(key)
                        if verdict == OPEN:
                            panicking.append((route, key))
                    break
                request[ROUTE] = explain(decision, route, skipped)
                attempt = await self._attempt(
                    request, decision, chat, sampling, tally, label, route, key
                )
                if not isinstance(attempt, perr.ProviderError):
                    return attempt
                failure = attempt
                if not key[2]:  # one account: on to the next route
                    break
                tried += (key[2],)
        if breakers.settings.panic and failure is None and panicking:
            # No route could be tried and some are open: try those anyway (panic mode).
            skipped.clear()
            for route, key in panicking:
                request[ROUTE] = explain(decision, route, skipped) + "; panic=1"
                attempt = await self._attempt(
                    request, decision, chat, sampling, tally, label, route, key
                )
                if not isinstance(attempt, perr.ProviderError):
                    return attempt
                failure = attempt
                skipped.append(route.provider_name)
        if failure is not None:
            raise provider_error_to_gateway(failure)
        request[ROUTE] = explain(decision, decision.routes[0], skipped)
        retry = max(1, math.ceil(breakers.wait_s(skipped_keys)))
        if not panicking:  # every route asked for a pause
            raise RateLimited(
                f"Every provider that serves the model '{chat.model}' asked the gateway to "
                f"slow down; retry in {retry} s.",
                retry_after=retry,
                code="upstream_rate_limited",
            )
        raise ServiceUnavailable(
            f"Every provider that serves the model '{chat.model}' is failing; retry in {retry} s.",
            code="providers_unavailable",
            headers={"Retry-After": str(retry)},
        )

    def _gate(self, route: Route, chat: ChatRequest, tried: tuple[str, ...]) -> tuple[int, Key]:
        """What the breakers say of `route`, on a provider of several accounts, and the key
        to send it with: the conversation's own account, else the next one (by its ranking)
        that may serve and was not `tried` by this request (EXHAUSTED when none is left)."""
        name = route.provider_name
        accounts = self.breakers.accounts[name]
        first: tuple[int, Key] | None = None
        for i in rank(accounts, conversation_key(chat)):
            if accounts[i] in tried:
                continue
            key = (name, route.model, accounts[i])
            verdict = self.breakers.check(key)
            if verdict == ALLOW:
                return verdict, key
            if first is None or (verdict == OPEN and first[0] != OPEN):
                first = (verdict, key)  # OPEN first: panic mode may still try it
        return first if first is not None else (EXHAUSTED, (name, route.model, ""))

    async def _attempt(
        self,
        request: web.Request,
        decision: Decision,
        chat: ChatRequest,
        sampling: Sampling,
        tally: Tally,
        label: str,
        route: Route,
        key: Key,
    ) -> AsyncGenerator[Event, None] | perr.ProviderError:
        """Send the request down `route` (its breaker key `key`, whose account it goes to):
        its events once the first arrived, or the failure to fall back from (a failure the
        next route cannot help with is raised)."""
        name = route.provider_name
        account = self.breakers.accounts[name].index(key[2]) if key[2] else None
        req = replace(
            chat,
            model=route.model,
            thinking=decision.thinking_for(route),
            sampling=sampling,
            account=account,
        )
        breakers = self.breakers
        events = route.provider.chat(req)
        try:
            first = await anext(events)
            while isinstance(first, Placed):  # before the answer: where it is being served
                watch_placement(request, first.placement)
                first = await anext(events)
        except StopAsyncIteration:
            breakers.success(key)
            self._opened(decision, route, tally, key)
            note_placement(request)
            return empty()
        except perr.ProviderError as exc:
            await events.aclose()
            watch_placement(request, None)
            exc.provider = exc.provider or name
            self.metrics.errors.labels(label, name, exc.code).inc()
            log.warning(
                "route_failed",
                provider=name,
                route_model=route.model,
                code=exc.code,
                error=exc.message,
                detail=exc.detail,
            )
            if not exc.retryable:
                breakers.success(key)  # it answered: the request was at fault
                raise provider_error_to_gateway(exc) from None
            if isinstance(exc, perr.UpstreamRateLimited):
                breakers.rate_limited(key, exc.retry_after, describe_error(exc))
            elif counts_as_failure(exc):
                breakers.failure(key, describe_error(exc))
            else:  # a full local engine queue: load, not health
                breakers.release(key)
            return exc
        except BaseException:
            await events.aclose()
            breakers.release(key)
            raise
        breakers.success(key)
        self._opened(decision, route, tally, key)
        note_placement(request)
        if decision.reason == "policy:off":
            events = without_reasoning(events)
            if isinstance(first, ReasoningDelta):
                return prepend(None, events, tally)
        tally.see(first)
        return prepend(first, events, tally)

    def _opened(self, decision: Decision, route: Route, tally: Tally, key: Key) -> None:
        tally.route = route
        tally.breaker_key = key
        self.planner.count(decision, route)
        log_context.bind(provider=route.provider_name, route_model=route.model)
