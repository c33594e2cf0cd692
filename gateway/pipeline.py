"""The request path after parsing: route -> admit -> provider (with fallback) -> encode -> settle.

One `Pipeline` per app. `serve` answers one chat or completions request, streaming frame by
frame or as one JSON body, and settles usage from a `finally` whatever happened (success, provider
error, client disconnect). Settlement runs beside the response rather than before it; `drain`
waits for it (the app does on shutdown, so nothing is lost). A stream is kept alive while it has
nothing to say (gateway/keepalive.py); routes fall back for as long as no token was sent.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Coroutine
from dataclasses import dataclass, replace
from typing import Any

import structlog
from aiohttp import web

from gateway.access import AccessControl, Grant, Outcome, Principal, Ticket, require_model
from gateway.errors import GatewayError, provider_error_to_gateway
from gateway.keepalive import KeepAlive, KeptAliveStream
from gateway.metrics import Metrics
from gateway.middleware import REQUEST_ID
from gateway.output_limits import OutputLimits
from gateway.routing import Route, Router
from gateway.tokens import count_prompt_tokens
from gateway.wire.base import Wire
from providers import errors as perr
from providers import jsoncodec
from providers.types import (
    ChatRequest,
    Event,
    Finish,
    FinishReason,
    ReasoningDelta,
    Sampling,
    TextDelta,
    ToolCallDelta,
    Usage,
)

log = structlog.get_logger("gateway.pipeline")


@dataclass(slots=True)
class _Tally:
    """What the client has been sent so far, for settlement when no Usage arrives, and the
    route that answered (None until one did)."""

    route: Route | None = None
    deltas: int = 0
    first_at: float | None = None
    usage: Usage | None = None
    finish: FinishReason | None = None
    failure: GatewayError | None = None  # what ended a stream after its headers were sent

    def see(self, event: Event) -> None:
        if isinstance(event, TextDelta | ReasoningDelta | ToolCallDelta):
            self.deltas += 1
            if self.first_at is None:
                self.first_at = time.perf_counter()
        elif isinstance(event, Usage):
            self.usage = event
        elif isinstance(event, Finish):
            self.finish = event.reason


class Pipeline:
    def __init__(
        self,
        router: Router,
        access: AccessControl,
        metrics: Metrics,
        limits: OutputLimits,
        keepalive: KeepAlive | None = None,
    ) -> None:
        self.router = router
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
        public_model = chat.model
        routes = self.router.resolve(public_model)
        require_model(principal, public_model)
        structlog.contextvars.bind_contextvars(key_id=principal.key_id, model=public_model)
        prompt_tokens = count_prompt_tokens(routes[0].provider, chat)
        output = self.limits.plan(public_model, routes, prompt_tokens, chat.sampling.max_tokens)
        ticket = Ticket(
            principal=principal,
            model=public_model,
            request_id=chat.request_id,
            prompt_tokens=prompt_tokens,
            max_tokens=output.reserve,
            label=self.router.label(public_model),
        )
        grant = await self._admit(ticket, wire)
        sampling = replace(chat.sampling, max_tokens=output.upstream(grant.max_tokens))
        started = time.perf_counter()
        tally = _Tally()
        status, error_code = 200, None
        self.metrics.in_flight.inc()
        try:
            if chat.stream:
                return await self._stream(request, wire, grant, routes, chat, sampling, tally)
            events = await self._open(routes, chat, sampling, tally, ticket.counted_model)
            return await self._json(wire, grant, public_model, events, tally)
        except GatewayError as exc:
            status, error_code = exc.status, exc.code
            raise
        except (asyncio.CancelledError, ConnectionResetError):
            status, error_code = 499, "client_disconnected"
            raise
        finally:
            self.metrics.in_flight.dec()
            outcome = self._outcome(ticket, tally, chat, started, status, error_code)
            # Settled in a task of its own: the client's answer does not wait for the
            # bookkeeping, a cancelled handler cannot lose it, and `drain` awaits it on shutdown.
            self._track(self._settle(grant, outcome, wire))

    def _track(self, settlement: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(settlement)
        self._settling.add(task)
        task.add_done_callback(self._settling.discard)

    async def _admit(self, ticket: Ticket, wire: Wire) -> Grant:
        """Admission that a vanishing client cannot leak: if the caller is cancelled while the
        reservation is in flight, the reservation is released as soon as it lands."""
        admission = asyncio.ensure_future(self.access.admit(ticket))
        try:
            return await asyncio.shield(admission)
        except asyncio.CancelledError:
            admission.add_done_callback(lambda done: self._release(done, wire))
            raise

    def _release(self, admission: asyncio.Future[Grant], wire: Wire) -> None:
        if admission.cancelled() or admission.exception() is not None:
            return
        gone = Outcome(usage=Usage(), status=499, error_code="client_disconnected")
        self._track(self._settle(admission.result(), gone, wire))

    async def _open(
        self,
        routes: tuple[Route, ...],
        chat: ChatRequest,
        sampling: Sampling,
        tally: _Tally,
        label: str,
    ) -> AsyncGenerator[Event, None]:
        """Start the first route that answers (recorded in `tally`); fall back while nothing
        but keep-alives was sent to the client. `label` names the model in metrics."""
        failure: perr.ProviderError | None = None
        for route in routes:
            req = replace(
                chat,
                model=route.model,
                thinking=route.thinking_for(chat.thinking),
                sampling=sampling,
            )
            events = route.provider.chat(req)
            try:
                first = await anext(events)
            except StopAsyncIteration:
                self._opened(route, tally)
                return _empty()
            except perr.ProviderError as exc:
                await events.aclose()
                exc.provider = exc.provider or route.provider_name
                self.metrics.errors.labels(label, route.provider_name, exc.code).inc()
                log.warning(
                    "route_failed",
                    provider=route.provider_name,
                    code=exc.code,
                    error=exc.message,
                    detail=exc.detail,
                )
                if not exc.retryable:
                    raise provider_error_to_gateway(exc) from None
                failure = exc
                continue
            except BaseException:
                await events.aclose()
                raise
            self._opened(route, tally)
            tally.see(first)
            return _prepend(first, events, tally)
        assert failure is not None
        raise provider_error_to_gateway(failure)

    @staticmethod
    def _opened(route: Route, tally: _Tally) -> None:
        tally.route = route
        structlog.contextvars.bind_contextvars(
            provider=route.provider_name, route_model=route.model
        )

    async def _stream(
        self,
        request: web.Request,
        wire: Wire,
        grant: Grant,
        routes: tuple[Route, ...],
        chat: ChatRequest,
        sampling: Sampling,
        tally: _Tally,
    ) -> web.StreamResponse:
        resp = web.StreamResponse(
            headers={
                **grant.headers,
                "Content-Type": "text/event-stream; charset=utf-8",
                "Cache-Control": "no-cache",
                "X-Accel-Buffering": "no",
            }
        )
        encoder = wire.stream_encoder(wire.id_prefix + request[REQUEST_ID], chat.model)
        stream = KeptAliveStream(request, resp, encoder, self.keepalive)
        events: AsyncGenerator[Event, None] | None = None
        try:
            events = await self._open(routes, chat, sampling, tally, grant.ticket.counted_model)
            await stream.open()
            async for event in events:
                frame = encoder.encode(event)
                if frame is not None:
                    await stream.write(frame)
            await stream.write(b"".join(encoder.close()))
        except (perr.ProviderError, GatewayError) as exc:
            # Every route failed, or the answer broke off: once the headers are out, the error
            # can only be reported in the stream, in the protocol's own way, and it is recorded
            # as what it was, not as the 200 the headers said.
            err = exc if isinstance(exc, GatewayError) else provider_error_to_gateway(exc)
            if not stream.committed:
                raise err from None
            detail = exc.detail if isinstance(exc, perr.ProviderError) else ""
            log.warning("stream_failed", code=err.code, error=err.message, detail=detail)
            await stream.open()
            await stream.write(encoder.fail(err))
            tally.finish, tally.failure = None, err
        finally:
            await stream.close()
            if events is not None:
                await events.aclose()
        return resp

    async def _json(
        self,
        wire: Wire,
        grant: Grant,
        model: str,
        events: AsyncGenerator[Event, None],
        tally: _Tally,
    ) -> web.Response:
        agg = wire.aggregator()
        try:
            async for event in events:
                agg.add(event)
        except perr.ProviderError as exc:
            raise provider_error_to_gateway(exc) from None
        finally:
            await events.aclose()
        completion_id = wire.id_prefix + grant.ticket.request_id
        body = jsoncodec.dumps(agg.body(completion_id, model))
        return web.Response(body=body, content_type="application/json", headers=grant.headers)

    def _outcome(
        self,
        ticket: Ticket,
        tally: _Tally,
        chat: ChatRequest,
        started: float,
        status: int,
        error_code: str | None,
    ) -> Outcome:
        usage = tally.usage or Usage(
            prompt_tokens=ticket.prompt_tokens, completion_tokens=tally.deltas
        )
        ttft = (tally.first_at - started) * 1000 if tally.first_at is not None else None
        if tally.failure is not None and status == 200:  # recorded as what it was, not a 200
            status, error_code = tally.failure.status, tally.failure.code
        route = tally.route
        return Outcome(
            usage=usage,
            status=status,
            provider=route.provider_name if route else "",
            route_model=route.model if route else "",
            thinking=route.thinking_for(chat.thinking) if route else chat.thinking,
            latency_ms=(time.perf_counter() - started) * 1000,
            ttft_ms=ttft,
            error_code=error_code,
        )

    async def _settle(self, grant: Grant, outcome: Outcome, wire: Wire) -> None:
        model = grant.ticket.counted_model
        m = self.metrics
        m.requests.labels(wire.endpoint, model, outcome.provider, str(outcome.status)).inc()
        m.latency.labels(wire.endpoint, model).observe(outcome.latency_ms / 1000)
        if outcome.ttft_ms is not None:
            m.ttft.labels(model, outcome.provider).observe(outcome.ttft_ms / 1000)
        u = outcome.usage
        m.tokens.labels(model, outcome.provider, "prompt").inc(u.prompt_tokens)
        m.tokens.labels(model, outcome.provider, "completion").inc(u.completion_tokens)
        m.tokens.labels(model, outcome.provider, "cached").inc(u.cached_prompt_tokens)
        try:
            await self.access.settle(grant, outcome)
        except Exception:
            log.exception("settle_failed", request_id=grant.ticket.request_id)


async def _empty() -> AsyncGenerator[Event, None]:
    return
    yield


async def _prepend(
    first: Event, rest: AsyncGenerator[Event, None], tally: _Tally
) -> AsyncGenerator[Event, None]:
    try:
        yield first
        async for event in rest:
            tally.see(event)
            yield event
    finally:
        await rest.aclose()
