"""Wire-level referee (issue 14, item 1): every point of every row vs the packet that carried its bytes.

    sudo-less as root:  .venv/bin/python benchmarks/wire_referee.py --rate 20 --gap-ms 2
                        .venv/bin/python benchmarks/wire_referee.py --rate 20 50 --gap-ms 2 6 [--busy] [--requests 200]
                        .venv/bin/python benchmarks/wire_referee.py --engine llamacpp --rate 20

Runs ``deltatap load`` -> tap edge -> plain aiohttp gateway -> tap gw-fw -> plain aiohttp firewall ->
tap fw-engine -> engine, each its own process, the taps and the load generator exporting to
``deltatap collect``, while tcpdump captures loopback (kernel stamps, ns). The plain engine writes a
role-only chunk, the first content token as a separate write, then tokens ``--gap-ms`` apart
(``deltatap/app/referee/engines.py``); ``--engine llamacpp`` uses the llama-server that ``.ci/realstack``
installs under ~/.cache/deltatap (skipped with a message when it is absent). Every TCP stream is
reassembled; each row of rows.parquet is matched to its request on every hop by ``x-request-id`` and
each point compared with the wire (mapping: ``deltatap/app/referee/compare.py``). Per point and per delta:
|error| p50 / p99 / max, the share of requests off by more than 0.3 ms, late (row after the wire) and
early counts, and for read points how many late stamps equal a *later* packet of the same response.
Writes benchmarks/results/wire_referee_<engine>_<rate>[_gap<G>ms][_busy].json per run.

Conditions (session 25): ``--engine raw --engine-arg=--line-end=crlf`` (and ``--framing``, ``--split-ms``,
``--tokens-per-write``, ``--token-bytes``, ``--usage-in-last``, ``--json-kib``: engines.py raw-engine --help);
``--slow-reader gateway|firewall|both`` (that plain proxy reads through a small window, so the tap before it has
its downstream writes held by TCP); ``--input-tokens MIN MAX`` (large prompts: ~7.5 bytes a token). Besides the
errors, every point is checked against the interval the row states for it (``points_outside_their_interval``:
by point, late/early, stated exact or as an interval; ``points_with_an_unknown_side``: stated with a side
unknown, which claims nothing that way). ``--keep DIR`` keeps each run's capture, rows, logs and ports.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from deltatap.app.referee.chain import ChainConfig, ChainError, llama_server, run_chain  # noqa: E402
from deltatap.app.referee.capture import tcpdump_path  # noqa: E402
from deltatap.app.referee.compare import ALIASES, compare, load_wire, stats  # noqa: E402

POINT_ORDER = ["client.send", "gateway.in.arrive", "gateway.in.exit", "firewall.in.arrive", "firewall.in.exit", "engine.queue",
               "engine.first_token", "engine.last_token", "firewall.out.first_in", "firewall.out.first_out", "gateway.out.first_in",
               "gateway.out.first_out", "client.first_token_received", "firewall.out.last_in", "firewall.out.last_out",
               "gateway.out.last_in", "gateway.out.last_out", "client.last_token_received"]
DELTA_ORDER = ["gateway_inbound", "firewall_inbound", "engine_ttft", "firewall_outbound", "gateway_outbound", "system_ttft",
               "output_path_overhead", "engine_decode", "engine_ttlt", "firewall_outbound_last", "gateway_outbound_last", "system_ttlt",
               "output_path_overhead_last", "tap_edge_request", "tap_gw-fw_request", "tap_fw-engine_request", "tap_edge_first_token",
               "tap_gw-fw_first_token", "tap_fw-engine_first_token"]
READ_POINTS = {"engine.first_token", "firewall.out.first_out", "gateway.out.first_out", "client.first_token_received",
               "engine.last_token", "firewall.out.last_out", "gateway.out.last_out", "client.last_token_received",
               "gateway.in.exit", "firewall.in.exit"}


def uptime() -> dict:
    line = subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()
    return {"uptime": line, "loadavg": list(os.getloadavg())}


def deltatap_build(exe: str | None) -> dict:
    """Which deltatap code the chain ran: the executable, where its package lives, and that tree's git state."""
    from deltatap.app.referee.chain import deltatap_exe

    argv = [exe] if exe else deltatap_exe()
    py = Path(argv[0]).parent / "python" if exe else Path(sys.executable)
    where = subprocess.run([str(py), "-c", "import deltatap.proxy.server as s, pathlib; print(pathlib.Path(s.__file__).resolve().parents[1])"],
                           capture_output=True, text=True, check=False, cwd="/").stdout.strip()  # (cwd /: not the tree python -c runs from)
    git = lambda *a: subprocess.run(["git", "-C", where, *a], capture_output=True, text=True, check=False).stdout.strip()  # noqa: E731
    head = git("rev-parse", "HEAD") if where else ""
    dirty = git("status", "--porcelain", "--untracked-files=no") if head else ""
    if not head and where and (Path(where) / "COMMIT").exists():  # an exported tree (git archive) names its commit
        head = (Path(where) / "COMMIT").read_text().strip()
        dirty = ""
    return {"executable": argv[0] if exe else " ".join(argv), "source": where, "git_head": head or None,
            "uncommitted_changes": bool(dirty) if head else None}


def _ordered(d: dict, order: list[str]) -> list[str]:
    return [k for k in order if k in d] + sorted(k for k in d if k not in order)


def summarize(comp, wire, run) -> dict:
    points = {}
    for name in _ordered(comp.point_err, POINT_ORDER):
        s = stats(comp.point_err[name])
        s["t_name"] = ALIASES.get(name)
        s["kind"] = "read" if name in READ_POINTS else "write" if name != "client.send" else "write (T_submit)"
        cov = comp.point_covered.get(name, [])
        s["bounded"] = comp.point_bounded.get(name, 0)
        s["covered_share"] = sum(cov) / len(cov) if cov else None
        if name in READ_POINTS:
            s["late_over_0_1ms"] = comp.late_over_01.get(name, 0)
            s["late_equal_to_a_later_packet"] = comp.later_packet.get(name, 0)
        points[name] = s
    deltas = {name: stats(comp.delta_err[name]) for name in _ordered(comp.delta_err, DELTA_ORDER)}
    for name, d in deltas.items():
        cov = comp.delta_covered.get(name, [])
        d["bounded"] = comp.delta_bounded.get(name, 0)
        d["covered_share"] = sum(cov) / len(cov) if cov else None
    all_cov = [c for v in comp.point_covered.values() for c in v]
    matched = comp.rows_compared - len(comp.rows_unmatched)
    return {
        "rows": {"total": comp.rows_total, "not_ok": comp.rows_not_ok, "warmup_excluded": comp.rows_skipped_warmup, "compared": comp.rows_compared,
                 "matched_to_packets": matched, "not_matched": len(comp.rows_unmatched), "not_matched_ids": comp.rows_unmatched[:20],
                 "missing_hops": dict(comp.rows_missing_hops), "wire_requests_without_row": comp.wire_requests_without_row},
        "points_not_found_on_wire": dict(comp.points_not_on_wire),
        "points_without_mapping": dict(comp.points_unmapped),
        "deltas_where_collector_chose_another_pair": dict(comp.deltas_pair_changed),
        "reassembly": wire.stats, "wire_problems": dict(wire.problems),
        "capture": run.capture_counts,
        "points": points, "deltas": deltas,
        "points_covered_by_their_bounds": sum(all_cov) / len(all_cov) if all_cov else None,
        "points_bounded": sum(comp.point_bounded.values()), "points_compared": len(all_cov),
        "examples_over_0_3ms": comp.examples,
        "points_outside_their_interval": dict(comp.point_outside), "points_with_an_unknown_side": dict(comp.point_unknown),
        "points_outside_worst_ms": {k: v / 1e6 for k, v in comp.outside_worst_ns.items()}, "examples_outside_their_interval": comp.outside_examples,
    }


def _f(x, nd=3) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def print_table(label: str, s: dict) -> None:
    r = s["rows"]
    print(f"\n{label}: rows {r['total']} ({r['not_ok']} not ok, {r['warmup_excluded']} warm-up excluded), compared {r['compared']}, "
          f"matched to packets {r['matched_to_packets']}, not matched {r['not_matched']}; capture {s['capture']}; "
          f"reassembly holes {s['reassembly']['holes']}, inconsistent {s['reassembly']['inconsistent_overlaps']}")
    hdr = (f"  {'':<34} {'n':>4} {'|err| p50':>9} {'p99':>8} {'max':>8} {'>0.3ms':>7} {'late':>5} {'early':>5} {'sgn p50':>8}"
           f" {'bnd':>4} {'cover':>6}")
    print(hdr + "   (ms; late/early: counts > 0.3 ms; bnd: values stated as intervals; cover: wire time inside the value's"
          " interval; =later: late > 0.1 ms equal to a later packet)")
    for name, d in s["points"].items():
        if not d["n"]:
            continue
        tag = f"{name} ({d['t_name']})" if d.get("t_name") else name
        extra = f"  =later {d['late_equal_to_a_later_packet']}/{d['late_over_0_1ms']}" if "late_over_0_1ms" in d else ""
        print(f"  {tag:<34} {d['n']:>4} {_f(d['abs_p50_ms']):>9} {_f(d['abs_p99_ms']):>8} {_f(d['abs_max_ms']):>8} "
              f"{100 * d['share_over_0_3ms']:>6.1f}% {d['late_over_0_3ms']:>5} {d['early_over_0_3ms']:>5} {_f(d['signed_p50_ms']):>8}"
              f" {d['bounded']:>4} {_pct(d['covered_share']):>6}{extra}")
    print("  " + "-" * (len(hdr) - 2))
    for name, d in s["deltas"].items():
        if not d["n"]:
            continue
        print(f"  {name:<34} {d['n']:>4} {_f(d['abs_p50_ms']):>9} {_f(d['abs_p99_ms']):>8} {_f(d['abs_max_ms']):>8} "
              f"{100 * d['share_over_0_3ms']:>6.1f}% {d['late_over_0_3ms']:>5} {d['early_over_0_3ms']:>5} {_f(d['signed_p50_ms']):>8}"
              f" {d['bounded']:>4} {_pct(d['covered_share']):>6}")
    if s.get("points_compared"):
        print(f"  points stated as intervals: {s['points_bounded']} of {s['points_compared']}; wire time inside the value's interval: "
              f"{100 * s['points_covered_by_their_bounds']:.2f}%")
    if s.get("points_with_an_unknown_side"):
        print("  stated with an unknown side (no claim): " + ", ".join(f"{k}: {v}" for k, v in sorted(s["points_with_an_unknown_side"].items())))
    if s.get("points_outside_their_interval"):
        worst = s.get("points_outside_worst_ms", {})
        print("  outside their interval: " + ", ".join(f"{k}: {v} (worst {worst.get(k, 0):.3f} ms)" for k, v in sorted(s["points_outside_their_interval"].items())))


def out_name(engine: str, rate: float, gap: float, busy: bool, suffix: str) -> str:
    r = f"{rate:g}"
    g = f"_gap{gap:g}ms" if engine in ("plain", "raw") else ""
    return f"wire_referee_{engine}_{r}{g}{'_busy' if busy else ''}{suffix}.json"


def referee(cfg: ChainConfig, workdir: Path, warmup: int, all_outcomes: bool = False) -> tuple[dict, object]:
    from deltatap.collector.sinks import read_rows

    run = run_chain(cfg, workdir)
    t = time.monotonic()
    wire = load_wire(run.pcap, run.ports)
    rows = read_rows(run.rows_path)
    comp = compare(rows, wire, warmup=warmup, all_outcomes=all_outcomes)
    s = summarize(comp, wire, run)
    s["analysis_s"] = time.monotonic() - t
    s["chain"] = {"engine": run.engine_desc, "wall_s": run.wall_s, "spans_received": run.spans_received, "notes": run.notes}
    ls = run.load_summary or {}
    m = ls.get("metrics_ms", {})
    s["load"] = {k: ls.get(k) for k in ("request_count", "error_request_count", "status_counts", "request_throughput_per_s", "max_in_flight_observed")}
    s["load"]["ttft_ms"] = {k: (m.get("ttft") or {}).get(k) for k in ("p50", "p99", "max")}
    return s, run


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", choices=["plain", "raw", "llamacpp"], default="plain",
                    help="raw: a raw-socket engine whose bytes are styled by --engine-arg (engines.py raw-engine --help)")
    ap.add_argument("--engine-arg", action="append", default=[], metavar="FLAG",
                    help="raw engine: one style flag, repeatable, e.g. --engine-arg=--line-end=crlf --engine-arg=--framing=close")
    ap.add_argument("--slow-reader", choices=["none", "gateway", "firewall", "both"], default="none",
                    help="that plain proxy reads its upstream's answer slowly through a small receive window, so the tap "
                    "before it (gw-fw, fw-engine) has its downstream writes held by TCP")
    ap.add_argument("--slow-rcvbuf", type=int, default=2048, help="--slow-reader: SO_RCVBUF of the slow proxy's upstream sockets")
    ap.add_argument("--slow-read-bytes", type=int, default=512, help="--slow-reader: bytes per read")
    ap.add_argument("--slow-read-pause-ms", type=float, default=5.0, help="--slow-reader: pause between reads")
    ap.add_argument("--all-outcomes", action="store_true", help="compare rows whatever their outcome (a non-streamed "
                    "answer, --engine-arg=--json-kib=N, is non_sse to the load generator: its rows are not ok)")
    ap.add_argument("--input-tokens", type=int, nargs=2, default=[16, 64], metavar=("MIN", "MAX"),
                    help="prompt length (the load generator's synthetic-uniform workload): large values make large request bodies")
    ap.add_argument("--rate", type=float, nargs="+", default=[20.0], help="req/s, Poisson (several: one run each)")
    ap.add_argument("--gap-ms", type=float, nargs="+", default=[2.0], help="plain engine: inter-token gap (several: one run each)")
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--prefill-ms", type=float, default=3.0, help="plain engine: time before the role chunk")
    ap.add_argument("--output-tokens", type=int, nargs=2, default=[8, 24], metavar=("MIN", "MAX"))
    ap.add_argument("--firewall-delay-ms", type=float, default=0.0, help="plain firewall: inbound delay")
    ap.add_argument("--gateway-delay-ms", type=float, default=0.0, help="plain gateway: inbound delay")
    ap.add_argument("--busy", action="store_true", help="run CPU burners (--burners, default 2) alongside: the busy-machine condition")
    ap.add_argument("--burners", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=10, help="first rows (by start) not compared: fresh processes' first-call costs")
    ap.add_argument("--kernel-stamps", choices=["default", "off"], default="default", help="off: DELTATAP_KERNEL_STAMPS=0 in the taps and the load generator")
    ap.add_argument("--packet-stamps", choices=["default", "off"], default="default",
                    help="off: DELTATAP_PACKET_STAMPS=0 (no packet socket: what a tap without CAP_NET_RAW does; merged reads become intervals)")
    ap.add_argument("--deltatap", help="deltatap executable for the taps, the load generator and the collector (e.g. another build's "
                    "venv/bin/deltatap); default: the one beside this interpreter")
    ap.add_argument("--max-wall-s", type=float, default=300.0, help="hard wall-clock limit per run (every child killed at the end)")
    ap.add_argument("--tap-workers", type=int, default=1, choices=range(1, 5), metavar="N",
                    help="each tap as N processes on its one port (tap --workers N: one packet log shared by them)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--results", default=str(ROOT / "benchmarks" / "results"))
    ap.add_argument("--suffix", default="", help="appended to the result file names")
    ap.add_argument("--keep", help="keep each run's directory (pcap, rows, logs) under this folder")
    args = ap.parse_args()
    if tcpdump_path() is None:
        print("tcpdump is not installed: nothing to referee with (apt-get install tcpdump)", file=sys.stderr)
        return 2
    if os.geteuid() != 0:
        print("note: capturing needs root or CAP_NET_RAW on tcpdump", file=sys.stderr)
    if args.engine == "llamacpp" and llama_server() is None:
        print("SKIPPED: --engine llamacpp needs llama-server and the Gemma 3 270M model under ~/.cache/deltatap "
              "(installed by .ci/realstack; see realstack/parts.py); nothing was run.")
        return 0
    gaps = args.gap_ms if args.engine in ("plain", "raw") else [0.0]
    slow = ("--rcvbuf", str(args.slow_rcvbuf), "--read-bytes", str(args.slow_read_bytes), "--read-pause-ms", str(args.slow_read_pause_ms))
    rc = 0
    for rate in args.rate:
        for gap in gaps:
            cfg = ChainConfig(engine=args.engine, rate=rate, requests=args.requests, gap_ms=gap, prefill_ms=args.prefill_ms,
                              firewall_delay_ms=args.firewall_delay_ms, gateway_delay_ms=args.gateway_delay_ms,
                              output_tokens=tuple(args.output_tokens), seed=args.seed, busy=args.burners if args.busy else 0,
                              max_wall_s=args.max_wall_s, kernel_stamps=False if args.kernel_stamps == "off" else None,
                              packet_stamps=False if args.packet_stamps == "off" else None, deltatap=args.deltatap,
                              tap_workers=args.tap_workers, engine_args=tuple(args.engine_arg), input_tokens=tuple(args.input_tokens),
                              gateway_args=slow if args.slow_reader in ("gateway", "both") else (),
                              firewall_args=slow if args.slow_reader in ("firewall", "both") else ())
            label = (f"{args.engine} engine, {rate:g} req/s" + (f", {gap:g} ms gaps" if args.engine != "llamacpp" else "")
                     + (f" ({' '.join(args.engine_arg)})" if args.engine_arg else "") + (f", slow reader: {args.slow_reader}" if args.slow_reader != "none" else "")
                     + (", busy" if args.busy else "") + (f", {args.tap_workers} tap workers" if args.tap_workers > 1 else ""))
            print(f"\n== {label}")
            start = uptime()
            tmp = Path(tempfile.mkdtemp(prefix="deltatap-referee-"))
            try:
                s, run = referee(cfg, tmp, args.warmup, args.all_outcomes)
            except ChainError as exc:
                print(f"run failed: {exc}", file=sys.stderr)
                rc = 1
                continue
            finally:
                if args.keep:
                    dest = Path(args.keep) / out_name(args.engine, rate, gap, args.busy, args.suffix).removesuffix(".json")
                    shutil.rmtree(dest, ignore_errors=True)
                    shutil.copytree(tmp, dest)
                shutil.rmtree(tmp, ignore_errors=True)
            end = uptime()
            print_table(label, s)
            doc = {
                "benchmark": "wire_referee", "command": "benchmarks/wire_referee.py " + " ".join(sys.argv[1:]),
                "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
                "setup": {"engine": args.engine, "rate_per_s": rate, "arrival": "poisson", "requests": args.requests, "gap_ms": gap if args.engine != "llamacpp" else None,
                          "engine_args": args.engine_arg, "slow_reader": args.slow_reader if args.slow_reader == "none" else
                          {"proxy": args.slow_reader, "rcvbuf": args.slow_rcvbuf, "read_bytes": args.slow_read_bytes, "read_pause_ms": args.slow_read_pause_ms},
                          "input_tokens": args.input_tokens,
                          "prefill_ms": args.prefill_ms, "output_tokens": args.output_tokens, "firewall_delay_ms": args.firewall_delay_ms,
                          "gateway_delay_ms": args.gateway_delay_ms, "busy_burners": cfg.busy, "tap_workers": args.tap_workers, "kernel_stamps": args.kernel_stamps, "packet_stamps": args.packet_stamps,
                          "deltatap": deltatap_build(args.deltatap), "warmup_excluded": args.warmup, "threshold_ms": 0.3,
                          "error_sign": "row - wire: positive = the row's stamp is later than the packet",
                          "mapping": "deltatap/app/referee/compare.py docstring"},
                **s,
                "load_at_start": start, "load_at_end": end,
            }
            out = Path(args.results) / out_name(args.engine, rate, gap, args.busy, args.suffix)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(doc, indent=2))
            print(f"  load at start: {start['uptime']}\n  load at end:   {end['uptime']}\n  wrote {out}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
