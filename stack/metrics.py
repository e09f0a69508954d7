"""Prometheus metrics of a reference component (names ``deltatap_stack_*``), one private registry
per component so several can share a process (tests, ``deltatap demo``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from deltatap.telemetry.tracer import Telemetry

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class _Callback(Collector):
    def __init__(self, fn: Callable[[], Iterable[Metric]]) -> None:
        self.fn = fn

    def collect(self) -> Iterable[Metric]:
        return self.fn()


class ComponentMetrics:
    def __init__(self, component: str, kind: str, telemetry: Telemetry) -> None:
        self.registry = CollectorRegistry()
        self.component, self.kind = component, kind
        labels = {"registry": self.registry}
        self.requests = Counter(
            "deltatap_stack_requests", "Requests answered, by outcome and HTTP status", ["component", "outcome", "status"], **labels
        )
        self.duration = Histogram(
            "deltatap_stack_request_duration_seconds",
            "Arrival to end of response, seconds",
            ["component"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
            **labels,
        )
        self.telemetry = telemetry
        self.add_collector(self._export_stats)

    def add_collector(self, fn: Callable[[], Iterable[Metric]]) -> None:
        self.registry.register(_Callback(fn))

    def observe(self, outcome: str, status: int | None, seconds: float) -> None:
        self.requests.labels(self.component, outcome, str(status or 0)).inc()
        self.duration.labels(self.component).observe(seconds)

    def _export_stats(self) -> Iterable[Metric]:
        s = self.telemetry.stats
        c = CounterMetricFamily("deltatap_stack_spans_dropped", "Spans dropped by the bounded exporter", labels=["component"])
        c.add_metric([self.component], s.spans_dropped)
        yield c
        e = CounterMetricFamily("deltatap_stack_spans_exported", "Spans exported", labels=["component"])
        e.add_metric([self.component], s.spans_exported)
        yield e

    async def handler(self, request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.registry), headers={"Content-Type": CONTENT_TYPE})


def gauge(name: str, doc: str, value: float, component: str) -> GaugeMetricFamily:
    g = GaugeMetricFamily(name, doc, labels=["component"])
    g.add_metric([component], value)
    return g


def counter(name: str, doc: str, value: float, component: str) -> CounterMetricFamily:
    c = CounterMetricFamily(name, doc, labels=["component"])
    c.add_metric([component], value)
    return c
