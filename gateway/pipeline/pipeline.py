"""The request path after parsing: route -> admit -> provider (with fallback) -> encode -> settle.

One `Pipeline` per app. `serve` answers one chat or completions request, streaming frame by
frame or as one JSON body. An answer that reaches its end (a stream's last frame, the error event
of a stream that broke off, a JSON body) is settled before those last bytes are written, and the
write waits until Redis, or the spool on disk, holds the settlement: whatever a client received in
full is billed, even if the process dies the instant after. Every other ending (an error status,
a client that left) is settled from a `finally`, beside the next request (its Redis call is sent
at once, with no task of its own); `drain` waits for those (the app does on shutdown, so nothing
is lost). A stream is kept alive while it has nothing to say (gateway/server/sse_stream.py);
routes fall back for as long as no token was sent.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import replace
from functools import partial

import structlog
from aiohttp import web

from gateway.access.contract import AccessControl, Grant, Outcome, Principal, Ticket
from gateway.config.routing import BreakerSettings, RoutingSettings
from gateway.errors import GatewayError, QuotaExceeded, RateLimited, provider_error_to_gateway
from gateway.observability import log_context
from gateway.observability.metrics import Metrics
from gateway.pipeline.event_tally import Tally
from gateway.pipeline.fallback import RouteFallback
from gateway.pipeline.output_limits import OutputLimits
from gateway.pipeline.prompt_estimates import prompt_tokens
from gateway.routing import Router
from gateway.routing.breaker import (
    Breakers,
    counts_as_failure,
    describe_error,
)
from gateway.routing.decide import Decider, Decision
from gateway.routing.explain import ROUTE
from gateway.routing.plan import RoutePlanner
from gateway.server.middleware import REQUEST_ID
from gateway.server.sse_stream import EventStreamResponse, KeepAlive, KeptAliveStream
from gateway.wire.base import Wire
from plumbing import jsoncodec
from providers import errors as perr
from providers.types import ChatRequest, Event, Sampling, Usage

log = structlog.get_logger("gateway.pipeline.pipeline")


class Pipeline:
    def __init__(
        self,
        router: Router,
        access: AccessControl,
        metrics: Metrics,
        limits: OutputLimits,
        keepalive: KeepAlive | None = None,
        *,
        planner: RoutePlanner | None = None,
        breakers: Breakers | None = None,
    ) -> None:
        """`planner` and `breakers` default to static routing (default settings, no
        stickiness) and no breakers."""
        self.router = router
        self.planner = planner or RoutePlanner(
            router, Decider(RoutingSettings(), frozenset(), {}, None), metrics
        )
        self.breakers = breakers or Breakers(BreakerSettings())
        self.fallback = RouteFallback(self.planner, self.breakers, metrics)
        self.access = access
        self.metrics = metrics
        self.limits = limits
        self.keepalive = keepalive or KeepAlive()
        self._settling: set[asyncio.Task[None]] = set()

    async def drain(self) -> None:
        """Wait until every finished request has been settled (shutdown; tests)."""
        while self._settling:
            await asyncio.gather(*self._settling, return_exceptions=True)

    async def serve(
        self, request: web.Request, principal: Principal, chat: ChatRequest, wire: Wire
    ) -> web.StreamResponse:
        try:
            public_model, chat, decision = await self.planner.plan(
                principal, chat, wire.endpoint.split(".")[0]
            )
        except perr.ProviderError as exc:  # the prompt could not be prepared
            raise provider_error_to_gateway(exc) from None
        log_context.bind(key_id=principal.key_id, model=public_model)
        num_prompt = prompt_tokens(chat)
        output = self.limits.plan(
            public_model, decision.routes, num_prompt, chat.sampling.max_tokens
        )
        ticket = Ticket(
            principal=principal,
            model=public_model,
            request_id=chat.request_id,
            prompt_tokens=num_prompt,
            max_tokens=output.reserve,
            label=self.router.label(public_model),
            routes=tuple((route.provider_name, route.model) for route in decision.routes),
        )
        admitting = time.perf_counter()
        try:
            grant = await self._admit(ticket, wire)
        except (QuotaExceeded, RateLimited) as refusal:  # recorded in usage, not charged
            self._refused(ticket, decision, request, admitting, refusal)
            raise
        sampling = chat.sampling
        max_tokens = output.upstream(grant.max_tokens)
        reasoning = _smaller(sampling.max_reasoning_tokens, principal.policy.max_reasoning_tokens)
        if (max_tokens, reasoning) != (sampling.max_tokens, sampling.max_reasoning_tokens):
            sampling = replace(sampling, max_tokens=max_tokens, max_reasoning_tokens=reasoning)
        started = time.perf_counter()
        tally = Tally()
        status, error_code = 200, None
        settle = partial(self._settle_first, grant, tally, decision, request, started, wire)
        self.metrics.in_flight.inc()
        try:
            if chat.stream:
                return await self._stream(
                    request, wire, grant, decision, chat, sampling, tally, settle
                )
            events = await self.fallback.open(
                request, decision, chat, sampling, tally, ticket.counted_model
            )
            return await self._json(request, wire, grant, public_model, events, tally, settle)
        except GatewayError as exc:
            status, error_code = exc.status, exc.code
            raise
        except (asyncio.CancelledError, ConnectionResetError):
            status, error_code = 499, "client_disconnected"
            raise
        except Exception:
            status, error_code = 500, "internal_error"  # recorded as the 500 the client gets
            raise
        finally:
            self.metrics.in_flight.dec()
            if tally.breaker_key is not None and tally.failed:
                self.breakers.failure(tally.breaker_key, tally.failed_with)
            if not tally.settled:
                outcome = self._outcome(
                    ticket, tally, decision, request.get(ROUTE, ""), started, status, error_code
                )
                # An error answer follows (or the client left): the client does not wait for
                # the bookkeeping, a cancelled handler cannot lose it, and `drain` awaits it.
                self._track(self._settle(grant, outcome, wire), ticket.request_id)

    def _settle_first(
        self,
        grant: Grant,
        tally: Tally,
        decision: Decision,
        request: web.Request,
        started: float,
        wire: Wire,
    ) -> asyncio.Future[None] | None:
        """Settle an answer whose last bytes are about to go out (status 200; a stream that broke
        off with its failure's code). Returns what to await before writing them: done once
        Redis or the spool holds the settlement, or failed to (logged by `_settled`: the answer
        goes out all the same); None when there is nothing to wait for. A client that leaves
        meanwhile cancels only that wait, never the settlement."""
        tally.settled = True
        outcome = self._outcome(
            grant.ticket, tally, decision, request.get(ROUTE, ""), started, 200, None
        )
        landing = self._track(self._settle(grant, outcome, wire), grant.ticket.request_id)
        if landing is None or landing.done():
            return None
        landed: asyncio.Future[None] = landing.get_loop().create_future()
        landing.add_done_callback(partial(_wake, landed))
        return landed

    def _track(
        self, settlement: Awaitable[None] | None, request_id: str
    ) -> asyncio.Future[None] | None:
        """Follow a settlement under way until it lands (`drain` waits for it); its future."""
        if settlement is None:
            return None
        landing = asyncio.ensure_future(settlement)
        if landing.done():  # nothing to wait for (auth off)
            self._settled(request_id, landing)
            return landing
        self._settling.add(landing)
        landing.add_done_callback(partial(self._settled, request_id))
        return landing

    def _settled(self, request_id: str, landing: asyncio.Future[None]) -> None:
        self._settling.discard(landing)
        if not landing.cancelled() and (exc := landing.exception()) is not None:
            log.error("settle_failed", request_id=request_id, exc_info=exc)

    async def _admit(self, ticket: Ticket, wire: Wire) -> Grant:
        """Admission that a vanishing client cannot leak: if the caller is cancelled while the
        reservation is in flight, the reservation is released as soon as it lands."""
        admission = asyncio.ensure_future(self.access.admit(ticket))
        try:
            return await asyncio.shield(admission)
        except asyncio.CancelledError:
            admission.add_done_callback(lambda done: self._release(done, wire))
            raise

    def _refused(
        self,
        ticket: Ticket,
        decision: Decision,
        request: web.Request,
        started: float,
        refusal: GatewayError,
    ) -> None:
        outcome = Outcome(
            usage=Usage(),
            status=refusal.status,
            thinking=decision.thinking,
            latency_ms=(time.perf_counter() - started) * 1000,
            error_code=refusal.code,
            route_reason=decision.reason,
            route=request.get(ROUTE, ""),
        )
        self._track(self.access.refused(ticket, outcome), ticket.request_id)

    def _release(self, admission: asyncio.Future[Grant], wire: Wire) -> None:
        if admission.cancelled() or admission.exception() is not None:
            return
        gone = Outcome(usage=Usage(), status=499, error_code="client_disconnected")
        grant = admission.result()
        self._track(self._settle(grant, gone, wire), grant.ticket.request_id)

    async def _stream(
        self,
        request: web.Request,
        wire: Wire,
        grant: Grant,
        decision: Decision,
        chat: ChatRequest,
        sampling: Sampling,
        tally: Tally,
        settle: Callable[[], asyncio.Future[None] | None],
    ) -> web.StreamResponse:
        resp = EventStreamResponse(
            headers={
                **grant.headers,
                "Content-Type": "text/event-stream; charset=utf-8",
                "Cache-Control": "no-cache",
                "X-Accel-Buffering": "no",
            }
        )
        encoder = wire.stream_encoder(
            wire.id_prefix + request[REQUEST_ID], chat.model, grant.ticket.prompt_tokens
        )
        stream = KeptAliveStream(request, resp, encoder, self.keepalive)
        events: AsyncGenerator[Event, None] | None = None
        try:
            events = await self.fallback.open(
                request, decision, chat, sampling, tally, grant.ticket.counted_model
            )
            await stream.open()
            async for event in events:
                frame = encoder.encode(event)
                if frame is not None and (busy := stream.send(frame)) is not None:
                    await busy
            last = b"".join(encoder.close())
            if (landing := settle()) is not None:  # billed before the client has it all
                await landing
            await stream.finish(last)
        except Exception as exc:
            # Every route failed, the answer broke off, or a bug: once the headers are out, the
            # error can only be reported in the stream, in the protocol's own way (a second
            # response would land inside this one's body), and it is recorded with the error
            # code that event carries, beside the 200 the headers said.
            if isinstance(exc, ConnectionResetError):  # the client left
                raise
            if not stream.committed:
                if isinstance(exc, perr.ProviderError):
                    raise provider_error_to_gateway(exc) from None
                raise
            if tally.settled:  # the last frame's write failed: nothing more can be sent
                raise
            err = _stream_error(exc)
            detail = exc.detail if isinstance(exc, perr.ProviderError) else ""
            log.warning("stream_failed", code=err.code, error=err.message, detail=detail)
            route = tally.route
            provider = route.provider_name if route is not None else ""
            self.metrics.errors.labels(grant.ticket.counted_model, provider, err.code or "").inc()
            await stream.open()
            tally.finish, tally.failure = None, err
            if isinstance(exc, perr.ProviderError) and counts_as_failure(exc):
                tally.failed, tally.failed_with = True, describe_error(exc)
            if (landing := settle()) is not None:
                await landing
            await stream.finish(encoder.fail(err))
        finally:
            await stream.close()
            if events is not None:
                await events.aclose()
        return resp

    async def _json(
        self,
        request: web.Request,
        wire: Wire,
        grant: Grant,
        model: str,
        events: AsyncGenerator[Event, None],
        tally: Tally,
        settle: Callable[[], asyncio.Future[None] | None],
    ) -> web.Response:
        agg = wire.aggregator()
        try:
            async for event in events:
                agg.add(event)
        except perr.ProviderError as exc:
            if counts_as_failure(exc):
                tally.failed, tally.failed_with = True, describe_error(exc)
            raise provider_error_to_gateway(exc) from None
        finally:
            await events.aclose()
        completion_id = wire.id_prefix + grant.ticket.request_id
        body = jsoncodec.dumps(agg.body(completion_id, model))
        resp = web.Response(body=body, content_type="application/json", headers=grant.headers)
        if (landing := settle()) is not None:  # billed before the client can have it
            await landing
        # Written here, not after the handler returns: nothing is left to do after it.
        await resp.prepare(request)
        await resp.write_eof()
        return resp

    def _outcome(
        self,
        ticket: Ticket,
        tally: Tally,
        decision: Decision,
        route_header: str,
        started: float,
        status: int,
        error_code: str | None,
    ) -> Outcome:
        usage = tally.usage or Usage(
            prompt_tokens=ticket.prompt_tokens, completion_tokens=tally.deltas
        )
        ttft = (tally.first_at - started) * 1000 if tally.first_at is not None else None
        if tally.failure is not None and status == 200:
            # The stream broke off after its 200: recorded with the 200 the client got and the
            # error code its last event carried (it counts as an error wherever errors count).
            error_code = tally.failure.code
        route = tally.route
        return Outcome(
            usage=usage,
            status=status,
            provider=route.provider_name if route else "",
            route_model=route.model if route else "",
            thinking=decision.thinking_for(route) if route else decision.thinking,
            latency_ms=(time.perf_counter() - started) * 1000,
            ttft_ms=ttft,
            error_code=error_code,
            route_reason=decision.reason_for(route) if route else decision.reason,
            route=route_header,
        )

    def _settle(self, grant: Grant, outcome: Outcome, wire: Wire) -> Awaitable[None] | None:
        """Count the request and start its settlement (None if it could not be started)."""
        series = self.metrics.series(
            wire.endpoint, grant.ticket.counted_model, outcome.provider, str(outcome.status)
        )
        series.requests.inc()
        series.latency.observe(outcome.latency_ms / 1000)
        if outcome.ttft_ms is not None:
            series.ttft.observe(outcome.ttft_ms / 1000)
        u = outcome.usage
        for counter, tokens in (
            (series.prompt_tokens, u.prompt_tokens),
            (series.completion_tokens, u.completion_tokens),
            (series.cached_tokens, u.cached_prompt_tokens),
        ):
            if tokens:  # each increment takes the metric's lock
                counter.inc(tokens)
        try:
            return self.access.settle(grant, outcome)
        except Exception:
            log.exception("settle_failed", request_id=grant.ticket.request_id)
            return None


def _wake(landed: asyncio.Future[None], landing: asyncio.Future[None]) -> None:
    if not landed.done():  # (cancelled: the client left while it was waited for)
        landed.set_result(None)


def _stream_error(exc: Exception) -> GatewayError:
    """What ended a stream after its headers, as the client is told it."""
    if isinstance(exc, GatewayError):
        return exc
    if isinstance(exc, perr.ProviderError):
        return provider_error_to_gateway(exc)
    log.error("stream_broke", exc_info=exc)
    return GatewayError("Internal server error.", code="internal_error")


def _smaller(a: int | None, b: int | None) -> int | None:
    """The tighter of two optional budgets (None: no budget)."""
    return b if a is None else a if b is None else min(a, b)
