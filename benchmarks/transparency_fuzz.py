"""Transparency fuzz at scale (issue 15, "Transparency": ≥ 10⁵ exchanges, 0 differences other than the tap's
trace-context and correlation headers).

Runs the generator of the fast suite's fuzz (``tests/proxy/exchanges.py``, one definition; here drawn from a
seeded ``random.Random`` per exchange) for ``--count`` exchanges. Each exchange is made once directly against a
raw upstream and once through a tap (started in this process, like the tests) to an identical raw upstream
(``tests/proxy/raw_peer.py``), over ``--concurrency`` lanes, each with its own tap and upstreams. What the
upstream received (less only the ``traceparent``/``tracestate``/correlation header lines the tap adds), what the
client received and how the client's connection ended are compared byte for byte; each exchange through the tap
must also give one span with its method and final status. An exchange whose response (or its end) comes through
whole but only after the client's 1 s wait is counted apart, as late (a stall, not an alteration). ``--through
pipe`` puts a plain TCP pipe (that inserts a ``traceparent`` line) where the tap was: the harness's own
false-difference rate, which must be 0.

    .venv/bin/python benchmarks/transparency_fuzz.py                      # 100000 exchanges through the tap
    .venv/bin/python benchmarks/transparency_fuzz.py --count 2000 --through pipe

Writes benchmarks/results/transparency_fuzz.json (``--out``): counts of differences by kind, the first example of
each, what the exchanges exercised (over all and over those that differed), spans matched, timing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import resource
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "tests" / "proxy"))  # the generator and the raw peers live beside the tests using them

from exchanges import Exchange, RandomDraw, Run, compare, first_difference, generate, normalise  # noqa: E402
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult  # noqa: E402
from raw_peer import RawUpstream, raw_exchange  # noqa: E402

from deltatap.core.vocab import DEFAULT_CORRELATION_HEADER, Attr  # noqa: E402
from deltatap.net.aio import run as run_loop  # noqa: E402

TIMEOUT_S = 1.0  # the client stops waiting this long after sending (a direct exchange takes a few ms) ...
LATE_S = 4.0  # ... then reads on this long more: what completes then is a stall ("late"), not a difference


class CountingExporter(SpanExporter):
    """Keeps only (method, status) of each tap span: 10⁵ spans held whole would not fit the point."""

    def __init__(self) -> None:
        self.seen: Counter[tuple[str, int]] = Counter()

    def export(self, spans) -> SpanExportResult:
        for s in spans:
            if s.name.startswith("deltatap.tap"):
                self.seen[(s.attributes.get(Attr.HTTP_METHOD), s.attributes.get(Attr.HTTP_STATUS))] += 1
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


async def start_pipe(upstream_port: int):
    """The control: bytes both ways untouched, but a ``traceparent`` line after the first request line.
    Returns its port and a coroutine function that closes it and every connection it holds."""
    handlers: dict[asyncio.Task, asyncio.StreamWriter] = {}

    async def handle(cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        handlers[task] = cw
        try:
            ur, uw = await asyncio.open_connection("127.0.0.1", upstream_port)
        except OSError:
            cw.transport.abort()
            handlers.pop(task, None)
            return

        async def down_up() -> None:
            buf, head_done = b"", False
            while data := await cr.read(1 << 16):
                if not head_done:
                    buf += data
                    if (i := buf.find(b"\r\n")) < 0:
                        continue
                    data, head_done = buf[: i + 2] + b"traceparent: 00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\r\n" + buf[i + 2 :], True
                uw.write(data)
                await uw.drain()
            if uw.can_write_eof():
                uw.write_eof()

        async def up_down() -> None:
            while data := await ur.read(1 << 16):
                cw.write(data)
                await cw.drain()
            cw.close()

        try:
            await asyncio.gather(down_up(), up_down())
        except ConnectionError:
            cw.transport.abort()
        finally:
            uw.transport.abort()
            handlers.pop(task, None)

    server = await asyncio.start_server(handle, "127.0.0.1", 0)

    async def close() -> None:
        server.close()
        for w in list(handlers.values()):
            w.transport.abort()  # the handler's reads end, and it returns
        if handlers:
            await asyncio.wait(list(handlers), timeout=2)

    return server.sockets[0].getsockname()[1], close


class Tally:
    def __init__(self) -> None:
        self.kinds: Counter[str] = Counter()
        self.features: Counter[str] = Counter()
        self.features_differing: Counter[str] = Counter()
        self.first: dict[str, dict] = {}
        self.differing = 0
        self.done = 0
        self.harness_errors: list[str] = []
        self.expected_spans: Counter[tuple[str, int]] = Counter()
        self.late: list[dict] = []  # exchanges that matched only after TIMEOUT_S (not counted as differing)

    def add(self, index: int, ex: Exchange, direct: Run, tapped: Run, late: Run | None) -> None:
        self.done += 1
        self.features.update(ex.features)
        if (direct.upstream, direct.client, direct.end) != (ex.request, ex.response, "fin" if ex.closes else "open"):
            self.harness_errors.append(f"exchange {index}: the direct run is not as scripted ({direct.end})")
            return
        self.expected_spans[(ex.method, ex.status)] += 1
        kinds = compare(direct, tapped)
        if not kinds:
            return
        if late is not None and not compare(direct, late):  # all there, but past TIMEOUT_S: a stall
            self.late.append({"exchange": index, "features": ex.features, "on_time": kinds,
                              "bytes_on_time": len(tapped.client), "bytes": len(late.client)})
            return
        self.differing += 1
        self.features_differing.update(ex.features)
        for kind in kinds:
            self.kinds[kind] += 1
            if kind not in self.first:
                side = (direct.upstream, tapped.upstream) if kind.startswith("request") else (direct.client, tapped.client)
                self.first[kind] = {"exchange": index, "features": ex.features, "request": repr(ex.request[:400]),
                                    "response": repr(ex.response[:400]), "tapped_end": tapped.end,
                                    "first_difference": first_difference(*side)}


async def lane(k: int, args, tally: Tally, telemetry, correlation: str) -> None:
    from deltatap.proxy import TapOptions, start_tap

    direct, behind = await RawUpstream(history=False).start(), await RawUpstream(history=False).start()
    if args.through == "tap":
        tap = await start_tap(TapOptions(link="edge", upstream=behind.url, admin_port=None), telemetry)
        port, closer = tap.port, lambda: tap.close(grace_s=1)
    else:
        port, closer = await start_pipe(behind.port)

    async def one(upstream: RawUpstream, p: int, ex: Exchange, settle_s: float) -> tuple[Run, Run | None]:
        mark = upstream.expect(ex.script)
        got = await raw_exchange(p, ex.pieces, pause_s=0.001, expect=None if ex.closes else len(ex.response),
                                 settle_s=settle_s, timeout_s=TIMEOUT_S, late_s=LATE_S)
        sent = normalise(upstream.since(mark), correlation)
        late = Run(sent, got.received + got.late, got.late_end) if got.late_end else None
        return Run(sent, got.received, got.end), late

    try:
        for i in range(k, args.count, args.concurrency):
            ex = generate(RandomDraw((args.seed << 32) | i))
            try:
                direct_run, _ = await one(direct, direct.port, ex, 0.0)
                tapped_run, tapped_late = await one(behind, port, ex, 0.02)
            except (OSError, asyncio.TimeoutError) as exc:  # e.g. a connect that timed out on a saturated machine
                tally.done += 1
                tally.harness_errors.append(f"exchange {i}: {type(exc).__name__}: {exc}")
                continue
            tally.add(i, ex, direct_run, tapped_run, tapped_late)
    finally:
        await closer()
        await direct.close()
        await behind.close()


async def main_async(args) -> dict:
    from deltatap.telemetry.tracer import setup_telemetry

    exporter = CountingExporter()
    telemetry = setup_telemetry("deltatap-bench-fuzz", exporter=exporter)
    tally = Tally()
    started, cpu0 = time.monotonic(), time.process_time()

    async def progress() -> None:
        step = max(1, args.count // 10)
        mark = step
        while True:
            await asyncio.sleep(1)
            if tally.done >= mark:
                print(f"{tally.done}/{args.count} exchanges, {tally.differing} differ ({time.monotonic() - started:.0f} s)", flush=True)
                mark += step

    reporter = asyncio.create_task(progress())
    try:
        await asyncio.gather(*(lane(k, args, tally, telemetry, DEFAULT_CORRELATION_HEADER) for k in range(args.concurrency)))
    finally:
        reporter.cancel()
        await asyncio.get_running_loop().run_in_executor(None, telemetry.processor.force_flush, 30_000)
        telemetry.shutdown()
    wall, cpu = time.monotonic() - started, time.process_time() - cpu0
    spans = {}
    if args.through == "tap":
        missing, extra = tally.expected_spans - exporter.seen, exporter.seen - tally.expected_spans
        spans = {"expected": sum(tally.expected_spans.values()), "exported": sum(exporter.seen.values()),
                 "dropped_by_processor": telemetry.stats.spans_dropped,
                 "missing": {f"{m} {s}": n for (m, s), n in missing.most_common()},
                 "unexpected": {f"{m} {s}": n for (m, s), n in extra.most_common()}}
    return {
        "exchanges": tally.done,
        "through": args.through,
        "differing_exchanges": tally.differing,
        "differing_share": round(tally.differing / max(1, tally.done), 4),
        "differences_by_kind": dict(tally.kinds.most_common()),
        "late_exchanges": len(tally.late),  # identical, but the response (or its end) came after TIMEOUT_S
        "late_examples": tally.late[:20],
        "harness_errors": tally.harness_errors[:20],
        "harness_error_count": len(tally.harness_errors),
        "spans": spans,
        "features": dict(tally.features.most_common()),
        "features_of_differing": dict(tally.features_differing.most_common()),
        "first_example_by_kind": tally.first,
        "wall_s": round(wall, 1),
        "exchanges_per_s": round(tally.done / wall, 1),
        "process_cpu_s": round(cpu, 1),
        "max_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),  # harness, peers and taps together
    }


def _git(*argv: str) -> str:
    try:
        return subprocess.run(["git", *argv], cwd=ROOT, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--count", type=int, default=100_000, help="exchanges (default 100000)")
    p.add_argument("--seed", type=int, default=0, help="exchange i is drawn from seed (SEED << 32) | i (default 0)")
    p.add_argument("--concurrency", type=int, default=8, help="lanes in parallel, each with its own tap and upstreams (default 8)")
    p.add_argument("--through", choices=["tap", "pipe"], default="tap", help="tap (default) or a plain TCP pipe (harness control)")
    p.add_argument("--out", default=None, help="result JSON (default benchmarks/results/transparency_fuzz[_pipe].json)")
    args = p.parse_args()
    if args.count < 1 or args.concurrency < 1:
        p.error("--count and --concurrency must be >= 1")
    out = Path(args.out or HERE / "results" / f"transparency_fuzz{'_pipe' if args.through == 'pipe' else ''}.json")
    load_start = os.getloadavg()
    result = run_loop(main_async(args))
    result = {
        "command": "benchmarks/transparency_fuzz.py " + " ".join(sys.argv[1:]),
        "commit": _git("rev-parse", "--short", "HEAD"),
        "tap_sources_modified": bool(_git("status", "--porcelain", "--", "proxy", "deltatap/net")),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "seed": args.seed,
        "concurrency": args.concurrency,
        "load_average_at_start": load_start,
        "load_average_at_end": os.getloadavg(),
        **result,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("exchanges", "through", "differing_exchanges", "differing_share", "late_exchanges",
                                             "harness_error_count", "wall_s", "exchanges_per_s")}))
    for kind, n in list(result["differences_by_kind"].items())[:25]:
        print(f"  {n:7d}  {kind}")
    if result["spans"]:
        s = result["spans"]
        print(f"spans: {s['exported']} exported of {s['expected']} expected ({s['dropped_by_processor']} dropped); "
              f"missing {sum(s['missing'].values())}, unexpected {sum(s['unexpected'].values())}")
    print(f"wrote {out}")
    return 1 if result["harness_error_count"] else 0


if __name__ == "__main__":
    sys.exit(main())
