"""``deltatap selftest``: how accurate deltatap is on *this* machine, in under a minute.

1. **Against the components' own clocks** (always): the accuracy harness (:mod:`deltatap.app.accuracy`, the one
   ``benchmarks/accuracy.py`` runs) starts the reference gateway, firewall and engine with known injected delays,
   a tap on every link, each in its own process, drives load through the edge tap and collects the rows; the
   components send their own socket-stamped points to a separate sink the collector never reads. Per component
   delta: deltatap's |error| p50 / p99 against those true points (the same computation as the benchmark's,
   :func:`deltatap.app.accuracy.summarize`), the true and reported medians next to the injected delay; per tap,
   the time a request and a first token take to cross it (sender's stamp to receiver's: the tap plus two
   loopback hops), next to what the tap reported about itself.
2. **Against the wire** (where the machine allows a capture: tcpdump and root or CAP_NET_RAW): the wire referee
   (:mod:`deltatap.app.referee`) runs the chain with plain aiohttp servers (none of deltatap's code), captures
   loopback with kernel stamps and compares every delta, and every tap's overhead, with the packets.

``--json FILE`` writes every figure with the run's provenance (sign it with ``deltatap sign FILE``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from deltatap.core.config import ConfigError, check_output_dir, check_output_file

DEFAULT_REQUESTS = 120
DEFAULT_RATE = 50.0
REFEREE_REQUESTS = 80
REFEREE_RATE = 25.0
REFEREE_WARMUP = 10
CAP_NET_RAW = 13


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "selftest",
        help="measure deltatap's own error on this machine (reference stack with known delays; the wire where a capture is allowed)",
        description="Run the reference stack with known injected delays through the taps (every component and tap its own process) "
        "and print deltatap's error per delta (p50, p99) against the components' own clocks and, where this machine allows a "
        "loopback capture (tcpdump + root or CAP_NET_RAW), against the wire; and the taps' overhead. Under a minute.",
    )
    p.add_argument("--requests", type=int, default=DEFAULT_REQUESTS, help=f"requests against the reference stack (default {DEFAULT_REQUESTS}; the first 20 are a warm-up)")
    p.add_argument("--rate", type=float, default=DEFAULT_RATE, help=f"requests per second, Poisson (default {DEFAULT_RATE:g})")
    p.add_argument("--referee", choices=("auto", "on", "off"), default="auto",
                   help="the wire referee: auto runs it where a capture is allowed, on requires it, off skips it (default auto)")
    p.add_argument("--referee-requests", type=int, default=REFEREE_REQUESTS,
                   help=f"requests through the wire referee's chain (default {REFEREE_REQUESTS}; the first {REFEREE_WARMUP} are a warm-up)")
    p.add_argument("--json", dest="json_out", metavar="FILE", help="also write every figure, with the run's provenance, as JSON")
    p.add_argument("--keep", metavar="DIR", help="keep the runs' work files (logs, rows, pcap) in DIR")
    p.set_defaults(func=run_selftest)


def capture_allowed() -> tuple[bool, str]:
    """(allowed, why not) for a loopback capture by tcpdump."""
    from deltatap.app.referee.capture import tcpdump_path

    if tcpdump_path() is None:
        return False, "tcpdump is not installed (apt-get install tcpdump)"
    if os.geteuid() == 0:
        return True, ""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("CapEff:") and int(line.split()[1], 16) >> CAP_NET_RAW & 1:
                return True, ""
    except (OSError, ValueError):
        pass
    return False, "capturing needs root or CAP_NET_RAW (sudo deltatap selftest, or setcap cap_net_raw+ep on tcpdump)"


def _f(x: float | None, nd: int = 3) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


def truth_selftest(workdir: Path, requests: int, rate: float) -> dict[str, Any]:
    from deltatap.app.accuracy import INJECTED_MS, WARMUP, run_once, summarize
    from deltatap.collector.reports.columns import delta_ms
    from deltatap.collector.reports.stats import pct
    from deltatap.net.aio import run

    t0 = time.monotonic()
    r = run(run_once(True, workdir, requests=requests, rate=rate))
    s = summarize(r, requests, WARMUP)
    for name, ms in INJECTED_MS.items():
        s["deltas"][name]["injected_ms"] = ms
    kept = sorted([x for x in r.rows if x.outcome == "ok"], key=lambda x: x.start_unix_ns or 0)[WARMUP:]
    for key in s["tap_transit"]:
        link, direction = key.split(" ")
        v = delta_ms(kept, f"tap_{link}_{direction}")
        s["tap_transit"][key]["reported_p50_ms"] = pct(v, 50)
        s["tap_transit"][key]["reported_p99_ms"] = pct(v, 99)
    s["wall_s"] = time.monotonic() - t0
    return s


def referee_selftest(workdir: Path, requests: int = REFEREE_REQUESTS) -> dict[str, Any]:
    from deltatap.app.referee.chain import ChainConfig, run_chain
    from deltatap.app.referee.compare import compare, load_wire, stats, tap_delta_wire
    from deltatap.collector.sinks import read_rows

    t0 = time.monotonic()
    run = run_chain(ChainConfig(requests=requests, rate=REFEREE_RATE, gateway_delay_ms=2.0, firewall_delay_ms=3.0, max_wall_s=90.0),
                    workdir, log=lambda *_a, **_k: None)
    wire = load_wire(run.pcap, run.ports)
    rows = read_rows(run.rows_path)
    comp = compare(rows, wire, warmup=REFEREE_WARMUP)
    deltas = {name: stats(v) for name, v in comp.delta_err.items()}
    taps: dict[str, list[int]] = {}
    for row in rows:
        w = wire.by_request.get(row.request_id or "")
        if w is None or str(row.outcome) != "ok":
            continue
        for name in row.deltas:
            if name.startswith("tap_"):
                v = tap_delta_wire(w, name)
                if v is not None:
                    taps.setdefault(name, []).append(v)
    import numpy as np

    tap_wire = {k: {"count": len(v), "p50_ms": float(np.percentile(v, 50)) / 1e6, "p99_ms": float(np.percentile(v, 99)) / 1e6} for k, v in taps.items()}
    return {"rows": comp.rows_total, "compared": comp.rows_compared, "matched": comp.rows_compared - len(comp.rows_unmatched),
            "capture": run.capture_counts, "reassembly_holes": wire.stats.get("holes"), "deltas": deltas, "tap_overhead_on_wire": tap_wire,
            "wall_s": time.monotonic() - t0}


def print_truth(s: dict[str, Any]) -> None:
    print(f"\n1. Against the components' own clocks: {s['ok']}/{s['requests']} ok, {s['compared']} compared after the warm-up, "
          f"joins {s['join_methods']} ({s['wall_s']:.1f} s)")
    print(f"  {'delta':<18} {'n':>4} {'injected':>9} {'true p50':>9} {'deltatap p50':>13} {'|error| p50':>12} {'|error| p99':>12}   (ms)")
    for name, d in s["deltas"].items():
        inj = d.get("injected_ms")
        print(f"  {name:<18} {d['count']:>4} {_f(inj, 1) if inj is not None else '':>9} {_f(d['true_median_ms']):>9} "
              f"{_f(d['reported_median_ms']):>13} {_f(d['p50_ms']):>12} {_f(d['p99_ms']):>12}")
    print(f"\n  Taps: crossing each tap, sender's stamp to receiver's (the tap plus two loopback hops), and what the tap reported about itself (ms)")
    print(f"  {'link':<24} {'n':>4} {'crossing p50':>13} {'p99':>8} {'tap says p50':>13} {'p99':>8}")
    for key, d in s["tap_transit"].items():
        print(f"  {key:<24} {d['count']:>4} {_f(d['p50_ms']):>13} {_f(d['p99_ms']):>8} {_f(d.get('reported_p50_ms')):>13} {_f(d.get('reported_p99_ms')):>8}")


def print_referee(s: dict[str, Any]) -> None:
    print(f"\n2. Against the wire (tcpdump on loopback, plain aiohttp components): {s['matched']}/{s['compared']} rows matched to packets, "
          f"capture {s['capture']}, reassembly holes {s['reassembly_holes']} ({s['wall_s']:.1f} s)")
    print(f"  {'delta':<28} {'n':>4} {'|error| p50':>12} {'|error| p99':>12} {'max':>8}   (ms)")
    for name, d in s["deltas"].items():
        if d.get("n") and not name.startswith("tap_"):
            print(f"  {name:<28} {d['n']:>4} {_f(d['abs_p50_ms']):>12} {_f(d['abs_p99_ms']):>12} {_f(d['abs_max_ms']):>8}")
    print(f"\n  Taps' overhead on the wire (packet in to packet out) and deltatap's error on it (ms)")
    print(f"  {'tap delta':<28} {'n':>4} {'wire p50':>9} {'wire p99':>9} {'|error| p50':>12} {'|error| p99':>12}")
    for name, w in s["tap_overhead_on_wire"].items():
        e = s["deltas"].get(name, {})
        print(f"  {name:<28} {w['count']:>4} {_f(w['p50_ms']):>9} {_f(w['p99_ms']):>9} {_f(e.get('abs_p50_ms')):>12} {_f(e.get('abs_p99_ms')):>12}")


def _no_nan(v: Any) -> Any:
    """NaN (a figure nobody observed) as null: JSON has no NaN, and a signed result must be JSON."""
    if isinstance(v, float) and v != v:
        return None
    if isinstance(v, dict):
        return {k: _no_nan(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_no_nan(x) for x in v]
    return v


def run_selftest(args: argparse.Namespace) -> int:
    from deltatap.app.accuracy import WARMUP
    from deltatap.core.provenance import provenance

    if args.requests <= WARMUP:
        raise ConfigError(f"--requests {args.requests}: must exceed the {WARMUP} warm-up requests")
    if not 0 < args.rate <= 500:
        raise ConfigError(f"--rate {args.rate:g}: must be in (0, 500] requests per second")
    if args.referee_requests <= REFEREE_WARMUP:
        raise ConfigError(f"--referee-requests {args.referee_requests}: must exceed the referee's {REFEREE_WARMUP} warm-up requests")
    if args.json_out:
        check_output_file(args.json_out, "--json")
    if args.keep:
        check_output_dir(args.keep, "--keep")
    allowed, why = capture_allowed()
    if args.referee == "on" and not allowed:
        raise ConfigError(f"--referee on: {why}")
    t0 = time.monotonic()
    print(f"deltatap selftest: reference stack on loopback, {args.requests} requests at {args.rate:g} req/s; "
          + ("the wire referee after it" if allowed and args.referee != "off" else f"no wire referee ({'--referee off' if args.referee == 'off' else why})"),
          flush=True)
    result: dict[str, Any] = {"kind": "deltatap.selftest", "provenance": provenance(tool="selftest")}
    with tempfile.TemporaryDirectory(prefix="deltatap-selftest-") as tmp:
        base = Path(args.keep) if args.keep else Path(tmp)
        try:
            result["truth"] = truth_selftest(base / "truth", args.requests, args.rate)
        except (RuntimeError, TimeoutError, OSError) as exc:
            print(f"deltatap selftest: the reference stack did not run: {exc} (logs: {base / 'truth'}/proc*.log with --keep)", file=sys.stderr)
            return 1
        print_truth(result["truth"])
        if allowed and args.referee != "off":
            from deltatap.app.referee.capture import CaptureError
            from deltatap.app.referee.chain import ChainError

            try:
                result["wire"] = referee_selftest(base / "wire", args.referee_requests)
                print_referee(result["wire"])
            except (ChainError, CaptureError, OSError) as exc:
                print(f"\n2. Against the wire: not run: {exc}", file=sys.stderr)
                result["wire"] = {"error": str(exc)}
                if args.referee == "on":
                    return 1
        else:
            result["wire"] = {"skipped": "--referee off" if args.referee == "off" else why}
    result["wall_s"] = time.monotonic() - t0
    print(f"\nselftest took {result['wall_s']:.1f} s. The same figures at scale: benchmarks/accuracy.py and benchmarks/wire_referee.py (docs/benchmarks.md).")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(_no_nan(result), indent=2, default=str, allow_nan=False) + "\n", encoding="utf-8")
        print(f"wrote {args.json_out} (sign it: deltatap sign {args.json_out})")
    return 0
