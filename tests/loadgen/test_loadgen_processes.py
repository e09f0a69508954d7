"""``--processes N``: one seeded schedule split over N processes (request i to process i mod N) from one shared
start, the records merged: the same request ids, order and totals as one process sending it all."""

from __future__ import annotations

from deltatap.loadgen import LoadOptions, run_load


def opts(url: str, **kw) -> LoadOptions:
    base = dict(target=url, progress=False, gpu=False, workload="synthetic-uniform", seed=5, run_id="proc")
    base.update(kw)
    return LoadOptions(**base)


async def test_two_processes_send_the_one_process_schedule(sse_server, telemetry):
    state, url = sse_server
    state.first_ms, state.interval_ms, state.tokens = 2.0, 1.0, 3
    one = await run_load(opts(url, rate=100, requests=30), telemetry)
    seen_one = len(state.seen)
    two = await run_load(opts(url, rate=100, requests=30, processes=2), telemetry)
    assert two.summary["run"]["processes"] == 2
    for res in (one, two):
        assert res.summary["requests_total"] == 30 and res.summary["status_counts"] == {"ok": 30}
    ids1 = [(r["index"], r["request_id"]) for r in one.records]
    ids2 = [(r["index"], r["request_id"]) for r in two.records]
    assert ids2 == ids1  # same ids, in the same (planned) order
    # the same absolute timeline: planned offsets from the first planned send are the single process's
    off1 = [r["planned_send_unix_ns"] - one.records[0]["planned_send_unix_ns"] for r in one.records]
    off2 = [r["planned_send_unix_ns"] - two.records[0]["planned_send_unix_ns"] for r in two.records]
    assert off2 == off1
    # every request reached the server once, and its spans' trace ids are distinct
    second = [s.request_id for s in state.seen[seen_one:]]
    assert sorted(second) == sorted(r["request_id"] for r in two.records)
    assert len({r["trace_id"] for r in two.records}) == 30
    assert sum(r["output_tokens"] for r in two.records) == sum(r["output_tokens"] for r in one.records)


async def test_closed_loop_over_two_processes_keeps_the_total_in_flight(sse_server, telemetry):
    state, url = sse_server
    state.first_ms, state.interval_ms, state.tokens = 5.0, 2.0, 3
    res = await run_load(opts(url, concurrency=4, requests=24, processes=2), telemetry)
    assert res.summary["status_counts"] == {"ok": 24}
    assert sorted(int(r["request_id"].rsplit("m", 1)[1]) for r in res.records) == list(range(1, 25))
    assert state.max_in_flight <= 4 and res.summary["max_in_flight_observed"] <= 4


def test_processes_refuse_batches_and_too_little_concurrency():
    import pytest
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="a --batch barrier cannot span processes"):
        opts("http://127.0.0.1:1", batch=4, processes=2)
    with pytest.raises(ValidationError, match="needs --concurrency >= 3"):
        opts("http://127.0.0.1:1", concurrency=2, processes=3)


async def test_every_process_exports_its_client_spans(sse_server, tmp_path):
    import base64
    import json

    from deltatap.core.vocab import SPAN_CLIENT, Attr, ClientEvent
    from deltatap.telemetry.tracer import setup_telemetry

    state, url = sse_server
    state.first_ms, state.interval_ms, state.tokens = 2.0, 1.0, 2
    path = tmp_path / "spans.jsonl"
    tel = setup_telemetry("deltatap-loadgen", otlp=f"file:{path}")
    try:
        res = await run_load(opts(url, rate=100, requests=20, processes=2), tel, otlp=f"file:{path}")
    finally:
        tel.shutdown()
    assert res.summary["run"]["spans"]["ended"] == 20
    spans = [sp for line in path.read_text().splitlines() for rs in json.loads(line)["resourceSpans"]
             for ss in rs["scopeSpans"] for sp in ss["spans"] if sp["name"] == SPAN_CLIENT]
    ids = sorted(a["value"]["stringValue"] for sp in spans for a in sp["attributes"] if a["key"] == Attr.REQUEST_ID)
    assert ids == sorted(r["request_id"] for r in res.records)
    by_id = {r["trace_id"]: r for r in res.records}
    for sp in spans:  # the span names the record's trace and carries its t0 and t12 at the record's instants
        rec = by_id[base64.b64decode(sp["traceId"]).hex()]
        events = {e["name"]: int(e["timeUnixNano"]) for e in sp["events"]}
        assert events[ClientEvent.SEND.value] == rec["request_written_unix_ns"]
        assert events[ClientEvent.FIRST_TOKEN.value] == rec["first_token_unix_ns"]


async def test_the_send_phase_collection_runs_before_the_shared_start_is_set(sse_server, telemetry):
    # The full collection that opens a send phase (send_phase_gc) takes tens to hundreds of ms of CPU with a large plan.
    # Run after the start instant was sent to the other processes, it made this process start late by that much (0.16 s
    # behind the others under a 0.3-core cap, docs/benchmarks.md session 22). Every full collection here must come
    # before the instant was set (PROCESS_START_IN_NS before it): none between then and the start (the collector is
    # off from before the instant is set until this process has sent its share: no automatic one falls there either).
    import gc

    from deltatap.core.clock import mono_ns, to_unix_ns
    from deltatap.loadgen.run import PROCESS_START_IN_NS

    state, url = sse_server
    state.first_ms, state.interval_ms, state.tokens = 1.0, 1.0, 2
    full: list[int] = []

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start" and info["generation"] == 2:
            full.append(to_unix_ns(mono_ns()))

    gc.callbacks.append(on_gc)
    try:
        res = await run_load(opts(url, rate=200, requests=10, processes=2), telemetry)
    finally:
        gc.callbacks.remove(on_gc)
    assert res.summary["status_counts"] == {"ok": 10}
    start = res.records[0]["planned_send_unix_ns"]  # (the first planned offset is 0: the shared start itself)
    assert full, "the send phase made no full collection"
    assert [t for t in full if start - PROCESS_START_IN_NS <= t <= start] == []
