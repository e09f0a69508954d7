"""Joins (trace id, correlation, fingerprint, ambiguity), bounded assembly (eviction, late spans), sketch merges."""

from __future__ import annotations

import numpy as np

from deltatap.collector.assembly import TraceAssembler
from deltatap.collector.pipeline import Pipeline, PipelineOptions
from deltatap.collector.rows import JoinMethod
from deltatap.collector.sketches import Aggregator
from deltatap.collector.spans import decode_request

from otlpfactory import BASE, MS, default_stack, request


def spans_of(pb_spans):
    return decode_request(request(pb_spans))


def run(pipe: Pipeline, batches, now: float = 0.0):
    for b in batches:
        pipe.ingest(spans_of(b), now)
    rows = pipe.tick(now + 1000)
    rows += pipe.tick(now + 2000)
    return rows


def test_one_trace_per_request_joins_by_trace_id():
    pipe = Pipeline()
    rows = run(pipe, [default_stack(BASE + i * 10**9, rid=f"r{i}")[0] for i in range(5)])
    assert len(rows) == 5 and {r.join_method for r in rows} == {JoinMethod.TRACE_ID}
    assert all(len(r.trace_ids) == 1 and "residual" in r.deltas for r in rows)


def test_stripped_traceparent_joins_by_correlation_header():
    pipe = Pipeline()
    spans, t = default_stack(split_at="fw-engine", rid="keep-me")
    rows = run(pipe, [spans])
    assert len(rows) == 1
    r = rows[0]
    assert r.join_method == JoinMethod.CORRELATION and len(r.trace_ids) == 2
    assert r.deltas["engine_ttft"].ns == 50 * MS and "residual" in r.deltas


def test_stripped_headers_join_by_body_fingerprint_within_window():
    pipe = Pipeline()
    batches = []
    for i in range(4):
        spans, _ = default_stack(BASE + i * 10**9, rid=f"outer{i}", fp=f"fp{i}", split_at="gw-fw", inner_rid=f"inner{i}")
        batches.append(spans)
    rows = run(pipe, batches)
    assert len(rows) == 4
    assert {r.join_method for r in rows} == {JoinMethod.FINGERPRINT}
    for r in rows:
        assert len(r.trace_ids) == 2 and "gateway_inbound" in r.deltas and "engine_ttft" in r.deltas
    assert pipe.snapshot()["ambiguous"] == 0


def test_ambiguous_fingerprints_are_reported_not_guessed():
    pipe = Pipeline()
    # two requests with the same body 0.1 s apart, both split behind the gateway with fresh ids
    a, _ = default_stack(BASE, rid="oa", fp="same", split_at="gw-fw", inner_rid="ia")
    b, _ = default_stack(BASE + 100 * MS, rid="ob", fp="same", split_at="gw-fw", inner_rid="ib")
    rows = run(pipe, [a, b])
    assert len(rows) == 4  # nothing joined
    assert all(r.join_method == JoinMethod.UNJOINED for r in rows)
    assert all("ambiguous" in r.join_note for r in rows)
    assert pipe.snapshot()["ambiguous"] == 4
    # outside the window the same body is no longer ambiguous
    pipe2 = Pipeline(options=PipelineOptions(join_window_s=0.05))
    rows2 = run(pipe2, [a, b])
    assert sorted(r.join_method for r in rows2) == [JoinMethod.FINGERPRINT] * 2


def test_traces_close_after_grace_and_late_spans_are_counted():
    asm = TraceAssembler(grace_s=2.0, orphan_wait_s=10.0)
    spans = spans_of(default_stack()[0])
    client, taps = spans[0], spans[1:]
    asm.add(taps, now=0.0)  # children first: no root yet
    assert asm.poll(5.0) == [] and asm.open_traces == 1
    asm.add([client], now=6.0)  # root arrives
    assert asm.poll(7.9) == []
    frags = asm.poll(8.0)
    assert len(frags) == 1 and len(frags[0].spans) == 4
    asm.add([taps[0]], now=9.0)  # a straggler for the closed trace
    assert asm.stats.late_spans == 1 and asm.open_traces == 0
    # a trace whose root never comes closes after orphan_wait
    orphan = spans_of(default_stack(rid="o")[0])[1:]
    asm.add(orphan, now=20.0)
    assert asm.poll(29.9) == [] and len(asm.poll(30.0)) == 1


def test_open_traces_are_capped_and_evictions_counted():
    asm = TraceAssembler(max_open=10)
    evicted = []
    for i in range(25):
        evicted += asm.add(spans_of(default_stack(BASE + i, rid=f"r{i}")[0][:1]), now=float(i))
    assert asm.open_traces == 10 and asm.stats.traces_evicted == 15 and len(evicted) == 15
    assert all(f.evicted for f in evicted)
    pipe = Pipeline(options=PipelineOptions(max_open_traces=3))
    for i in range(5):
        pipe.ingest(spans_of(default_stack(BASE + i * 10**9, rid=f"r{i}")[0]), 0.0)
    rows = pipe.tick(100.0) + pipe.flush()
    assert len(rows) == 5 and pipe.snapshot()["traces_evicted"] == 2


def test_merged_sketches_equal_one_collector():
    rng = np.random.default_rng(7)
    pipes = [Pipeline(), Pipeline(), Pipeline()]
    whole = Pipeline()
    for i in range(300):
        over = {"t7": BASE + i * 10**9 + int(rng.integers(20, 400)) * MS}
        spans, _ = default_stack(BASE + i * 10**9, rid=f"r{i}", **over)
        pipes[i % 2].ingest(spans_of(spans), 0.0)  # trace-id routing: each request to one collector
        whole.ingest(spans_of(spans), 0.0)
    for p in pipes + [whole]:
        p.flush()
    merged = Aggregator.from_dict(pipes[0].aggregator.to_dict())  # through the file format
    merged.merge(Aggregator.from_dict(pipes[1].aggregator.to_dict()))
    merged.merge(pipes[2].aggregator)  # empty
    assert merged.summaries() == whole.aggregator.summaries()
    assert merged.summary("engine_ttft")["count"] == 300
    # beyond the exact cap, quantiles come from the sketch and still merge to the same answer
    big_a, big_b, big = Aggregator(), Aggregator(), Aggregator()
    from deltatap.collector.sketches import DeltaSketch

    vals = rng.integers(1, 10**9, 120_000)
    for agg, part in ((big_a, vals[:70_000]), (big_b, vals[70_000:]), (big, vals)):
        agg.deltas["x"] = DeltaSketch(agg.alpha)
        agg.deltas["x"].add_many(part, np.zeros(1, np.int64))
    big_a.merge(big_b)
    assert big_a.summary("x") == big.summary("x")
    assert big.deltas["x"].values() is None
    exact = np.quantile(vals, 0.99) / 1e6
    assert abs(big.summary("x")["p99_ms"] - exact) <= 0.01 * exact


def test_the_joiner_reads_compact_spans_as_the_decomposer_does():
    """The joiner's own reader of a compact span's start, request id and fingerprint (``Layout.start_and``) gives
    what ``Decomposer.join_facts`` reads from all the span's values: with and without a request id or fingerprint,
    split traces, component and vLLM spans."""
    from deltatap.collector.compact import CompactSpan, decode_compact
    from deltatap.collector.join import Joiner

    from deltatap.core.vocab import Role
    from otlpfactory import component_span, new_trace_id, vllm_span

    pb = []
    for i, kw in enumerate(({}, {"rid": "", "fp": ""}, {"split_at": "gw-fw"}, {"rid": "", "split_at": "fw-engine"}, {"fp": ""})):
        pb += default_stack(BASE + i * 10 * MS, **{"rid": f"req-{i}", "fp": f"fp-{i}", **kw})[0]
    tid = new_trace_id()
    pb += [component_span(tid, "gateway", "gateway", {Role.IN_ARRIVE: BASE, Role.IN_EXIT: BASE + MS}), vllm_span(tid, BASE, 0.001, 0.02, 0.01, 0.05)]
    spans = decode_compact(request(pb).SerializeToString())
    assert spans and all(s.__class__ is CompactSpan for s in spans)
    pipe = Pipeline()
    joiner = Joiner(pipe.topo, decomposer=pipe.decomposer)
    got = [joiner._facts(s) for s in spans + spans]  # (the second time from the layout cache)
    want = [pipe.decomposer.join_facts(s) for s in spans + spans]
    assert got == want
    assert any(v is not False for v in joiner._by_layout.values())  # the layouts' own readers were used
    assert ("req-0", "fp-0") in {(f[2], f[3]) for f in got}
