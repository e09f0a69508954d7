"""Rows held as columns per batch (collector/batch.py) equal the rows built one by one (Decomposer.build_row).

Hypothesis draws a request as the migration guard does (random topologies, missing points, retries, clock offsets,
stripped headers, component, vLLM, LiteLLM and llama.cpp spans) and sends several copies of it whose times and
numbers differ (so they share a block and its columns hold different values), mixed with other requests, in a
shuffled batch. Every row must equal the per-row one, field by field and as its flat record (byte for byte, as the
rows files write it); the batch's delta columns (what the sketches and the Prometheus histograms read) must equal
those of the per-row rows; and reading the aggregates must not have built any row's points or deltas.
"""

from __future__ import annotations

import json
import random
from types import SimpleNamespace

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from deltatap.collector import colread
from deltatap.collector import pipeline as pipeline_mod
from deltatap.collector.batch import _DELTAS, _POINTS, BlockRow, build_rows, columns_of
from deltatap.collector.compact import decode_compact
from deltatap.collector.decompose import Decomposer
from deltatap.collector.pipeline import Pipeline, PipelineOptions
from deltatap.collector.rows import JoinMethod, delta_columns, to_record
from deltatap.collector.sinks import read_rows, write_rows
from deltatap.core.topology import default_topology
from deltatap.core.vocab import Attr, ClientEvent, TapEvent

from otlpfactory import MS, client_span, request, tap_span
from test_kinds_migration import _wire, requests

_IDS = {Attr.REQUEST_ID, Attr.BODY_FINGERPRINT}


def _vary(data: bytes, rnd: random.Random, big: bool = False) -> bytes:
    """``data`` with every time moved by a few ms (each differently) and every number changed a little."""
    req = ExportTraceServiceRequest.FromString(data)
    shift = rnd.randrange(0, 10**9) + ((1 << 63) + (1 << 62) if big else 0)  # big: times past int64
    for rs in req.resource_spans:
        for ss in rs.scope_spans:
            for sp in ss.spans:
                sp.start_time_unix_nano += shift
                sp.end_time_unix_nano += shift + rnd.randrange(0, 3 * MS)
                for ev in sp.events:
                    ev.time_unix_nano += shift + rnd.randrange(0, 3 * MS)
                for kv in sp.attributes:
                    v = kv.value
                    if kv.key in _IDS:
                        continue
                    if v.HasField("int_value") and not kv.key.endswith("status_code"):
                        v.int_value += rnd.randrange(0, 50_000)
                    elif v.HasField("double_value"):
                        v.double_value *= 1 + rnd.random()
    return req.SerializeToString()


def _group(spans: list) -> SimpleNamespace:
    return SimpleNamespace(spans=spans, method=JoinMethod.TRACE_ID, note="", trace_ids=list(dict.fromkeys(s.trace_id for s in spans)))


def _check(dec: Decomposer, ref: Decomposer, groups: list, min_block: int = 2) -> list:
    saved, colread.MIN_BLOCK = colread.MIN_BLOCK, min_block  # (here the columns take two requests of one layout sequence)
    try:
        got = build_rows(dec, groups)
    finally:
        colread.MIN_BLOCK = saved
    want = [ref.build_row(g.spans, g.method, g.note, g.trace_ids) for g in groups]
    cols, want_cols = columns_of(got).columns(), delta_columns(want)
    assert list(cols) == list(want_cols)
    for name, (v, e) in want_cols.items():
        assert np.array_equal(cols[name][0], v) and np.array_equal(cols[name][1], e), name
    untouched = [r for r in got if r.__class__ is BlockRow]
    assert all(_POINTS.__get__(r) is None and _DELTAS.__get__(r) is None for r in untouched)  # the columns built no row
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g == w
        assert w == g
        assert json.dumps(to_record(g, dec.topo)) == json.dumps(to_record(w, dec.topo))
        assert list(g.deltas) == list(w.deltas) and list(g.points) == list(w.points)
    return got


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(requests(), st.integers(1, 6), st.lists(requests(), max_size=2), st.integers(0, 2**32), st.booleans())
def test_block_rows_equal_per_row_rows(case, copies, others, seed, big):
    topo, spans = case
    if not spans:
        return
    rnd = random.Random(seed)
    data = _wire(spans)
    wires = [_vary(data, rnd, big and i == copies - 1) for i in range(copies)]
    wires += [_vary(_wire(s), rnd) for _, s in others if s]
    rnd.shuffle(wires)
    dec, ref = Decomposer(topo), Decomposer(topo)
    groups = [_group(decode_compact(w)) for w in wires]
    _check(dec, ref, groups)
    _check(dec, ref, [_group(decode_compact(w)) for w in wires])  # again: every reader and plan cached


def _tap_request(i: int, times_past_int64: bool = False, overhead: bool = True) -> bytes:
    base = (1 << 63) + 5 if times_past_int64 else 1_700_000_000_000_000_000 + i * 7 * MS
    tid = i.to_bytes(16, "big")
    spans = []
    for n, link in enumerate(("edge", "gw-fw", "fw-engine")):
        ev = {TapEvent.REQUEST_RECEIVED: base + n * MS, TapEvent.REQUEST_FORWARDED: base + n * MS + 150_000 + i,
              TapEvent.FIRST_TOKEN_RECEIVED: base + (60 - n) * MS + i * 13, TapEvent.FIRST_TOKEN_FORWARDED: base + (60 - n) * MS + 40_000 + i,
              TapEvent.LAST_TOKEN_RECEIVED: base + (150 - n) * MS, TapEvent.LAST_TOKEN_FORWARDED: base + (150 - n) * MS + 30_000,
              TapEvent.RESPONSE_END: base + (151 - n) * MS}
        a = {Attr.REQUEST_ID: f"r{i}", Attr.GAP_COUNT: 10 + i, Attr.GAP_MEAN_MS: 8.5 + i / 7, Attr.GAP_P99_MS: 12.25 + i, Attr.GAP_MAX_MS: 14.0,
             Attr.GAP_FWD_MEAN_MS: 8.75 + n, Attr.GAP_FWD_P99_MS: 12.5, Attr.GAP_FWD_MAX_MS: 15.0 + i / 3}
        if overhead:
            a[Attr.OVERHEAD_REQUEST_NS] = 90_000 + 17 * i + n
        spans.append(tap_span(tid, link, ev, a))
    return request(spans, service="deltatap-tap").SerializeToString()


def test_a_block_whose_times_do_not_fit_int64_is_built_row_by_row():
    topo = default_topology()
    dec, ref = Decomposer(topo), Decomposer(topo)
    groups = [_group(decode_compact(_tap_request(i, times_past_int64=i == 4, overhead=i >= 3))) for i in range(6)]
    got = _check(dec, ref, groups)
    assert [r.__class__ is BlockRow for r in got] == [True] * 3 + [False] * 3  # the block holding it: built by the reference


def test_the_usual_batch_is_held_in_blocks_with_tap_overheads_gaps_and_the_residual():
    topo = default_topology()
    dec, ref = Decomposer(topo), Decomposer(topo)
    groups = [_group(decode_compact(_tap_request(i, overhead=i % 2 == 0))) for i in range(8)]
    got = _check(dec, ref, groups)
    assert all(r.__class__ is BlockRow for r in got)
    assert len({id(r._block) for r in got}) == 2  # with and without the stated request overhead
    names = list(got[0].deltas)
    assert "gateway_itl_added_mean" in names and "tap_edge_request" in names and names[-1] == "residual"


def _retried(i: int) -> bytes:
    """A request whose innermost link was tried twice (one point seen twice at one rank: no row plan)."""
    req = ExportTraceServiceRequest.FromString(_tap_request(i))
    spans = req.resource_spans[0].scope_spans[0].spans
    last = spans[-1]
    again = spans.add()
    again.CopyFrom(last)
    again.span_id = (1000 + i).to_bytes(8, "big")
    again.start_time_unix_nano += MS
    for ev in again.events:
        ev.time_unix_nano += MS
    return req.SerializeToString()


def _per_row(dec, groups):
    return [dec.build_row(g.spans, g.method, g.note, g.trace_ids) for g in groups]


def test_pipeline_aggregates_and_metrics_equal_the_per_row_ones(monkeypatch):
    exports = [_tap_request(i, overhead=i % 3 != 0) for i in range(40)]
    runs = []
    for batch in (True, False):
        if not batch:
            monkeypatch.setattr(pipeline_mod, "build_rows", _per_row)
        p = Pipeline(default_topology(), PipelineOptions(grace_s=0.0, join_hold_s=0.0, orphan_wait_s=0.0))
        for i, data in enumerate(exports):
            p.ingest(decode_compact(data), float(i))
        rows = p.flush(1e9)
        runs.append((rows, p.aggregator.to_dict(), p.hist.sketches.to_dict(), {k: v.tolist() for k, v in p.hist.counts.items()},
                     p.hist.sums, p.hist.n, p.snapshot()))
    (rows, *agg), (want_rows, *want_agg) = runs
    assert any(r.__class__ is BlockRow for r in rows)
    assert agg == want_agg
    assert rows == want_rows


def test_rows_files_of_block_rows_are_byte_identical(tmp_path):
    """The row writers read a block's columns (no point or delta object built) and write what the per-row rows give."""
    topo = default_topology()
    groups = [_group(decode_compact(_tap_request(i, overhead=i % 3 != 0))) for i in range(12)]
    groups[5:5] = [_group(decode_compact(_retried(20 + i))) for i in range(2)]  # rows built one by one, among them
    got = build_rows(Decomposer(topo), groups)
    want = [Decomposer(topo).build_row(g.spans, g.method, g.note, g.trace_ids) for g in groups]
    assert [r.__class__ is BlockRow for r in got] == [True] * 5 + [False] * 2 + [True] * 7
    for suffix in ("jsonl", "csv", "parquet"):
        write_rows(got, tmp_path / f"got.{suffix}", topo)
        write_rows(want, tmp_path / f"want.{suffix}", topo)
        assert (tmp_path / f"got.{suffix}").read_bytes() == (tmp_path / f"want.{suffix}").read_bytes(), suffix
    assert all(_POINTS.__get__(r) is None for r in got if r.__class__ is BlockRow)  # written from the columns
    assert read_rows(tmp_path / "got.jsonl") == want


# ---- the span kinds' readers over a whole block (collector/colread.py)


@st.composite
def _column_batch(draw):
    """Requests of a few layout sequences (client and taps, as the load generator and the taps send them) whose values
    differ per request: statuses, firewall decisions, labels, request ids (now and then differing between spans), token
    counts, clock offsets and uncertainties (some negative), gap statistics; sometimes a value the columns do not take
    (a zero start, a gap past int64 nanoseconds, a time past 2**62): that block is read span by span."""
    layouts = [{"client": draw(st.booleans()), "links": draw(st.sampled_from([("edge", "gw-fw", "fw-engine"), ("edge", "fw-engine"), ("fw-engine",)])),
                "tokens": draw(st.sampled_from(["both", "in", "none"])), "outcome": draw(st.sampled_from(["ok", "", "upstream_error", "timeout"])),
                "clock": draw(st.booleans()), "p99": draw(st.booleans()), "overhead": draw(st.booleans()), "decision": draw(st.booleans()),
                "label": draw(st.booleans()), "status": draw(st.booleans())} for _ in range(draw(st.integers(1, 3)))]
    n = draw(st.integers(2, 12))
    odd = draw(st.sampled_from([None, None, None, "zero_start", "huge_gap", "huge_time"]))
    rnd = random.Random(draw(st.integers(0, 2**32)))
    out = []
    for i in range(n):
        lay = layouts[i % len(layouts)]
        base = (1 << 62) + 5 if odd == "huge_time" and i == n - 1 else 1_700_000_000_000_000_000 + rnd.randrange(10**12)
        tid = rnd.randbytes(16)
        common = {Attr.REQUEST_ID: f"r{rnd.randrange(4)}"}
        if lay["status"]:
            common[Attr.HTTP_STATUS] = rnd.choice([200, 200, 404, 500, 503])
        if lay["outcome"]:
            common[Attr.OUTCOME] = lay["outcome"]
        if lay["tokens"] != "none":
            common[Attr.GENAI_INPUT_TOKENS] = rnd.randrange(1, 500)
            if lay["tokens"] == "both":
                common[Attr.GENAI_OUTPUT_TOKENS] = rnd.randrange(1, 500)
        if lay["label"]:
            common["deltatap.label.workload"] = rnd.choice(["chat", "rag"])
        spans = []
        if lay["client"]:
            ev = {ClientEvent.SEND: base, ClientEvent.FIRST_TOKEN: base + rnd.randrange(50 * MS), ClientEvent.LAST_TOKEN: base + 90 * MS,
                  ClientEvent.END: base + 91 * MS}
            spans.append(client_span(tid, ev, {**common, Attr.RUN_ID: "bench"}))
        for k, link in enumerate(lay["links"]):
            o = k * MS + rnd.randrange(MS)
            ev = {TapEvent.REQUEST_RECEIVED: base + o, TapEvent.REQUEST_FORWARDED: base + o + rnd.randrange(300_000),
                  TapEvent.FIRST_TOKEN_RECEIVED: base + 40 * MS - o, TapEvent.FIRST_TOKEN_FORWARDED: base + 40 * MS - o + rnd.randrange(90_000),
                  TapEvent.LAST_TOKEN_RECEIVED: base + 80 * MS, TapEvent.RESPONSE_END: base + 81 * MS}
            a = dict(common)
            if rnd.random() < 0.1:
                a[Attr.REQUEST_ID] = f"r{rnd.randrange(4)}"  # a tap that saw another id: the most common one wins
            a.update({Attr.GAP_COUNT: rnd.randrange(100), Attr.GAP_MEAN_MS: rnd.random() * 20, Attr.GAP_MAX_MS: rnd.random() * 90,
                      Attr.GAP_FWD_MEAN_MS: rnd.random() * 20, Attr.GAP_FWD_MAX_MS: rnd.random() * 90, Attr.CONTENT_EVENTS: rnd.randrange(100)})
            if lay["p99"]:
                a[Attr.GAP_P99_MS], a[Attr.GAP_FWD_P99_MS] = rnd.random() * 30, rnd.randrange(60) + 0.0000005  # (x.5 ns: half to even)
            if odd == "huge_gap" and i == 1:
                a[Attr.GAP_MEAN_MS] = 1e300  # (nanoseconds past int64)
            if lay["overhead"]:
                a[Attr.OVERHEAD_REQUEST_NS], a[Attr.OVERHEAD_FIRST_TOKEN_NS] = rnd.randrange(300_000), rnd.randrange(90_000)
            if lay["clock"]:
                a[Attr.CLOCK_OFFSET_NS], a[Attr.CLOCK_UNCERTAINTY_NS] = rnd.randrange(-MS, MS), rnd.randrange(-1000, 50_000)
            if lay["decision"] and link != "edge":
                a[Attr.FIREWALL_DECISION] = rnd.choice(["", "allow", "block:policy", "allow:degraded"])
            sp = tap_span(tid, link, ev, a)
            if odd == "zero_start" and i == 0:
                sp.start_time_unix_nano = 0
            spans.append(sp)
        out.append(request(spans, service="deltatap-tap").SerializeToString())
    return out, odd


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(_column_batch())
def test_blocks_read_as_columns_equal_per_row_rows(batch):
    wires, odd = batch
    topo = default_topology()
    groups = [_group(decode_compact(w)) for w in wires]
    got = _check(Decomposer(topo), Decomposer(topo), groups)
    seqs = [tuple(s.layout for s in g.spans) for g in groups]
    if odd is None:  # every layout sequence here met twice or more takes the columns
        assert all(r.__class__ is BlockRow and r._block.cols is not None for r, q in zip(got, seqs, strict=True) if seqs.count(q) >= 2)


def test_the_benchmarks_requests_are_read_as_columns_and_equal_the_per_row_rows():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from collector_throughput import build_exports

    topo = default_topology()
    spans = [s for w in build_exports(24, 12, with_client=True) for s in decode_compact(w)]
    groups = [_group([s for s in spans if s.trace_id == t]) for t in dict.fromkeys(s.trace_id for s in spans)]
    got = _check(Decomposer(topo), Decomposer(topo), groups, min_block=colread.MIN_BLOCK)
    assert len(got) == 24 and all(r.__class__ is BlockRow and r._block.cols is not None for r in got)
    assert len({id(r._block) for r in got}) == 1
