"""The tap is transparent: generated HTTP/1.1 exchanges, each made directly and through a tap, compared byte
for byte (issue 15, "Transparency").

Each exchange (:func:`exchanges.generate`, drawn by hypothesis, derandomized, no example database: the same 300
every run) goes once straight to a raw upstream and once through a tap to an identical raw upstream
(:mod:`raw_peer`: no HTTP library on either side). What the upstream received (less only the ``traceparent``,
``tracestate`` and correlation header lines the tap adds: :func:`exchanges.normalise`), what the client received
and how the client's connection ended must be the same, and each exchange through the tap must give one span
with its method and final status. A response that is identical but complete only after the client's 1 s wait is
printed, not failed (a stall of a busy machine; ``benchmarks/transparency_fuzz.py`` counts them). Every difference
is collected, then reported by kind with the first example of each (:func:`exchanges.compare`), rather than
stopping at the first. ``benchmarks/transparency_fuzz.py`` runs the same generator for 10⁵ exchanges.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter

import pytest
from exchanges import Exchange, HypothesisDraw, Run, compare, first_difference, generate, normalise
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from raw_peer import RawUpstream, raw_exchange
from tap_helpers import tap_spans

from deltatap.core.vocab import Attr
from deltatap.proxy import TapOptions, start_tap
from deltatap.telemetry.tracer import setup_telemetry

EXAMPLES = 300
BUDGET_S = 20.0  # examples past this are skipped (and said so), keeping the test under a minute on a busy machine
TIMEOUT_S = 1.0  # the client stops waiting for a response this long after sending (the direct run takes ms) ...
LATE_S = 3.0  # ... then reads on this long: a response complete only then is a stall of a busy machine, not a difference


class Pair:
    """A tap in front of one raw upstream, a second raw upstream for the direct runs, on a loop in a thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.exporter = InMemorySpanExporter()
        self.telemetry = setup_telemetry("deltatap-test-fuzz", exporter=self.exporter)
        self.direct = self.call(RawUpstream().start())
        self.behind = self.call(RawUpstream().start())
        self.options = TapOptions(link="edge", upstream=self.behind.url, admin_port=None)
        self.tap = self.call(start_tap(self.options, self.telemetry))

    def call(self, coro, timeout: float = 30):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    async def run(self, ex: Exchange, upstream: RawUpstream, port: int, settle_s: float) -> tuple[Run, Run | None]:
        """The exchange's run, and if the client stopped at TIMEOUT_S, the run with what came in LATE_S more."""
        mark = upstream.expect(ex.script)
        got = await raw_exchange(port, ex.pieces, pause_s=0.001, expect=None if ex.closes else len(ex.response),
                                 settle_s=settle_s, timeout_s=TIMEOUT_S, late_s=LATE_S)
        sent = normalise(upstream.since(mark), self.options.correlation_header)
        return Run(sent, got.received, got.end), Run(sent, got.received + got.late, got.late_end) if got.late_end else None

    def both(self, ex: Exchange) -> tuple[Run, Run, Run | None]:
        direct, _ = self.call(self.run(ex, self.direct, self.direct.port, 0.0))
        tapped, late = self.call(self.run(ex, self.behind, self.tap.port, 0.02))
        return direct, tapped, late

    def close(self) -> None:
        self.call(self.tap.close(grace_s=1))
        self.call(self.direct.close())
        self.call(self.behind.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()
        self.telemetry.shutdown()


@pytest.fixture(scope="module")
def pair():
    p = Pair()
    yield p
    p.close()


@pytest.mark.timeout(60)
def test_generated_exchanges_identical_direct_and_through_the_tap(pair):
    seen: Counter[str] = Counter()  # what the examples exercised
    diffs: Counter[str] = Counter()
    first: dict[str, str] = {}
    expected_spans: list[tuple[str, int]] = []
    started, skipped, late_ones = time.monotonic(), 0, []

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None, phases=[Phase.explicit, Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(st.data())
    def one(data):
        nonlocal skipped
        ex = generate(HypothesisDraw(data))
        if time.monotonic() - started > BUDGET_S:
            skipped += 1
            return
        seen.update(ex.features)
        direct, tapped, late = pair.both(ex)
        # the harness itself: the direct run got exactly what was scripted
        want_end = "fin" if ex.closes else "open"
        assert (direct.upstream, direct.client, direct.end) == (ex.request, ex.response, want_end), ex.describe()
        expected_spans.append((ex.method, ex.status))
        kinds = compare(direct, tapped)
        if kinds and late is not None and not compare(direct, late):
            late_ones.append(ex.features)  # all there, only slow: timing is for benchmarks/, not a difference
            return
        for kind in kinds:
            diffs[kind] += 1
            if kind not in first:
                side = (direct.upstream, tapped.upstream) if kind.startswith("request") else (direct.client, tapped.client)
                first[kind] = f"{ex.describe()}\n  tapped end={tapped.end}\n  {first_difference(*side)}"

    one()
    ran = len(expected_spans)
    deadline = time.monotonic() + 5  # the span of the last exchange may be built just after its last byte went out
    while len(spans := tap_spans(pair.exporter, pair.telemetry)) < ran and time.monotonic() < deadline:
        time.sleep(0.05)
    got_spans = Counter((s.attributes.get(Attr.HTTP_METHOD), s.attributes.get(Attr.HTTP_STATUS)) for s in spans)
    missing = Counter(expected_spans) - got_spans
    extra = got_spans - Counter(expected_spans)
    if skipped:
        print(f"time budget: ran {ran} of {ran + skipped} examples in {BUDGET_S:.0f} s")
    if late_ones:
        print(f"{len(late_ones)} exchanges complete only after {TIMEOUT_S:g} s through the tap (features: {late_ones})")
    report = [f"{ran} exchanges ({skipped} skipped past the {BUDGET_S:.0f} s budget, {len(late_ones)} identical but late); "
              f"exercised: {dict(seen.most_common())}"]
    ranked = diffs.most_common()
    for kind, n in ranked[:30]:
        report.append(f"--- {kind}: {n} of {ran}; first:\n  {first[kind]}")
    if ranked[30:]:
        report.append(f"--- {len(ranked) - 30} more kinds: {dict(ranked[30:])}")
    if missing or extra:
        report.append(f"--- spans (method, status): missing {dict(missing)}, unexpected {dict(extra)}")
    assert not diffs and not missing and not extra, f"{len(diffs)} kinds of difference\n" + "\n".join(report)
