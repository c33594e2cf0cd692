"""The request path after parsing: route -> admit -> provider (with fallback) -> encode -> settle.

One `Pipeline` per app. `serve` answers one chat or completions request, streaming frame by
frame or as one JSON body, and settles usage from a `finally` whatever happened (success, provider
error, client disconnect). Settlement runs beside the response rather than before it; `drain`
waits for it (the app does on shutdown, so nothing is lost).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Coroutine
from dataclasses import dataclass, replace
from typing import Any, Protocol

import structlog
from aiohttp import web

from gateway.access import AccessControl, Grant, Outcome, Principal, Ticket, require_model
from gateway.errors import (
    GatewayError,
    GatewayTimeout,
    InvalidRequest,
    RateLimited,
    ServiceUnavailable,
    UpstreamError,
)
from gateway.metrics import Metrics
from gateway.middleware import REQUEST_ID
from gateway.pacing import frames
from gateway.routing import Route, Router
from gateway.tokens import count_prompt_tokens
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


class StreamEncoder(Protocol):
    @property
    def usage(self) -> Usage | None: ...
    def start(self) -> bytes: ...
    def keepalive(self) -> bytes | None:
        """The frame that fills a silence in the stream; None: the protocol sends none."""
        ...

    def encode(self, event: Event) -> bytes | None: ...
    def close(self, finish: FinishReason | None = None) -> list[bytes]: ...
    def fail(self, error: GatewayError) -> bytes:
        """The frame that reports a failure after the stream started (instead of `close`)."""
        ...


class Aggregator(Protocol):
    usage: Usage

    def add(self, event: Event) -> None: ...
    def body(self, completion_id: str, model: str) -> dict[str, Any]: ...


class Wire(Protocol):
    """How one front-end protocol shapes its answer."""

    endpoint: str
    id_prefix: str
    include_usage: bool

    def stream_encoder(
        self, completion_id: str, model: str, prompt_tokens: int = 0
    ) -> StreamEncoder: ...
    def aggregator(self) -> Aggregator: ...


def provider_error_to_gateway(exc: perr.ProviderError) -> GatewayError:
    """Map a provider failure to what the client sees."""
    name = exc.provider or "upstream"
    if isinstance(exc, perr.UpstreamRateLimited):
        return RateLimited(
            f"Provider '{name}' is rate limiting: {exc.message}",
            retry_after=exc.retry_after or 1,
            code="upstream_rate_limited",
        )
    if isinstance(exc, perr.Overloaded):
        retry = str(exc.retry_after or 1)
        return ServiceUnavailable(exc.message, code="overloaded", headers={"Retry-After": retry})
    if isinstance(exc, perr.InvalidRequest):
        return InvalidRequest(exc.message, param=exc.param)
    if isinstance(exc, perr.UpstreamBadRequest):
        return InvalidRequest(
            f"Provider '{name}' rejected the request: {exc.message}", code="upstream_bad_request"
        )
    if isinstance(exc, perr.UpstreamTimeout):
        return GatewayTimeout(f"Provider '{name}' timed out: {exc.message}")
    if isinstance(exc, perr.UpstreamAuthError):
        return UpstreamError(
            f"Provider '{name}' rejected the gateway's credentials; check its API key "
            "configuration.",
            code="upstream_auth_failed",
        )
    return UpstreamError(f"Provider '{name}' failed: {exc.message}", code=exc.code)


@dataclass(slots=True)
class _Tally:
    """What the client has been sent so far, for settlement when no Usage arrives."""

    deltas: int = 0
    first_at: float | None = None
    usage: Usage | None = None
    finish: FinishReason | None = None

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
        default_max_tokens: int,
        keepalive_s: float = 15.0,
    ) -> None:
        self.router = router
        self.access = access
        self.metrics = metrics
        self.default_max_tokens = default_max_tokens
        self.keepalive_s = keepalive_s
        self._settling: set[asyncio.Task[None]] = set()

    async def drain(self) -> None:
        """Wait until every finished request has been settled (shutdown; tests)."""
        while self._settling:
            await asyncio.gather(*self._settling, return_exceptions=True)

    async def serve(
        self, request: web.Request, principal: Principal, chat: ChatRequest, wire: Wire
    ) -> web.StreamResponse:
        public_model = self.router.canonical(chat.model)
        routes = self.router.resolve(public_model)
        require_model(principal, public_model)
        structlog.contextvars.bind_contextvars(key_id=principal.key_id, model=public_model)
        ticket = Ticket(
            principal=principal,
            model=public_model,
            request_id=chat.request_id,
            prompt_tokens=count_prompt_tokens(routes[0].provider, chat),
            max_tokens=chat.sampling.max_tokens or self.default_max_tokens,
        )
        grant = await self._admit(ticket, wire)
        sampling = replace(chat.sampling, max_tokens=grant.max_tokens)
        started = time.perf_counter()
        tally = _Tally()
        status, error_code = 200, None
        route: Route | None = None
        self.metrics.in_flight.inc()
        try:
            route, events = await self._open(routes, chat, sampling, tally)
            structlog.contextvars.bind_contextvars(
                provider=route.provider_name, route_model=route.model
            )
            if chat.stream:
                return await self._stream(request, wire, grant, public_model, events, tally)
            return await self._json(wire, grant, public_model, events, tally)
        except GatewayError as exc:
            status, error_code = exc.status, exc.code
            raise
        except (asyncio.CancelledError, ConnectionResetError):
            status, error_code = 499, "client_disconnected"
            raise
        finally:
            self.metrics.in_flight.dec()
            outcome = self._outcome(ticket, tally, route, chat, started, status, error_code)
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
        self, routes: tuple[Route, ...], chat: ChatRequest, sampling: Sampling, tally: _Tally
    ) -> tuple[Route, AsyncGenerator[Event, None]]:
        """Start the first route that answers; fall back while nothing was sent to the client."""
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
                return route, _empty()
            except perr.ProviderError as exc:
                await events.aclose()
                exc.provider = exc.provider or route.provider_name
                self.metrics.errors.labels(chat.model, route.provider_name, exc.code).inc()
                log.warning(
                    "route_failed", provider=route.provider_name, code=exc.code, error=exc.message
                )
                if not exc.retryable:
                    raise provider_error_to_gateway(exc) from None
                failure = exc
                continue
            except BaseException:
                await events.aclose()
                raise
            tally.see(first)
            return route, _prepend(first, events, tally)
        assert failure is not None
        raise provider_error_to_gateway(failure)

    async def _stream(
        self,
        request: web.Request,
        wire: Wire,
        grant: Grant,
        model: str,
        events: AsyncGenerator[Event, None],
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
        await resp.prepare(request)
        encoder = wire.stream_encoder(
            wire.id_prefix + request[REQUEST_ID], model, grant.ticket.prompt_tokens
        )
        await resp.write(encoder.start())
        out = frames(events, encoder, self.keepalive_s)
        try:
            async for frame in out:
                await resp.write(frame)
        except perr.ProviderError as exc:
            exc.provider = exc.provider or "upstream"
            err = provider_error_to_gateway(exc)
            log.warning("stream_failed", code=err.code, error=err.message)
            await resp.write(encoder.fail(err))
            tally.finish = None
            return resp
        finally:
            await out.aclose()  # first: it may hold a read of `events` in flight
            await events.aclose()
        await resp.write(b"".join(encoder.close()))
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
        route: Route | None,
        chat: ChatRequest,
        started: float,
        status: int,
        error_code: str | None,
    ) -> Outcome:
        usage = tally.usage or Usage(
            prompt_tokens=ticket.prompt_tokens, completion_tokens=tally.deltas
        )
        ttft = (tally.first_at - started) * 1000 if tally.first_at is not None else None
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
        model = grant.ticket.model
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
