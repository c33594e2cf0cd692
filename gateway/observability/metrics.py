"""Prometheus metrics, one registry per app (no process-global collectors).

The gateway's own series are `gateway/observability/metric_types.py`'s: plain numbers updated on
the event loop, rendered by prometheus_client at scrape time."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from gateway.observability.metric_types import (
    Counter,
    CounterChild,
    Gauge,
    Histogram,
    HistogramChild,
)
from plumbing.record import record

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


@record
class RequestSeries:
    """The labelled children one finished request updates (looked up once per label set)."""

    requests: CounterChild
    latency: HistogramChild
    ttft: HistogramChild
    prompt_tokens: CounterChild
    completion_tokens: CounterChild
    cached_tokens: CounterChild


class Metrics:
    def __init__(self) -> None:
        self._series: dict[tuple[str, str, str, str], RequestSeries] = {}
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "gateway_requests",
            "Requests by endpoint, model, provider and status",
            ["endpoint", "model", "provider", "status"],
            registry=r,
        )
        self.errors = Counter(
            "gateway_errors",
            "Errors by model, provider and code",
            ["model", "provider", "code"],
            registry=r,
        )
        self.latency = Histogram(
            "gateway_request_seconds",
            "Request latency",
            ["endpoint", "model"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            "gateway_time_to_first_token_seconds",
            "Time to first token",
            ["model", "provider"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.tokens = Counter(
            "gateway_tokens",
            "Tokens by model, provider and kind (prompt, completion, cached)",
            ["model", "provider", "kind"],
            registry=r,
        )
        self.in_flight = Gauge("gateway_in_flight_requests", "Requests in flight", registry=r)
        self.routing_decisions = Counter(
            "gateway_routing_decisions",
            "Routing decisions by provider served, thinking, reason, mode (applied or shadow) "
            "and load (the local-or-upstream choice: none, local, prefix, queue, context)",
            ["provider", "thinking", "reason", "mode", "load"],
            registry=r,
        )
        self.breaker_state = Gauge(
            "gateway_breaker_state",
            "Circuit breaker per route key: 0 closed, 1 half-open (a probe out), 2 open "
            "(keys that never failed have none)",
            ["provider", "model", "account"],
            registry=r,
        )
        self.breaker_opened = Gauge(
            "gateway_breaker_opened",
            "Times the route key's circuit breaker opened since start",
            ["provider", "model", "account"],
            registry=r,
        )
        self.provider_open_breakers = Gauge(
            "gateway_provider_open_breakers",
            "Route keys of the provider whose breaker is open or half-open",
            ["provider"],
            registry=r,
        )
        self.provider_rate_limited = Gauge(
            "gateway_provider_rate_limited_routes",
            "Route keys of the provider in a back-off the upstream asked for (429)",
            ["provider"],
            registry=r,
        )
        self.provider_last_success_age = Gauge(
            "gateway_provider_last_success_age_seconds",
            "Seconds since the provider last answered a request (absent: never yet)",
            ["provider"],
            registry=r,
        )
        self.engine_rank_down = Gauge(
            "gateway_engine_rank_down",
            "1 for each rank of a local parallel engine that exited or stopped responding and "
            "took the engine down (/readyz `engines_down` says which); absent while it runs",
            ["provider", "rank"],
            registry=r,
        )
        self.ready = Gauge(
            "gateway_ready", "1 when /readyz would answer 200, else 0 (at scrape time)", registry=r
        )
        self.model_available = Gauge(
            "gateway_model_available",
            "1 when the configured model has a route that is not failing, else 0 (at scrape time)",
            ["model"],
            registry=r,
        )
        self.engine_loading = Gauge(
            "gateway_engine_loading",
            "1 while the local engine is loading (building its demo checkpoint or loading its "
            "weights), else 0",
            ["provider"],
            registry=r,
        )

    def series(self, endpoint: str, model: str, provider: str, status: str) -> RequestSeries:
        """The children for one label set, cached (the label sets are bounded: models are
        counted by `Router.label`)."""
        key = (endpoint, model, provider, status)
        found = self._series.get(key)
        if found is None:
            tokens = self.tokens
            found = self._series[key] = RequestSeries(
                self.requests.labels(endpoint, model, provider, status),
                self.latency.labels(endpoint, model),
                self.ttft.labels(model, provider),
                tokens.labels(model, provider, "prompt"),
                tokens.labels(model, provider, "completion"),
                tokens.labels(model, provider, "cached"),
            )
        return found

    def render(self) -> bytes:
        return generate_latest(self.registry)
