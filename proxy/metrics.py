"""The tap's Prometheus metrics (one private registry per tap) and its admin app (/metrics, /healthz).

Every metric is documented in docs/tap.md; the Grafana dashboard queries these names.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from deltatap.clocksync import ClockEstimate
from deltatap.telemetry import ExportStats

_OVERHEAD_BUCKETS = (20e-6, 50e-6, 100e-6, 200e-6, 500e-6, 1e-3, 2e-3, 5e-3, 10e-3, 50e-3)
_LATENCY_BUCKETS = (1e-3, 5e-3, 10e-3, 25e-3, 50e-3, 100e-3, 250e-3, 500e-3, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class _ExportCollector(Collector):
    """Reads the span-export counters and the clock estimate at scrape time."""

    def __init__(self, link: str, stats: ExportStats, clock: Callable[[], ClockEstimate | None]) -> None:
        self.link, self.stats, self.clock = link, stats, clock

    def collect(self) -> Iterable:
        s = self.stats
        exported = CounterMetricFamily("deltatap_tap_spans_exported", "Spans handed to the OTLP exporter successfully", labels=["link"])
        exported.add_metric([self.link], s.spans_exported)
        dropped = CounterMetricFamily("deltatap_tap_spans_dropped", "Spans dropped (queue full or export failed)", labels=["link", "reason"])
        dropped.add_metric([self.link, "queue_full"], s.spans_dropped_queue_full)
        dropped.add_metric([self.link, "export_failed"], s.spans_dropped_export_failed)
        failures = CounterMetricFamily("deltatap_tap_export_failures", "Failed export batches", labels=["link"])
        failures.add_metric([self.link], s.export_failures)
        yield from (exported, dropped, failures)
        est = self.clock()
        if est is not None:
            off = GaugeMetricFamily("deltatap_tap_clock_offset_seconds", "Tap clock minus collector clock", labels=["link"])
            off.add_metric([self.link], est.offset_ns / 1e9)
            unc = GaugeMetricFamily("deltatap_tap_clock_uncertainty_seconds", "Uncertainty of the clock offset", labels=["link"])
            unc.add_metric([self.link], est.uncertainty_ns / 1e9)
            yield from (off, unc)


class TapMetrics:
    def __init__(self, link: str, stats: ExportStats, clock: Callable[[], ClockEstimate | None]) -> None:
        self.link = link
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter("deltatap_tap_requests", "Requests finished, by outcome", ["link", "outcome"], registry=r)
        self.in_flight = Gauge("deltatap_tap_in_flight", "Requests in flight through the tap", ["link"], registry=r).labels(link)
        self.upstream_errors = Counter("deltatap_tap_upstream_errors", "Upstream failures, by cause", ["link", "cause"], registry=r)
        self.overhead_request = Histogram(
            "deltatap_tap_overhead_request_seconds", "Tap overhead on the request: last byte read -> last byte written upstream",
            ["link"], buckets=_OVERHEAD_BUCKETS, registry=r).labels(link)
        self.overhead_first_token = Histogram(
            "deltatap_tap_overhead_first_token_seconds", "Tap overhead on the first content token: read -> written downstream",
            ["link"], buckets=_OVERHEAD_BUCKETS, registry=r).labels(link)
        self.upstream_ttft = Histogram(
            "deltatap_tap_upstream_first_token_seconds", "Request forwarded -> first content token received (the upstream side's TTFT)",
            ["link"], buckets=_LATENCY_BUCKETS, registry=r).labels(link)
        self.request_bytes = Counter("deltatap_tap_request_bytes", "Request body bytes forwarded upstream", ["link"], registry=r).labels(link)
        self.response_bytes = Counter("deltatap_tap_response_bytes", "Response body bytes forwarded downstream", ["link"], registry=r).labels(link)
        r.register(_ExportCollector(link, stats, clock))

    def render(self) -> bytes:
        return generate_latest(self.registry)


def admin_app(metrics: TapMetrics, health: Callable[[], tuple[bool, dict]]) -> web.Application:
    async def get_metrics(request: web.Request) -> web.Response:
        return web.Response(body=metrics.render(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def get_health(request: web.Request) -> web.Response:
        ok, doc = health()
        return web.json_response(doc, status=200 if ok else 503)

    app = web.Application()
    app.router.add_get("/metrics", get_metrics)
    app.router.add_get("/healthz", get_health)
    return app
