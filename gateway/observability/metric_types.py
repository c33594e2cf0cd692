"""Counters, gauges and histograms kept in plain Python numbers, exposed as Prometheus families.

prometheus_client's own metric objects take a lock and check observability on every update (about
1.5 us each here; a request makes a dozen updates). These are updated from the event loop's
thread only (the engine's threads report through `gateway/observability/engine_metrics.py`'s
snapshot collector instead), so an update is one addition. A scrape reads them through `collect`,
which yields the same families, samples (`_total`, `_created`, `_bucket`, `_count`, `_sum`) and
exposition that prometheus_client's classes of the same names produce.

The API is the subset of prometheus_client's that the gateway uses: `labels(*values)` (children
cached per label set), `inc`, `dec`, `set` and `observe`.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Iterator, Sequence
from typing import Generic, TypeVar

from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

Child = TypeVar("Child")


class CounterChild:
    __slots__ = ("value", "created")

    def __init__(self) -> None:
        self.value = 0.0
        self.created = time.time()

    def inc(self, amount: float = 1) -> None:
        if amount < 0:
            raise ValueError("Counters can only be incremented by non-negative amounts.")
        self.value += amount


class GaugeChild:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1) -> None:
        self.value += amount

    def dec(self, amount: float = 1) -> None:
        self.value -= amount

    def set(self, value: float) -> None:
        self.value = float(value)


class HistogramChild:
    """`counts[i]`: observations in bucket i alone (cumulated at scrape); the last is +Inf's."""

    __slots__ = ("bounds", "counts", "sum", "created")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0
        self.created = time.time()

    def observe(self, amount: float) -> None:
        # A value equal to a bound belongs to that bucket (`le`), as bisect_left places it.
        self.counts[bisect_left(self.bounds, amount)] += 1
        self.sum += amount


class _Family(Collector, Generic[Child]):
    """A metric with `labelnames`; with none, the family is its own single child's proxy."""

    def __init__(
        self, name: str, documentation: str, labelnames: Sequence[str], registry: CollectorRegistry
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self._children: dict[tuple[str, ...], Child] = {}
        registry.register(self)

    def _new_child(self) -> Child:
        raise NotImplementedError

    def labels(self, *values: str) -> Child:
        key = tuple(str(v) for v in values)
        child = self._children.get(key)
        if child is None:
            if len(key) != len(self.labelnames):
                raise ValueError(f"{self.name} takes labels {self.labelnames}, got {key}")
            child = self._children[key] = self._new_child()
        return child

    def clear(self) -> None:
        """Forget every labelled child (a scrape-time gauge set anew from its source)."""
        self._children.clear()

    def describe(self) -> list[Metric]:
        return [self._empty()]

    def _empty(self) -> Metric:
        raise NotImplementedError


class Counter(_Family[CounterChild]):
    def _new_child(self) -> CounterChild:
        return CounterChild()

    def _empty(self) -> Metric:
        return CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for key, child in list(self._children.items()):
            family.add_metric(key, child.value, created=child.created)
        yield family


class Gauge(_Family[GaugeChild]):
    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str] = (),
        *,
        registry: CollectorRegistry,
    ) -> None:
        super().__init__(name, documentation, labelnames, registry)
        # An unlabelled gauge is reported from the start, at 0, as prometheus_client does.
        self._only = self.labels() if not self.labelnames else None

    def _new_child(self) -> GaugeChild:
        return GaugeChild()

    def inc(self, amount: float = 1) -> None:
        assert self._only is not None, "a labelled gauge is updated through labels()"
        self._only.value += amount

    def dec(self, amount: float = 1) -> None:
        assert self._only is not None, "a labelled gauge is updated through labels()"
        self._only.value -= amount

    def _empty(self) -> Metric:
        return GaugeMetricFamily(self.name, self.documentation, labels=self.labelnames)

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for key, child in list(self._children.items()):
            family.add_metric(key, child.value)
        yield family


class Histogram(_Family[HistogramChild]):
    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        *,
        buckets: Sequence[float],
        registry: CollectorRegistry,
    ) -> None:
        bounds = tuple(float(b) for b in buckets)
        if list(bounds) != sorted(set(bounds)):
            raise ValueError("buckets must be strictly increasing")
        self.bounds = bounds
        self._les = [floatToGoString(b) for b in bounds] + ["+Inf"]
        super().__init__(name, documentation, labelnames, registry)

    def _new_child(self) -> HistogramChild:
        return HistogramChild(self.bounds)

    def _empty(self) -> Metric:
        return HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for key, child in list(self._children.items()):
            running, cumulative = 0, []
            for le, count in zip(self._les, child.counts, strict=True):
                running += count
                cumulative.append((le, float(running)))
            family.add_metric(key, cumulative, child.sum)
            labels = dict(zip(self.labelnames, key, strict=True))
            family.samples.append(Sample(self.name + "_created", labels, child.created))
        yield family
