"""Collector throughput and memory: spans/s ingested and joined over OTLP/gRPC on one core, and RSS with 100k open traces.

    .venv/bin/python benchmarks/collector_throughput.py [--requests 40000] [--open-traces 100000] [--compare-native 2]

The collector (``deltatap.collector.start_collector``) runs in a child process pinned to one CPU; the parent,
pinned to another, pre-builds realistic exports (a client span and three tap spans per request, with
the attributes and events deltatap's taps and load generator emit, numbers such as overheads, gap
statistics, sizes and token counts differing per request and per tap, 50 requests per export) and sends
them over OTLP/gRPC with 4 calls in flight. Measured: time from the first export until every span
was received (ingest rate) and until every request was joined and decomposed into a row (joined
rate, including the assembly grace of 0.2 s), and the collector process's CPU time until then (spans per
CPU second: the figure other work on a shared machine distorts least). The child tunes the garbage collector as
``deltatap collect`` does (``deltatap.collector.service.tune_gc``). Memory: a fresh child receives the spans of 100k
requests whose client (root) span never arrives, so all 100k traces stay open; RSS is read from
/proc before and after. Writes benchmarks/results/collector_throughput.json.

``--compare-native N`` runs the throughput phase 2N times, alternating a collector with the C accelerators turned
off (``DELTATAP_NATIVE=0``: the pure-Python references) and on, and reports both (each run and the medians); the
memory phase runs with them on (as ``deltatap collect`` does where they are built).

``--rows-ab N`` compares, in-process, the rows stage with rows held as columns per block (``collector/batch.py``) and
built one by one (``Decomposer.build_row``, the way before), alternating tick-sized chunks of N requests (3 rounds),
with ``DELTATAP_NATIVE=0`` and with the accelerators.

``--stages N`` instead measures where the CPU goes, in-process and without gRPC: N requests' exports decoded,
assembled, joined and turned into rows (ticks as at 60k spans/s every 50 ms), the CPU time of each stage per span,
in one child process with ``DELTATAP_NATIVE=0`` and one with the accelerators.

``--base DIR`` (with ``--stages`` or ``--compare-native``): every measuring child runs twice, alternating, once with this
checkout's collector and once with the source tree ``DIR``'s (another checkout with its C built, e.g. the commit
before a change; its packages are imported in place of the installed ones): before and after in one run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
_TREE_ENV = "DELTATAP_BENCH_TREE"  # (--base: the source tree a measuring child imports deltatap from)


class _TreeFinder:
    """Imports deltatap's packages from another source tree (its folders as the distribution installs them)."""

    def __init__(self, tree: str) -> None:
        t = Path(tree)
        self.map = {"deltatap": t / "deltatap", **{f"deltatap.{p}": t / p for p in ("collector", "configs", "loadgen", "proxy", "stack")}}

    def find_spec(self, fullname: str, path=None, target=None):
        import importlib.util

        folder = self.map.get(fullname)
        if folder is None:
            return None
        return importlib.util.spec_from_file_location(fullname, folder / "__init__.py", submodule_search_locations=[str(folder)])


if os.environ.get(_TREE_ENV):
    sys.meta_path.insert(0, _TreeFinder(os.environ[_TREE_ENV]))

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest  # noqa: E402
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue  # noqa: E402
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span  # noqa: E402

from deltatap.core.vocab import DEFAULT_LINKS, Attr, ClientEvent, TapEvent, tap_span_name  # noqa: E402

MS = 1_000_000
TARGET_SPANS_PER_S = 60_000  # issue 16 (was 30k, met at 30.2k)
KINDS = {"client": "client", "gateway": "gateway", "firewall": "firewall", "engine": "engine"}


def _kv(k, v):
    if isinstance(v, bool):
        return KeyValue(key=k, value=AnyValue(bool_value=v))
    if isinstance(v, int):
        return KeyValue(key=k, value=AnyValue(int_value=v))
    if isinstance(v, float):
        return KeyValue(key=k, value=AnyValue(double_value=v))
    return KeyValue(key=k, value=AnyValue(string_value=str(v)))


def request_spans(i: int, base: int, with_client: bool = True) -> list[Span]:
    tid = os.urandom(16)
    rid = f"req-{i:08d}"
    t0 = base + i * 2 * MS
    spans = []
    root = os.urandom(8)
    if with_client:
        cs = Span(trace_id=tid, span_id=root, name="deltatap.client", start_time_unix_nano=t0, end_time_unix_nano=t0 + 200 * MS, kind=Span.SPAN_KIND_CLIENT)
        cs.attributes.extend(_kv(k, v) for k, v in {Attr.OBSERVER: "client", Attr.REQUEST_ID: rid, Attr.RUN_ID: "bench", Attr.HTTP_STATUS: 200, Attr.OUTCOME: "ok",
                                                    Attr.GENAI_REQUEST_MODEL: "m", Attr.GENAI_INPUT_TOKENS: 150 + i % 101, Attr.GENAI_OUTPUT_TOKENS: 60 + i % 83, "deltatap.label.workload": "chat"}.items())
        for ev, dt in ((ClientEvent.SEND, 0), (ClientEvent.FIRST_TOKEN, 67), (ClientEvent.LAST_TOKEN, 190), (ClientEvent.END, 191)):
            cs.events.add(name=ev.value, time_unix_nano=t0 + dt * MS)
        spans.append(cs)
    parent = root
    offs = {"edge": 1, "gw-fw": 3, "fw-engine": 9}
    for n, link in enumerate(DEFAULT_LINKS):
        sid = os.urandom(8)
        o = offs[link.name]
        v = 3 * i + n  # per-request, per-tap numbers (overheads, gap statistics, sizes) differ, as live ones do
        sp = Span(trace_id=tid, span_id=sid, parent_span_id=parent, name=tap_span_name(link.name), start_time_unix_nano=t0 + o * MS, end_time_unix_nano=t0 + 180 * MS, kind=Span.SPAN_KIND_SERVER)
        attrs = {Attr.OBSERVER: "tap", Attr.LINK: link.name, Attr.DOWNSTREAM: link.downstream, Attr.DOWNSTREAM_KIND: KINDS[link.downstream], Attr.UPSTREAM: link.upstream,
                 Attr.UPSTREAM_KIND: KINDS[link.upstream], Attr.REQUEST_ID: rid, Attr.CORRELATION_HEADER: "x-request-id", Attr.BODY_FINGERPRINT: f"fp{i:012x}",
                 Attr.BODY_BYTES_IN: 900 + v % 700, Attr.BODY_BYTES_OUT: 6000 + 37 * v % 5000, Attr.CHUNKS: 60 + v % 83, Attr.STREAMING: True, Attr.OUTCOME: "ok", Attr.HTTP_METHOD: "POST",
                 Attr.URL_PATH: "/v1/chat/completions", Attr.SERVER_ADDRESS: "127.0.0.1", Attr.SERVER_PORT: 8100, Attr.HTTP_STATUS: 200,
                 Attr.OVERHEAD_REQUEST_NS: 90_000 + 7919 * v % 120_000, Attr.OVERHEAD_FIRST_TOKEN_NS: 40_000 + 104_729 * v % 60_000, Attr.STREAM_FORMAT: "openai-chat",
                 Attr.EVENTS: 62 + v % 83, Attr.CONTENT_EVENTS: 60 + v % 83, Attr.GAP_COUNT: 59 + v % 83, Attr.GAP_MEAN_MS: 8 + v % 997 / 331, Attr.GAP_MAX_MS: 14 + v % 991 / 97,
                 Attr.GAP_P99_MS: 12 + v % 983 / 113, Attr.GAP_FWD_MEAN_MS: 8.01 + v % 997 / 331, Attr.GAP_FWD_MAX_MS: 14.1 + v % 991 / 97, Attr.GAP_FWD_P99_MS: 12.1 + v % 983 / 113,
                 Attr.GENAI_OPERATION: "chat", Attr.GENAI_SYSTEM: "openai", Attr.GENAI_REQUEST_MODEL: "m", Attr.GENAI_RESPONSE_MODEL: "m",
                 Attr.GENAI_INPUT_TOKENS: 150 + i % 101, Attr.GENAI_OUTPUT_TOKENS: 60 + i % 83, Attr.GENAI_FINISH_REASONS: "stop"}
        sp.attributes.extend(_kv(k, v) for k, v in attrs.items())
        ev_times = {TapEvent.REQUEST_RECEIVED: o, TapEvent.REQUEST_BODY_RECEIVED: o, TapEvent.REQUEST_FORWARDED: o + 0.15, TapEvent.RESPONSE_HEADERS: 40 - o,
                    TapEvent.RESPONSE_HEADERS_FORWARDED: 40.1 - o, TapEvent.FIRST_TOKEN_RECEIVED: 66 - o / 2, TapEvent.FIRST_TOKEN_FORWARDED: 66.06 - o / 2,
                    TapEvent.LAST_TOKEN_RECEIVED: 170 - o / 2, TapEvent.LAST_TOKEN_FORWARDED: 170.05 - o / 2, TapEvent.RESPONSE_END: 171 - o / 2}
        for ev, dt in ev_times.items():
            sp.events.add(name=ev.value, time_unix_nano=t0 + round(dt * MS))
        spans.append(sp)
        parent = sid
    return spans


def build_exports(n_requests: int, per_export: int, with_client: bool) -> list[bytes]:
    base = time.time_ns()
    out = []
    for start in range(0, n_requests, per_export):
        rs = ResourceSpans()
        rs.resource.attributes.append(_kv("service.name", "bench"))
        ss = ScopeSpans()
        for i in range(start, min(n_requests, start + per_export)):
            ss.spans.extend(request_spans(i, base, with_client))
        rs.scope_spans.append(ss)
        out.append(ExportTraceServiceRequest(resource_spans=[rs]).SerializeToString())
    return out


def rss_bytes() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


# ---------------------------------------------------------------------------------------------- child


def child(conn, cpu: int, max_open: int, orphan_wait_s: float) -> None:
    try:
        os.sched_setaffinity(0, {cpu})
    except (AttributeError, OSError):
        pass
    import uvloop

    from deltatap.collector import CollectorOptions, PipelineOptions, start_collector
    from deltatap.collector.service import tune_gc

    tune_gc()  # as `deltatap collect` does

    async def main():
        rc = await start_collector(CollectorOptions(otlp_grpc="127.0.0.1:0", otlp_http=None, tick_s=0.05,
                                                    pipeline=PipelineOptions(grace_s=0.2, join_hold_s=0.2, orphan_wait_s=orphan_wait_s, max_open_traces=max_open, keep_rows=0)))
        from deltatap.core import native

        import deltatap.collector

        conn.send({"endpoint": rc.otlp_grpc_endpoint, "rss": rss_bytes(), "cpu": time.process_time(), "native": native.status(),
                   "tree": str(Path(deltatap.collector.__file__).parents[1])})
        while True:
            if conn.poll():
                cmd = conn.recv()
                if cmd == "stop":
                    break
            s = rc.stats()
            conn.send({"t": time.monotonic(), "spans": s["spans_received"], "rows": s["rows"], "open": s["open_traces"], "rss": rss_bytes(), "evicted": s["traces_evicted"], "joined": s["joined"],
                       "cpu": time.process_time()})
            await asyncio.sleep(0.1)
        await rc.close()

    uvloop.run(main())


async def send_all(endpoint: str, exports: list[bytes], inflight: int = 4) -> None:
    import grpc

    ch = grpc.aio.insecure_channel(endpoint[len("grpc://") :], options=[("grpc.max_send_message_length", 64 * 1024 * 1024)])
    call = ch.unary_unary("/opentelemetry.proto.collector.trace.v1.TraceService/Export", request_serializer=lambda b: b, response_deserializer=lambda b: b)
    queue = list(reversed(exports))

    async def worker():
        while queue:
            await call(queue.pop(), timeout=60)

    await asyncio.gather(*(worker() for _ in range(inflight)))
    await ch.close()


def _spawn(target, args: tuple, native: str | None = None, tree: str | None = None):
    """A spawned child (native: its DELTATAP_NATIVE, None: this process's; tree: the source tree it imports deltatap
    from, None: the installed one) and the parent's end of its pipe."""
    ctx = mp.get_context("spawn")
    parent_conn, child_conn = ctx.Pipe()
    proc = ctx.Process(target=target, args=(child_conn, *args), daemon=True)
    saved = {k: os.environ.get(k) for k in ("DELTATAP_NATIVE", _TREE_ENV)}
    for k, v in (("DELTATAP_NATIVE", native), (_TREE_ENV, tree)):
        if v is not None:
            os.environ[k] = v  # the spawned child reads them at import
    try:
        proc.start()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return proc, parent_conn


def run_phase(exports: list[bytes], spans_total: int, rows_total: int, max_open: int, orphan_wait_s: float, timeout_s: float,
              native: str | None = None, tree: str | None = None) -> dict:
    """One collector child (native: its DELTATAP_NATIVE, None: this process's; tree: see :func:`_spawn`) receiving ``exports``."""
    proc, parent_conn = _spawn(child, (0, max_open, orphan_wait_s), native, tree)
    hello = parent_conn.recv()
    try:
        os.sched_setaffinity(0, {1 % (os.cpu_count() or 1)})
    except (AttributeError, OSError):
        pass
    t_start = time.monotonic()
    import threading

    sender = threading.Thread(target=lambda: asyncio.run(send_all(hello["endpoint"], exports)), daemon=True)
    sender.start()
    t_spans = t_rows = cpu_rows = None
    last = {}
    deadline = t_start + timeout_s
    done = False
    while time.monotonic() < deadline and not done:
        if not parent_conn.poll(0.5):
            continue
        while parent_conn.poll():  # drain: a full pipe would block the collector's loop
            last = parent_conn.recv()
            if t_spans is None and last["spans"] >= spans_total:
                t_spans = last["t"]
            if rows_total and last["rows"] >= rows_total:
                t_rows, cpu_rows = last["t"], last["cpu"] - hello["cpu"]
                done = True
                break
            if rows_total == 0 and last["spans"] >= spans_total:
                done = True
                break
    if rows_total == 0 and done:
        time.sleep(1.0)  # let the allocator settle, then take the latest reading
        while parent_conn.poll():
            last = parent_conn.recv()
    sender.join(timeout=60)
    parent_conn.send("stop")
    proc.join(timeout=30)
    if proc.is_alive():
        proc.kill()
    return {"t_start": t_start, "t_spans": t_spans, "t_rows": t_rows, "cpu_rows": cpu_rows, "last": last, "rss_start": hello["rss"], "native": hello["native"],
            "tree": hello["tree"]}


def throughput(r: dict, requests: int, spans: int) -> dict:
    ingest_s = (r["t_spans"] - r["t_start"]) if r["t_spans"] else None
    joined_s = (r["t_rows"] - r["t_start"]) if r["t_rows"] else None
    return {
        "requests": requests, "spans": spans, "spans_per_export": 200,
        "ingest_s": ingest_s, "ingest_spans_per_s": spans / ingest_s if ingest_s else None,
        "joined_s": joined_s, "joined_spans_per_s": spans / joined_s if joined_s else None,
        "rows": r["last"].get("rows"), "joined": r["last"].get("joined"), "evicted": r["last"].get("evicted"),
        # the collector's own CPU time until every row was out: what other work on a shared machine distorts least
        "collector_cpu_s": r["cpu_rows"], "joined_spans_per_cpu_s": spans / r["cpu_rows"] if r["cpu_rows"] else None,
        "accelerators": r["native"], "tree": r["tree"],
    }


def stages(n_requests: int) -> dict:
    """CPU µs per span of each stage (decode, assemble, join, rows), in this process (see --stages)."""
    from deltatap.collector.compact import decode_compact
    from deltatap.collector.pipeline import Pipeline, PipelineOptions
    from deltatap.collector.service import tune_gc
    from deltatap.core import native

    exports = build_exports(n_requests, 50, with_client=True)
    tune_gc()
    p = Pipeline(options=PipelineOptions(grace_s=0.2, join_hold_s=0.2, orphan_wait_s=10.0, keep_rows=0))
    cpu = {"decode": 0.0, "assemble": 0.0, "join": 0.0, "rows": 0.0}
    clock = time.process_time
    now, rows = 0.0, 0

    def join(frags: list, t: float) -> None:
        for f in frags:
            p.joiner.add(f, t)

    for i, data in enumerate(exports):
        t = clock()
        spans = decode_compact(data)
        t1 = clock()
        frags = p.assembler.add(spans, now)
        t2 = clock()
        join(frags, now)
        t3 = clock()
        cpu["decode"] += t1 - t
        cpu["assemble"] += t2 - t1
        cpu["join"] += t3 - t2
        now += len(spans) / TARGET_SPANS_PER_S
        last = i == len(exports) - 1
        if i % 15 == 14 or last:  # a tick every 50 ms at 60k spans/s (15 exports of 200 spans)
            t = clock()
            frags = p.assembler.flush(now) if last else p.assembler.poll(now)
            t1 = clock()
            join(frags, now)
            groups = p.joiner.flush() if last else p.joiner.poll(now)
            t2 = clock()
            rows += len(p._rows(groups))
            cpu["assemble"] += t1 - t
            cpu["join"] += t2 - t1
            cpu["rows"] += clock() - t2
    n_spans = n_requests * 4
    total = sum(cpu.values())
    import deltatap.collector

    return {"requests": n_requests, "rows": rows, "accelerators": native.status(), "tree": str(Path(deltatap.collector.__file__).parents[1]),
            "us_per_span": {k: v / n_spans * 1e6 for k, v in cpu.items()}, "total_us_per_span": total / n_spans * 1e6,
            "spans_per_cpu_s": n_spans / total}


def rows_ab(n_requests: int, rounds: int) -> dict:
    """CPU µs per request of the rows stage (rows, aggregates, settling) held in blocks (``collector/batch.py``) and
    built one by one (``Decomposer.build_row``, the way before), alternating tick-sized chunks in this process."""
    from deltatap.collector import pipeline as pm
    from deltatap.collector.compact import decode_compact
    from deltatap.collector.service import tune_gc
    from deltatap.core import native

    def per_row(dec, groups):
        return [dec.build_row(g.spans, g.method, g.note, g.trace_ids) for g in groups]

    tune_gc()
    batched = pm.build_rows
    ways = {"blocks": batched, "per_row": per_row}
    cpu = {w: 0.0 for w in ways}
    done = {w: 0 for w in ways}
    for _ in range(rounds):
        pipes, chunks = {}, {}
        for w in ways:  # each way its own pipeline (its own caches and aggregates), fed the same requests
            p = pipes[w] = pm.Pipeline(options=pm.PipelineOptions(grace_s=0.2, join_hold_s=0.2, orphan_wait_s=10.0, keep_rows=0))
            for data in build_exports(n_requests, 50, with_client=True):
                for f in p.assembler.add(decode_compact(data), 0.0):
                    p.joiner.add(f, 0.0)
            for f in p.assembler.flush(1.0):
                p.joiner.add(f, 1.0)
            groups = p.joiner.flush()
            chunks[w] = [groups[i:i + 750] for i in range(0, len(groups), 750)]  # 750 requests: a 50 ms tick at 60k spans/s
        for i in range(len(chunks["blocks"])):
            for w, fn in ways.items():
                pm.build_rows = fn
                try:
                    t = time.process_time()
                    pipes[w]._rows(chunks[w][i])
                    cpu[w] += time.process_time() - t
                    done[w] += len(chunks[w][i])
                finally:
                    pm.build_rows = batched
    return {"requests_per_way": done["blocks"], "accelerators": native.status(),
            "rows_us_per_request": {w: cpu[w] / done[w] * 1e6 for w in ways}}


def _rows_ab_child(conn, n_requests: int, rounds: int) -> None:
    try:
        os.sched_setaffinity(0, {0})
    except (AttributeError, OSError):
        pass
    conn.send(rows_ab(n_requests, rounds))


def _stages_child(conn, n_requests: int) -> None:
    try:
        os.sched_setaffinity(0, {0})
    except (AttributeError, OSError):
        pass
    conn.send(stages(n_requests))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=40_000)
    ap.add_argument("--open-traces", type=int, default=100_000)
    ap.add_argument("--compare-native", type=int, default=0, metavar="N",
                    help="run the throughput phase N times with DELTATAP_NATIVE=0 and N times with the accelerators, alternating")
    ap.add_argument("--stages", type=int, default=0, metavar="N",
                    help="only measure the CPU per span of each stage, in-process, on N requests (with and without the accelerators)")
    ap.add_argument("--rows-ab", type=int, default=0, metavar="N",
                    help="only compare the rows stage held in blocks with the rows built one by one, in-process, alternating "
                         "tick-sized chunks of N requests' rows (3 rounds; with and without the accelerators)")
    ap.add_argument("--base", default=None, metavar="DIR",
                    help="with --stages or --compare-native: also run every measuring child with the source tree DIR's collector, alternating")
    ap.add_argument("--rounds", type=int, default=1, help="with --stages: rounds (each tree, with and without the accelerators)")
    ap.add_argument("--out", default=None, help="results file (default benchmarks/results/collector_throughput.json, "
                                                 "collector_throughput_native.json with --compare-native)")
    args = ap.parse_args()
    if args.requests <= 0 or args.open_traces <= 0 or args.compare_native < 0:
        ap.error("--requests and --open-traces must be positive, --compare-native not negative")
    if args.stages < 0 or args.rows_ab < 0 or args.rounds < 1:
        ap.error("--stages and --rows-ab must be positive, --rounds at least 1")
    base = None
    if args.base is not None:
        base = str(Path(args.base).resolve())
        if not (Path(base) / "collector" / "pipeline.py").is_file() or not (Path(base) / "deltatap" / "__init__.py").is_file():
            ap.error(f"--base {args.base}: not a deltatap source tree (no collector/pipeline.py and deltatap/__init__.py)")
        if not (args.stages or args.compare_native):
            ap.error("--base takes --stages N or --compare-native N")
    trees = {"": None} if base is None else {"base_": base, "": None}  # (label prefix: tree)
    out_name = "collector_rows_ab.json" if args.rows_ab else "collector_stages.json" if args.stages else "collector_throughput_native.json" if args.compare_native else "collector_throughput.json"
    args.out = args.out or str(ROOT / "benchmarks" / "results" / out_name)
    if args.rows_ab:
        got = {}
        ctx = mp.get_context("spawn")
        for label, setting in (("python", "0"), ("native", "1")):
            parent_conn, child_conn = ctx.Pipe()
            os.environ["DELTATAP_NATIVE"] = setting  # read by the spawned child at import
            proc = ctx.Process(target=_rows_ab_child, args=(child_conn, args.rows_ab, 3), daemon=True)
            proc.start()
            got[label] = parent_conn.recv()
            proc.join(timeout=60)
            print(label, json.dumps(got[label]), flush=True)
        os.environ.pop("DELTATAP_NATIVE", None)
        result = {"benchmark": "collector_rows_ab", "command": "benchmarks/collector_throughput.py " + " ".join(sys.argv[1:]),
                  "machine": {"cpus": os.cpu_count(), "python": platform.python_version()}, "rows_ab": got, "load_average": os.getloadavg()}
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2))
        print(f"wrote {args.out}")
        return 0
    if args.stages:
        got: dict = {}
        for r in range(args.rounds):
            for label, setting in (("python", "0"), ("native", "1")):
                for prefix, tree in trees.items():  # alternating: a change in the machine's load hits both alike
                    proc, conn = _spawn(_stages_child, (args.stages,), setting, tree)
                    one = conn.recv()
                    proc.join(timeout=60)
                    if tree is not None and not one["tree"].startswith(tree):
                        raise SystemExit(f"--base {args.base}: its collector was not the one imported ({one['tree']})")
                    key = prefix + label + (f"_{r + 1}" if args.rounds > 1 else "")
                    got[key] = one
                    print(key, json.dumps(one), flush=True)
        result = {"benchmark": "collector_stages", "command": "benchmarks/collector_throughput.py " + " ".join(sys.argv[1:]),
                  "machine": {"cpus": os.cpu_count(), "python": platform.python_version()}, "stages": got, "load_average": os.getloadavg()}
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2))
        print(f"wrote {args.out}")
        return 0
    load_start = os.getloadavg()

    t = time.monotonic()
    exports = build_exports(args.requests, 50, with_client=True)
    spans = args.requests * 4
    print(f"built {len(exports)} exports ({spans} spans) in {time.monotonic() - t:.1f}s", flush=True)
    compare = {}
    if args.compare_native:
        runs: dict[str, list[dict]] = {p + label: [] for p in trees for label in ("python", "native")}
        for _ in range(args.compare_native):  # alternating: a change in the machine's load hits both alike
            for label, setting in (("python", "0"), ("native", "1")):
                for prefix, tree in trees.items():
                    t_ = throughput(run_phase(exports, spans, args.requests, max_open=200_000, orphan_wait_s=10.0, timeout_s=600, native=setting, tree=tree),
                                    args.requests, spans)
                    if tree is not None and not t_["tree"].startswith(tree):
                        raise SystemExit(f"--base {args.base}: its collector was not the one imported ({t_['tree']})")
                    runs[prefix + label].append(t_)
                    print(prefix + label, json.dumps(t_), flush=True)
        for label, rs in runs.items():
            per_cpu = [t_["joined_spans_per_cpu_s"] for t_ in rs if t_["joined_spans_per_cpu_s"]]
            wall = [t_["joined_spans_per_s"] for t_ in rs if t_["joined_spans_per_s"]]
            compare[label] = {"runs": rs, "median_joined_spans_per_cpu_s": statistics.median(per_cpu) if per_cpu else None,
                              "median_joined_spans_per_s": statistics.median(wall) if wall else None}
        thr = runs["native"][-1]
    else:
        thr = throughput(run_phase(exports, spans, args.requests, max_open=200_000, orphan_wait_s=10.0, timeout_s=600), args.requests, spans)
        print(json.dumps(thr), flush=True)

    t = time.monotonic()
    exports = build_exports(args.open_traces, 50, with_client=False)  # no root span: every trace stays open
    print(f"built {len(exports)} exports for {args.open_traces} open traces in {time.monotonic() - t:.1f}s", flush=True)
    m = run_phase(exports, args.open_traces * 3, 0, max_open=args.open_traces + 1000, orphan_wait_s=3600.0, timeout_s=600)
    mem = {
        "open_traces": m["last"].get("open"), "spans_held": m["last"].get("spans"), "rss_before_mb": m["rss_start"] / 2**20,
        "rss_with_open_traces_mb": m["last"].get("rss", 0) / 2**20, "evicted": m["last"].get("evicted"),
    }
    print(json.dumps(mem), flush=True)
    result = {
        "benchmark": "collector_throughput", "command": "benchmarks/collector_throughput.py " + " ".join(sys.argv[1:]),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "collector_cpu": "one core (sched_setaffinity), sender on another",
        "throughput": thr, "memory": mem, "compare_native": compare or None,
        "targets": {"spans_per_s": TARGET_SPANS_PER_S, "rss_mb_100k_open": 300},
        "met": {"throughput": bool(thr["joined_spans_per_s"] and thr["joined_spans_per_s"] >= TARGET_SPANS_PER_S),
                "throughput_per_cpu_s": bool(thr["joined_spans_per_cpu_s"] and thr["joined_spans_per_cpu_s"] >= TARGET_SPANS_PER_S),
                "memory": bool(mem["rss_with_open_traces_mb"] and mem["rss_with_open_traces_mb"] <= 300)},
        "load_average_at_start": load_start,
        "load_average_at_end": os.getloadavg(),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
