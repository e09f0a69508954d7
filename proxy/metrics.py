"""The tap's Prometheus metrics (one private registry per tap) and its admin app (/metrics, /healthz).

Every metric is documented in docs/tap.md; the Grafana dashboard queries these names.

The request path only bumps plain integers (:class:`TapCounters`, no locks: one event loop
updates them) — ``prometheus_client``'s metric objects take a lock and walk label tuples on
every call, which cost the tap more CPU per request than its SSE parsing. The registry turns the
counters into metric families when ``/metrics`` is scraped.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Awaitable, Callable, Iterable

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from deltatap.core.clocksync import ClockEstimate
from deltatap.core.gc_pauses import PAUSES
from deltatap.net.kstamp import MERGED_READS, READ_LAG, SLOW_SENDS
from deltatap.telemetry.tracer import ExportStats

_OVERHEAD_BUCKETS = (20e-6, 50e-6, 100e-6, 200e-6, 500e-6, 1e-3, 2e-3, 5e-3, 10e-3, 50e-3)
_LATENCY_BUCKETS = (1e-3, 5e-3, 10e-3, 25e-3, 50e-3, 100e-3, 250e-3, 500e-3, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class NsHistogram:
    """Bucket counts of durations observed in ns; ``le`` bounds in seconds (Prometheus convention)."""

    __slots__ = ("bounds_s", "_bounds_ns", "counts", "sum_ns", "count")

    def __init__(self, bounds_s: tuple[float, ...]) -> None:
        self.bounds_s = bounds_s
        self._bounds_ns = [round(b * 1e9) for b in bounds_s]
        self.counts = [0] * (len(bounds_s) + 1)  # last: above the largest bound (+Inf only)
        self.sum_ns = 0
        self.count = 0

    def observe_ns(self, ns: int) -> None:
        self.counts[bisect.bisect_left(self._bounds_ns, ns)] += 1  # le: a value equal to a bound falls in it
        self.sum_ns += ns
        self.count += 1

    def family(self, name: str, doc: str, link: str) -> HistogramMetricFamily:
        cumulative, acc = [], 0
        for bound, n in zip(self.bounds_s, self.counts):
            acc += n
            cumulative.append((floatToGoString(bound), acc))
        cumulative.append(("+Inf", self.count))
        fam = HistogramMetricFamily(name, doc, labels=["link"])
        fam.add_metric([link], cumulative, sum_value=self.sum_ns / 1e9)
        return fam


class TapCounters:
    """What the request path updates: plain attributes and dicts."""

    __slots__ = ("requests", "upstream_errors", "in_flight", "request_bytes", "response_bytes",
                 "overhead_request", "overhead_first_token", "upstream_ttft", "unparsed", "connections", "upstream_connections",
                 "connections_refused", "header_timeouts", "ws_malformed", "tls_handshake_failures", "not_http2", "upstream_not_http2",
                 "stale_retries")

    def __init__(self) -> None:
        self.requests: dict[str, int] = {}  # outcome -> count
        self.upstream_errors: dict[str, int] = {}  # cause -> count
        self.in_flight = 0
        self.request_bytes = 0
        self.response_bytes = 0
        self.overhead_request = NsHistogram(_OVERHEAD_BUCKETS)
        self.overhead_first_token = NsHistogram(_OVERHEAD_BUCKETS)
        self.upstream_ttft = NsHistogram(_LATENCY_BUCKETS)
        self.unparsed = 0  # messages the framing reader could not frame: the connection was passed on unparsed
        self.connections = 0  # downstream connections accepted
        self.upstream_connections = 0  # upstream connections opened (the rest reused a pooled one)
        self.connections_refused = 0  # closed at accept: --max-connections were open
        self.header_timeouts = 0  # closed: no whole request head within --header-timeout-s
        self.ws_malformed = 0  # WebSocket directions whose frames broke RFC 6455: relayed on, unwatched from there
        self.tls_handshake_failures = 0  # downstream TLS handshakes that failed (plain HTTP to a TLS tap included)
        self.not_http2 = 0  # --protocol grpc: connections closed because they did not open with HTTP/2's preface
        # HTTP/2 client connections whose upstream connection did not answer HTTP/2's preface in HTTP/2 (other bytes, or a
        # close): what it sent, and its close, passed on to the client as they came (h2relay.H2Downstream._pass_through)
        self.upstream_not_http2 = 0
        self.stale_retries = 0  # requests sent again on a fresh connection: the pooled one closed before answering


class _TapCollector(Collector):
    """Turns the counters, the span-export counters and the clock estimate into families at scrape time."""

    def __init__(self, link: str, c: TapCounters, stats: ExportStats, clock: Callable[[], ClockEstimate | None]) -> None:
        self.link, self.c, self.stats, self.clock = link, c, stats, clock

    def collect(self) -> Iterable:
        link, c, s = self.link, self.c, self.stats
        req = CounterMetricFamily("deltatap_tap_requests", "Requests finished, by outcome", labels=["link", "outcome"])
        for outcome, n in sorted(c.requests.items()):
            req.add_metric([link, outcome], n)
        inflight = GaugeMetricFamily("deltatap_tap_in_flight", "Requests in flight through the tap", labels=["link"])
        inflight.add_metric([link], c.in_flight)
        errs = CounterMetricFamily("deltatap_tap_upstream_errors", "Upstream failures, by cause", labels=["link", "cause"])
        for cause, n in sorted(c.upstream_errors.items()):
            errs.add_metric([link, cause], n)
        yield from (req, inflight, errs)
        for name, doc, value in (
            ("deltatap_tap_unparsed", "Messages the tap could not frame as HTTP/1.1; the rest of their connection was passed on "
             "as bytes, unwatched", c.unparsed),
            ("deltatap_tap_connections", "Downstream connections accepted", c.connections),
            ("deltatap_tap_upstream_connections", "Upstream connections opened (each downstream connection is paired with one; idle "
             "ones are pooled and reused)", c.upstream_connections),
            ("deltatap_tap_connections_refused", "Downstream connections closed at accept because --max-connections were open",
             c.connections_refused),
            ("deltatap_tap_header_timeouts", "Downstream connections closed for sending no whole request head within "
             "--header-timeout-s (idle keep-alive included; HTTP/2: no preface/SETTINGS, or no stream open, that long)", c.header_timeouts),
            ("deltatap_tap_websocket_malformed", "WebSocket directions whose frames broke RFC 6455; their bytes were relayed on, "
             "unwatched", c.ws_malformed),
            ("deltatap_tap_tls_handshake_failures", "Downstream TLS handshakes that failed (--tls-cert; plain HTTP sent to the TLS "
             "port included)", c.tls_handshake_failures),
            ("deltatap_tap_not_http2", "Downstream connections closed because they did not open with HTTP/2's preface "
             "(--protocol grpc)", c.not_http2),
            ("deltatap_tap_upstream_not_http2", "HTTP/2 client connections whose upstream connection did not answer HTTP/2's "
             "preface in HTTP/2 (other bytes, or a close without answering); what it sent, and its close, went to the client as "
             "they came", c.upstream_not_http2),
            ("deltatap_tap_stale_retries", "Times a pooled upstream connection closed before any byte of an answer and what was "
             "sent on it went again on a fresh connection", c.stale_retries),
            ("deltatap_tap_request_bytes", "Request body bytes forwarded upstream", c.request_bytes),
            ("deltatap_tap_response_bytes", "Response body bytes forwarded downstream", c.response_bytes),
        ):
            fam = CounterMetricFamily(name, doc, labels=["link"])
            fam.add_metric([link], value)
            yield fam
        yield c.overhead_request.family(
            "deltatap_tap_overhead_request_seconds", "Tap overhead on the request: last byte read -> last byte written upstream", link)
        yield c.overhead_first_token.family(
            "deltatap_tap_overhead_first_token_seconds", "Tap overhead on the first content token: read -> written downstream", link)
        yield c.upstream_ttft.family(
            "deltatap_tap_upstream_first_token_seconds", "Request forwarded -> first content token received (the upstream side's TTFT)", link)
        spans = s.snapshot()  # one consistent reading: ended == exported + dropped + queued
        ended = CounterMetricFamily("deltatap_tap_spans_ended", "Spans handed to the export queue: exported + dropped + queued", labels=["link"])
        ended.add_metric([link], spans.ended)
        exported = CounterMetricFamily("deltatap_tap_spans_exported", "Spans handed to the OTLP exporter successfully", labels=["link"])
        exported.add_metric([link], spans.exported)
        dropped = CounterMetricFamily("deltatap_tap_spans_dropped", "Spans dropped, by reason", labels=["link", "reason"])
        for reason, n in spans.dropped_by_reason.items():
            dropped.add_metric([link, reason], n)
        queued = GaugeMetricFamily("deltatap_tap_spans_queued", "Spans waiting for export (queued or in the batch being exported)", labels=["link"])
        queued.add_metric([link], spans.queued)
        failures = CounterMetricFamily("deltatap_tap_export_failures", "Failed export batches", labels=["link"])
        failures.add_metric([link], s.export_failures)
        yield from (ended, exported, dropped, queued, failures)
        gc_n = CounterMetricFamily("deltatap_process_gc_collections", "Garbage collections in this process (timed since start-up), by generation", labels=["link", "generation"])
        gc_s = CounterMetricFamily("deltatap_process_gc_pause_seconds", "Time the event loop stood still in garbage collection, by generation", labels=["link", "generation"])
        gc_max = GaugeMetricFamily("deltatap_process_gc_pause_max_seconds", "Longest single garbage-collection pause, by generation", labels=["link", "generation"])
        for g in range(3):
            gc_n.add_metric([link, str(g)], PAUSES.count[g])
            gc_s.add_metric([link, str(g)], PAUSES.total_ns[g] / 1e9)
            gc_max.add_metric([link, str(g)], PAUSES.max_ns[g] / 1e9)
        yield from (gc_n, gc_s, gc_max)
        lag = HistogramMetricFamily("deltatap_process_read_lag_seconds", "Reads: process read time minus the kernel's arrival stamp of the first packet waiting", labels=["link"])
        cum, buckets = 0, []
        for i, n in enumerate(READ_LAG.buckets):
            cum += n
            if n or i in (10, 17, 20, 23, 27):  # (1 us, 131 us, 1 ms, 8 ms, 134 ms always present)
                buckets.append((str((1 << i) / 1e9), cum))
        buckets.append(("+Inf", READ_LAG.count))
        lag.add_metric([link], buckets, READ_LAG.total_ns / 1e9)
        yield lag
        for metric, text, counts in (
            ("deltatap_process_merged_reads", "Reads that held several segments (per-packet stamps on): placed segment by segment from the "
             "packet log, or not (fallback: merged packets keep the later stamp; out_of_reach: those of the fallbacks that came too late "
             "for the log's search window, not searched)", MERGED_READS),
            ("deltatap_process_slow_sends", "Sends that took over 30 us (the write's stamp is taken before the send): departure placed from "
             "the packet log, or not (bounded: the stamp keeps the send's duration as its bound)", SLOW_SENDS),
        ):
            fam = CounterMetricFamily(metric, text, labels=["link", "placed"])
            for placed, n in counts.items():
                fam.add_metric([link, placed], n)
            yield fam
        est = self.clock()
        if est is not None:
            off = GaugeMetricFamily("deltatap_tap_clock_offset_seconds", "Tap clock minus collector clock", labels=["link"])
            off.add_metric([link], est.offset_ns / 1e9)
            unc = GaugeMetricFamily("deltatap_tap_clock_uncertainty_seconds", "Uncertainty of the clock offset", labels=["link"])
            unc.add_metric([link], est.uncertainty_ns / 1e9)
            yield from (off, unc)


class TapMetrics:
    def __init__(self, link: str, stats: ExportStats, clock: Callable[[], ClockEstimate | None]) -> None:
        self.link = link
        self.counters = TapCounters()
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(_TapCollector(link, self.counters, stats, clock))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _BadRequestLine(logging.Filter):
    """aiohttp's server logs a request it cannot parse (a path past 8190 bytes, bytes that are not HTTP, broken chunked
    framing) as an ERROR with a traceback, one per request: anyone who reaches the admin port could fill the tap's log.
    Here each is one INFO line naming the peer and aiohttp's reason (shown with -v); everything else passes as it is."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if not isinstance(exc, HttpProcessingError):
            return True
        reason = (str(exc.message).strip().splitlines() or [""])[0]
        peer = record.args[0] if isinstance(record.args, tuple) and record.args else "?"
        record.msg, record.args = "HTTP server: a request it cannot parse from %s, answered %s (%s)", (peer, exc.code, reason[:120])
        record.levelno, record.levelname = logging.INFO, "INFO"
        record.exc_info = record.exc_text = None
        return _ADMIN_LOG.isEnabledFor(logging.INFO)


_ADMIN_LOG = logging.getLogger("aiohttp.server")


def quiet_bad_requests() -> None:
    """Install :class:`_BadRequestLine` on aiohttp's server logger (once per process; the admin servers log there)."""
    if not any(isinstance(f, _BadRequestLine) for f in _ADMIN_LOG.filters):
        _ADMIN_LOG.addFilter(_BadRequestLine())


def admin_app(metrics: TapMetrics, health: Callable[[], Awaitable[tuple[bool, dict]]]) -> web.Application:
    quiet_bad_requests()
    async def get_metrics(request: web.Request) -> web.Response:
        return web.Response(body=metrics.render(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def get_health(request: web.Request) -> web.Response:
        """Readiness: 503 while the upstream does not take a TCP connection or the tap drains."""
        ok, doc = await health()
        return web.json_response(doc, status=200 if ok else 503)

    async def get_live(request: web.Request) -> web.Response:
        """Liveness: 200 while the tap process serves, whatever its upstream does (restarting a tap does not bring
        its upstream back); the body still says the upstream's state."""
        _ok, doc = await health()
        return web.json_response(doc, status=200)

    app = web.Application()
    app.router.add_get("/metrics", get_metrics)
    app.router.add_get("/healthz", get_health)
    app.router.add_get("/readyz", get_health)
    app.router.add_get("/livez", get_live)
    return app
