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

from deltatap.collector import pipeline as pipeline_mod
from deltatap.collector.batch import _DELTAS, _POINTS, BlockRow, build_rows, columns_of
from deltatap.collector.compact import decode_compact
from deltatap.collector.decompose import Decomposer
from deltatap.collector.pipeline import Pipeline, PipelineOptions
from deltatap.collector.rows import JoinMethod, delta_columns, to_record
from deltatap.collector.sinks import read_rows, write_rows
from deltatap.core.topology import default_topology
from deltatap.core.vocab import Attr, TapEvent

from otlpfactory import MS, request, tap_span
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


def _check(dec: Decomposer, ref: Decomposer, groups: list) -> list:
    got = build_rows(dec, groups)
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
