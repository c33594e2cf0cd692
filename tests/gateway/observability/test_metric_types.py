"""gateway/observability/metric_types.py against prometheus_client's own classes: the same updates
render the same exposition (the `_created` timestamps aside), and misuse fails as theirs does."""

from __future__ import annotations

import re

import prometheus_client as prom
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest

from gateway.observability import metric_types as light

BUCKETS = (0.005, 0.01, 0.5, 1, 10)
LABELS = st.sampled_from(["a", "b", 'q"uote', "new\nline"])
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("count"), LABELS, st.floats(0, 1e6)),
        st.tuples(
            st.just("observe"),
            LABELS,
            st.sampled_from([0.0, 0.005, 0.01, 0.7, 10.0, 99.0]) | st.floats(0, 100),
        ),
        st.tuples(st.just("gauge"), LABELS, st.floats(-1e3, 1e3)),
        st.tuples(st.just("flight"), st.just(""), st.sampled_from([1.0, -1.0])),
    ),
    max_size=40,
)


def _render(module: object, ops: list[tuple[str, str, float]]) -> str:
    registry = CollectorRegistry()
    counter = module.Counter("c", "a counter", ["k"], registry=registry)  # type: ignore[attr-defined]
    hist = module.Histogram("h", "a histogram", ["k"], buckets=BUCKETS, registry=registry)  # type: ignore[attr-defined]
    gauge = module.Gauge("g", "a gauge", ["k"], registry=registry)  # type: ignore[attr-defined]
    flight = module.Gauge("f", "in flight", registry=registry)  # type: ignore[attr-defined]
    for op, label, value in ops:
        if op == "count":
            counter.labels(label).inc(value)
        elif op == "observe":
            hist.labels(label).observe(value)
        elif op == "gauge":
            gauge.labels(label).set(value)
        elif value > 0:
            flight.inc()
        else:
            flight.dec()
    text = generate_latest(registry).decode()
    return re.sub(r"(_created\{[^}]*\}) \S+", r"\1 T", text)


@settings(max_examples=60, deadline=None)
@given(OPS)
def test_same_exposition_as_prometheus_client(ops: list[tuple[str, str, float]]) -> None:
    assert _render(light, ops) == _render(prom, ops)


def test_misuse_fails_as_prometheus_client_does() -> None:
    registry = CollectorRegistry()
    counter = light.Counter("c", "a counter", ["k"], registry=registry)
    with pytest.raises(ValueError):
        counter.labels("a").inc(-1)
    with pytest.raises(ValueError):
        counter.labels("a", "b")
    with pytest.raises(ValueError):
        light.Counter("c", "the same name twice", ["k"], registry=registry)
    with pytest.raises(ValueError):
        light.Histogram("h", "unsorted", ["k"], buckets=(1, 0.5), registry=registry)
