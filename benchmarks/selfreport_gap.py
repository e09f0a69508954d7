"""Where does the tap's unreported latency go at 1 stream? (issue 15: self-reported overhead vs the outside figure)

``benchmarks/tap_overhead.py`` compares, per request at 1 stream, the path time through the tap (client TTFT less the
mock engine's own time) with the direct path's p50, against what the tap's span says it added. This benchmark splits
both paths into segments on the wire, with the same processes (the OTLP sink, the mock engine, one tap; the client
is this process), while tcpdump captures loopback (kernel stamps, as ``benchmarks/wire_referee.py`` does; its pcap
reader, reassembly and per-request matching are reused):

* ``client_send``   client's ``t0`` (before ``post``) -> the packet carrying the request's last byte leaves the client
* ``tap_request``   that packet -> the packet carrying the request's last byte to the engine (tap path only); of it,
  ``tap_request_unreported`` is what ``deltatap.overhead.request_ns`` does not cover
* ``engine``        the request's last packet into the engine -> the packet carrying the first token out of the
  engine, less the engine's own time (its read of the request -> its write of the first token, which the mock
  reports): the engine's wake-up, aiohttp's parse and handler before its first stamp, and its write path after
* ``tap_first_token`` the engine's first-token packet -> the tap's first-token packet to the client (tap path only);
  ``tap_first_token_unreported``: less ``deltatap.overhead.first_token_ns``
* ``client_read``   the tap's (or the engine's) first-token packet -> the client's kernel receive stamp of it (~0)

and reads every process's scheduler figures (``/proc/PID/task/*/schedstat``: CPU time and run delay, the time its
threads were runnable but waited for a CPU) over each block of requests. With ``--perf-sched`` (perf, system-wide
``sched_switch`` / ``sched_waking``, on CLOCK_MONOTONIC): ``engine_wake`` (the request's packet into the engine -> the
engine running; ``engine_rest`` the rest of its segment), who held the CPUs at each engine waking that waited over
20 µs, and ``tap_awake_after_forward`` (the request's packet to the engine -> the tap going to sleep), and per request
the engine's switch-in against the tap's sleep (``engine_vs_tap_asleep``: does the engine wait for the tap's CPU?).
``hop_bound_check``: per request, how often the span's ``deltatap.overhead.hop_ns`` falls below what the wire shows its
two overheads left out (``hop_less_unreported`` < 0), and by how much. ``--tree
NAME=DIR`` runs another tap from a source tree (path ``tap-NAME``, interleaved): before/after a change in one run.

Conditions, interleaved in one run (blocks of ``--block`` requests, order shuffled per round): path ``direct`` or
``tap`` under each CPU layout: ``free`` (the scheduler places the four processes on the machine's CPUs) and each
``--pin`` layout, e.g. ``--pin client=0,tap=0,sink=0,engine=1`` (``os.sched_setaffinity`` on every thread of
each process, changed between blocks). ``gap_us``: as ``tap_overhead.py``'s ``paired_difference_us`` (p50 of each tap
request's path time less its span's self-report, minus the direct path's p50, same layout); ``gap_with_hop_us``
also less ``deltatap.overhead.hop_ns``. ``--turns``: no blocks, ``--requests`` turns of one request per path on kept
connections, the order reversed every other turn (free layout, or each ``--pin`` layout set once); then ``paired``
per tap condition: per turn ``gap = (tap path - self-report) - direct path``, split exactly into Δclient_send +
tap_request_unreported + Δengine (Δengine_wake + Δengine_rest) + tap_first_token_unreported + Δclient_read, each part's
median (95 % bootstrap interval) and mean over the turns.

    .venv/bin/python benchmarks/selfreport_gap.py [--requests 400] [--pin client=0,tap=0,sink=0,engine=1]

Needs tcpdump (``apt-get install tcpdump``) and root or CAP_NET_RAW. Writes benchmarks/results/selfreport_gap.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from tap_overhead import closed_loop, free_port, stop_all, wait_port  # noqa: E402

from deltatap.app.referee.capture import Capture, CaptureError, tcpdump_path  # noqa: E402
from deltatap.app.referee.compare import load_wire  # noqa: E402
from deltatap.core.clock import to_unix_ns  # noqa: E402
from deltatap.net import aio  # noqa: E402

PROCS = ("client", "tap", "engine", "sink")
SEGMENTS = ("client_send", "tap_request", "tap_request_unreported", "engine", "engine_wake", "engine_rest", "tap_first_token",
            "tap_first_token_unreported", "client_read", "tap_awake_after_forward", "hop", "hop_less_unreported", "after_forward",
            "engine_wake_less_after_forward")
# a bound the tap does not report (yet): how long the read's callback kept the CPU after the request's forwarding write
# (a scratch tree that sets it: docs/benchmarks.md, issue 15, session 19); analysed when a tap's spans carry it
AFTER_FORWARD = "deltatap.overhead.after_forward_ns"
# the referee's hop names for the two ports (load_wire maps a listening port to a hop of its default chain)
TAP_HOP, ENGINE_HOP = "client>edge", "fw-engine>engine"


def parse_layout(spec: str, cpus: int) -> dict[str, set[int]]:
    """``client=0,tap=0,sink=0,engine=1`` -> {process: CPUs}; every process named once, CPUs as ``0`` or ``0+1``."""
    out: dict[str, set[int]] = {}
    for part in spec.split(","):
        name, _, cpu_text = part.partition("=")
        name = name.strip()
        if name not in PROCS or not cpu_text:
            raise ValueError(f"--pin {spec!r}: each part is PROCESS=CPU with PROCESS one of {', '.join(PROCS)} (e.g. client=0,tap=0,sink=0,engine=1)")
        try:
            cs = {int(c) for c in cpu_text.split("+")}
        except ValueError:
            raise ValueError(f"--pin {spec!r}: {cpu_text!r} is not a CPU number (several: 0+1)") from None
        if any(c < 0 or c >= cpus for c in cs):
            raise ValueError(f"--pin {spec!r}: this machine has CPUs 0..{cpus - 1}")
        out[name] = cs
    missing = [p for p in PROCS if p not in out]
    if missing:
        raise ValueError(f"--pin {spec!r}: no CPU for {', '.join(missing)} (name all of {', '.join(PROCS)})")
    return out


def tids(pid: int) -> list[int]:
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except FileNotFoundError:
        return []


def set_affinity(pid: int, cpus: set[int]) -> None:
    for tid in tids(pid):
        try:
            os.sched_setaffinity(tid, cpus)
        except (ProcessLookupError, PermissionError):
            pass  # a thread that ended meanwhile


def schedstat(pid: int) -> tuple[int, int, int]:
    """(CPU ns, run delay ns, time slices) summed over the process's threads (/proc/PID/task/*/schedstat). Threads that
    ended are not counted: the figures are compared over a block in which the same threads live."""
    cpu = delay = slices = 0
    for tid in tids(pid):
        try:
            a, b, c = Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[:3]
        except (FileNotFoundError, ProcessLookupError, ValueError):
            continue
        cpu, delay, slices = cpu + int(a), delay + int(b), slices + int(c)
    return cpu, delay, slices


class SchedTrace:
    """``perf record -e sched:sched_switch -e sched:sched_waking -a -k CLOCK_MONOTONIC`` over the blocks (``--perf-sched``):
    when a process was woken and when it got a CPU, and who held each CPU meanwhile."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.proc: subprocess.Popen | None = None

    @staticmethod
    def available() -> str | None:
        return shutil.which("perf")

    def start(self) -> None:
        self.proc = subprocess.Popen(["perf", "record", "-q", "-a", "-k", "CLOCK_MONOTONIC", "-e", "sched:sched_switch", "-e", "sched:sched_waking",
                                      "-o", str(self.out)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        time.sleep(1.0)  # (perf opens its events before the first block)

    def stop(self) -> None:
        p, self.proc = self.proc, None
        if p is not None and p.poll() is None:
            p.send_signal(2)
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def load(self, tids_of: dict[int, str]) -> "SchedIndex":
        text = subprocess.run(["perf", "script", "-i", str(self.out), "-F", "tid,cpu,time,event,trace", "--ns"], capture_output=True, text=True,
                              check=False).stdout
        return SchedIndex(text, tids_of)


class SchedIndex:
    """Per CPU, who ran from when (switch events); per watched thread, its wakings (mono ns)."""

    def __init__(self, text: str, tids_of: dict[int, str]) -> None:
        self.tids_of = tids_of
        self.cpu_t: dict[int, list[int]] = {}
        self.cpu_tid: dict[int, list[int]] = {}
        self.wakings: dict[int, list[int]] = {}
        self.switch_in: dict[int, list[int]] = {}
        self.sleeps: dict[int, list[int]] = {}  # watched thread -> its switch-outs to sleep (prev_state S or D)
        for line in text.splitlines():
            parts = line.split(None, 4)
            if len(parts) < 5:
                continue
            try:
                cpu = int(parts[1].strip("[]"))
                t = int(round(float(parts[2].rstrip(":")) * 1e9))
            except ValueError:
                continue
            ev, trace = parts[3], parts[4]
            if ev.startswith("sched:sched_switch"):
                nxt = trace.rsplit("next_pid=", 1)
                if len(nxt) < 2:
                    continue
                tid = int(nxt[1].split()[0])
                self.cpu_t.setdefault(cpu, []).append(t)
                self.cpu_tid.setdefault(cpu, []).append(tid)
                if tid in tids_of:
                    self.switch_in.setdefault(tid, []).append(t)
                prev = trace.split("prev_pid=", 1)
                if len(prev) == 2:
                    ptid = int(prev[1].split()[0])
                    if ptid in tids_of and ("prev_state=S" in trace or "prev_state=D" in trace):
                        self.sleeps.setdefault(ptid, []).append(t)
            elif ev.startswith("sched:sched_waking"):
                w = trace.split("pid=", 1)
                if len(w) < 2:
                    continue
                tid = int(w[1].split()[0])
                if tid in tids_of:
                    self.wakings.setdefault(tid, []).append(t)

    def role(self, tid: int) -> str:
        return "idle" if tid == 0 else self.tids_of.get(tid, "other")

    def running_at(self, t: int) -> list[str]:
        import bisect

        out = []
        for cpu, ts in self.cpu_t.items():
            i = bisect.bisect_right(ts, t) - 1
            out.append(self.role(self.cpu_tid[cpu][i]) if i >= 0 else "?")
        return sorted(out)

    def sleeps_after(self, tid: int, t: int) -> int | None:
        """When ``tid`` next went to sleep after ``t`` (it ran, or waited for a CPU, until then)."""
        import bisect

        ss = self.sleeps.get(tid, [])
        i = bisect.bisect_left(ss, t)
        return ss[i] if i < len(ss) else None

    def wake_after(self, tid: int, t: int, within_ns: int = 300_000, until: int | None = None) -> tuple[int, int] | None:
        """(waking, switch-in) of ``tid``'s first waking in ``[t - 5 us, t + within]``, or None (it was not asleep, or its
        switch-in is not in the trace by ``until``)."""
        import bisect

        ws = self.wakings.get(tid, [])
        i = bisect.bisect_left(ws, t - 5_000)
        if i >= len(ws) or ws[i] > t + within_ns:
            return None
        w = ws[i]
        ins = self.switch_in.get(tid, [])
        j = bisect.bisect_left(ins, w)
        if j >= len(ins) or (until is not None and ins[j] > until):
            return None
        return w, ins[j]


def read_tap_spans(path: Path) -> dict[str, dict]:
    """request id -> {"attrs": {...}, "events": {name: Unix ns}} from the OTLP sink's file (benchmarks/tap_sink.py)."""
    import struct

    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    out: dict[str, dict] = {}
    data = path.read_bytes() if path.exists() else b""
    pos = 0
    while pos + 4 <= len(data):
        (n,) = struct.unpack_from(">I", data, pos)
        req = ExportTraceServiceRequest.FromString(data[pos + 4 : pos + 4 + n])
        pos += 4 + n
        for rs in req.resource_spans:
            for ss in rs.scope_spans:
                for sp in ss.spans:
                    attrs = {a.key: getattr(a.value, a.value.WhichOneof("value")) for a in sp.attributes}
                    out[str(attrs.get("deltatap.request_id", ""))] = {"attrs": attrs, "events": {e.name: e.time_unix_nano for e in sp.events}}
    return out


def _stats(values: list[float]) -> dict:
    if not values:
        return {"n": 0}
    a = np.asarray(values, dtype=np.float64) / 1e3
    return {"n": len(values), "p50_us": round(float(np.percentile(a, 50)), 1), "mean_us": round(float(a.mean()), 1),
            "p90_us": round(float(np.percentile(a, 90)), 1)}


async def drive(args, urls: dict[str, str], layouts: dict[str, dict[str, set[int]] | None], pids: dict[str, int]) -> tuple[dict, dict]:
    """The blocks: per round, every (layout, path) in a shuffled order. Returns (request stamps by id, schedstat per
    condition)."""
    detail: dict[str, tuple] = {}
    sched: dict[str, dict[str, list[int]]] = {}
    allcpus = set(range(os.cpu_count() or 1))
    rng = random.Random(args.seed)
    conds = [(lay, path) for lay in layouts for path in urls]
    per_round = max(1, args.requests // args.rounds)
    for rnd in range(args.rounds):
        order = conds[:]
        rng.shuffle(order)
        for lay, path in order:
            cpus = layouts[lay]
            for name, pid in pids.items():
                set_affinity(pid, (cpus.get(name) or cpus["tap"]) if cpus else allcpus)  # (a --tree tap: the tap's CPUs)
            if args.warm:
                await closed_loop(urls[path], 1, args.warm, f"warm-{path}@{lay}-{rnd}")
            before = {name: schedstat(pid) for name, pid in pids.items()}
            got: dict[str, tuple] = {}
            await closed_loop(urls[path], 1, per_round, f"{path}@{lay}-{rnd}", None, got)
            after = {name: schedstat(pid) for name, pid in pids.items()}
            detail.update(got)
            acc = sched.setdefault(f"{path}@{lay}", {})
            for name in pids:
                d = [x - y for x, y in zip(after[name], before[name])]
                tot = acc.setdefault(name, [0, 0, 0, 0])
                tot[0] += d[0]
                tot[1] += d[1]
                tot[2] += d[2]
                tot[3] += len(got)
    for name, pid in pids.items():
        set_affinity(pid, allcpus)
    return detail, sched


async def drive_turns(args, urls: dict[str, str], layouts: dict[str, dict[str, set[int]] | None], pids: dict[str, int]) -> tuple[dict, dict]:
    """``--turns``: per layout (set once), ``--requests`` turns of one request per path on kept connections (one
    session per path, as a client at 1 stream keeps its connection), the order reversed every other turn (A B B A:
    tap and direct requests close in time, for :func:`paired_gap`), after ``--warm`` turns left out. Ids
    ``PATH@LAYOUT-TURN-0``; the processes' schedstat over the layout's turns, per request of any path."""
    import asyncio

    import aiohttp

    from tap_overhead import one
    from deltatap.net.wire import make_stamping_connector

    detail: dict[str, tuple] = {}
    sched: dict[str, dict[str, list[int]]] = {}
    allcpus = set(range(os.cpu_count() or 1))
    names = list(urls)
    for lay, cpus in layouts.items():
        for name, pid in pids.items():
            set_affinity(pid, (cpus.get(name) or cpus["tap"]) if cpus else allcpus)
        sessions = {p: aiohttp.ClientSession(connector=make_stamping_connector(limit=0), auto_decompress=False,
                                             timeout=aiohttp.ClientTimeout(total=60)) for p in names}
        try:
            before = None
            for i in range(-args.warm, args.requests):
                if i == 0:
                    before = {name: schedstat(pid) for name, pid in pids.items()}
                for path in (names if i % 2 == 0 else names[::-1]):
                    rid = f"warm-{path}@{lay}-{-i}" if i < 0 else f"{path}@{lay}-{i}-0"
                    try:
                        await one(sessions[path], urls[path], rid, None if i < 0 else detail)
                    except (aiohttp.ClientError, asyncio.TimeoutError):
                        pass
            after = {name: schedstat(pid) for name, pid in pids.items()}
        finally:
            for sess in sessions.values():
                await sess.close()
        for path in names:
            sched[f"{path}@{lay}"] = {name: [a - b for a, b in zip(after[name], before[name])] + [args.requests * len(names)]
                                      for name in pids}
    for name, pid in pids.items():
        set_affinity(pid, allcpus)
    return detail, sched


def analyse(detail: dict, spans: dict, wire, conds: list[str], sched: "SchedIndex | None" = None, engine_tid: int = 0,
            tap_tids: dict[str, int] | None = None, names: list[str] | None = None) -> dict:
    from deltatap.core.clock import ANCHOR

    rows: dict[str, dict[str, list[float]]] = {c: {k: [] for k in ("path", "left", "left_hop", "left_hop_after", *SEGMENTS)} for c in conds}
    wake_of: dict[str, float] = {}  # request id -> the engine's wake-up (ns), for the after-forward bound below
    # engine wake-ups that waited > 20 us for a CPU: who held the CPUs when it was woken, per condition
    holders: dict[str, dict[str, int]] = {c: {} for c in conds}
    not_asleep: dict[str, int] = {c: 0 for c in conds}
    stamp_err: dict[str, list[float]] = {"request.body_received": [], "request.forwarded": [], "first_token.received": [],
                                         "first_token.forwarded": [], "client.first_token_received": [],
                                         # the two forwarding writes when the span's hop bound is 0 (both placed at their
                                         # departure from the packet log) and when it is not (stamped at the send's issue)
                                         "request.forwarded (hop 0)": [], "first_token.forwarded (hop 0)": [],
                                         "request.forwarded (hop > 0)": [], "first_token.forwarded (hop > 0)": []}
    missing = {"wire": 0, "span": 0}
    engine_vs_sleep: dict[str, list[float]] = {c: [] for c in conds}  # engine running - tap asleep, per tap request (ns)
    per_req: dict[str, dict[str, float]] = {}  # request id -> its segments (ns), for the pairs below
    for rid, (t0, first, engine_ns) in detail.items():
        cond = rid.rsplit("-", 2)[0]
        if cond not in rows or first is None or engine_ns < 0:
            continue
        r = rows[cond]
        path_ns = first - t0 - engine_ns
        hops = wire.by_request.get(rid, {})
        up = hops.get(ENGINE_HOP)
        tapside = hops.get(TAP_HOP)
        is_tap = not cond.startswith("direct@")
        if up is None or (is_tap and tapside is None) or "first" not in up.times or "req_last" not in up.times:
            missing["wire"] += 1
            continue
        t0_u, first_u = to_unix_ns(t0), to_unix_ns(first)
        down = tapside if is_tap else up  # the client's own connection
        if "first" not in down.times or "req_last" not in down.times:
            missing["wire"] += 1
            continue
        r["path"].append(path_ns)
        seg = per_req[rid] = {"path": path_ns, "client_send": down.times["req_last"] - t0_u,
                              "engine": up.times["first"] - up.times["req_last"] - engine_ns, "client_read": first_u - down.times["first"]}
        r["client_send"].append(down.times["req_last"] - t0_u)
        r["engine"].append(up.times["first"] - up.times["req_last"] - engine_ns)
        r["client_read"].append(first_u - down.times["first"])
        stamp_err["client.first_token_received"].append(first_u - down.times["first"])
        if sched is not None:  # the engine's wake-up for the request: its waking -> its switch-in, from the request's packet
            arrive = ANCHOR.to_mono_ns(up.times["req_last"])
            wk = sched.wake_after(engine_tid, arrive, until=ANCHOR.to_mono_ns(up.times["first"]))  # (it ran before it answered)
            if wk is None:
                not_asleep[cond] += 1
            else:
                r["engine_wake"].append(wk[1] - arrive)
                wake_of[rid] = seg["engine_wake"] = wk[1] - arrive
                r["engine_rest"].append(up.times["first"] - up.times["req_last"] - engine_ns - (wk[1] - arrive))
                if wk[1] - wk[0] > 20_000:
                    key = "+".join(sched.running_at(wk[0]))
                    holders[cond][key] = holders[cond].get(key, 0) + 1
        if not is_tap:
            continue
        sp = spans.get(rid)
        a = sp["attrs"] if sp else {}
        req_o, ft_o, hop_o = (a.get(k) for k in ("deltatap.overhead.request_ns", "deltatap.overhead.first_token_ns", "deltatap.overhead.hop_ns"))
        if req_o is None or ft_o is None:
            missing["span"] += 1
            continue
        tap_req = up.times["req_last"] - tapside.times["req_last"]
        tap_ft = tapside.times["first"] - up.times["first"]
        r["tap_request"].append(tap_req)
        if sched is not None:  # how long the tap stayed awake (running or runnable) after its request's packet left
            slept = sched.sleeps_after((tap_tids or {}).get(cond.split("@", 1)[0], 0), ANCHOR.to_mono_ns(up.times["req_last"]))
            if slept is not None:
                r["tap_awake_after_forward"].append(slept - ANCHOR.to_mono_ns(up.times["req_last"]))
                seg["tap_awake_after_forward"] = slept - ANCHOR.to_mono_ns(up.times["req_last"])
                if rid in wake_of:  # the engine's switch-in against the tap's sleep, both from the request's packet
                    engine_vs_sleep[cond].append(wake_of[rid] - (slept - ANCHOR.to_mono_ns(up.times["req_last"])))
        r["tap_request_unreported"].append(tap_req - req_o)
        seg.update({"tap_request_unreported": tap_req - req_o, "tap_first_token_unreported": tap_ft - ft_o,
                    "left": path_ns - req_o - ft_o, **({"hop": hop_o} if hop_o is not None else {})})
        r["tap_first_token"].append(tap_ft)
        r["tap_first_token_unreported"].append(tap_ft - ft_o)
        r["left"].append(path_ns - req_o - ft_o)
        if hop_o is not None:
            r["left_hop"].append(path_ns - req_o - ft_o - hop_o)
            r["hop"].append(hop_o)
            # the hop bound against what the wire shows the two overheads left out (their writes' issue -> packet)
            r["hop_less_unreported"].append(hop_o - (tap_req - req_o) - (tap_ft - ft_o))
            after = a.get(AFTER_FORWARD)
            if after is not None:
                r["after_forward"].append(after)
                r["left_hop_after"].append(path_ns - req_o - ft_o - hop_o - after)
                if rid in wake_of:
                    r["engine_wake_less_after_forward"].append(wake_of[rid] - after)
        ev = sp["events"]
        for name, wt in (("request.body_received", tapside.times["req_last"]), ("request.forwarded", up.times["req_last"]),
                         ("first_token.received", up.times["first"]), ("first_token.forwarded", tapside.times["first"])):
            if name in ev:
                stamp_err[name].append(ev[name] - wt)
                if name.endswith(".forwarded") and hop_o is not None:
                    stamp_err[f"{name} (hop {'0' if hop_o == 0 else '> 0'})"].append(ev[name] - wt)
    out: dict = {"conditions": {}, "missing": missing}
    for c, r in rows.items():
        out["conditions"][c] = {k: _stats(v) for k, v in r.items()}
        if sched is not None:
            n_wake = len(r["engine_wake"])
            out["conditions"][c]["engine_wake_over_20us"] = {
                "share": round(sum(h for h in holders[c].values()) / n_wake, 3) if n_wake else None,
                "cpus_held_by": dict(sorted(holders[c].items(), key=lambda kv: -kv[1])), "engine_not_asleep": not_asleep[c]}
        h = r["hop_less_unreported"]
        if h:  # per request: is the span's hop bound a bound of what the wire shows its two overheads left out?
            out["conditions"][c]["hop_bound_check"] = {
                "n": len(h), "short_share": round(sum(1 for x in h if x < 0) / len(h), 3),
                "short_by_p50_us": round(float(np.percentile([-x for x in h if x < 0], 50)) / 1e3, 1) if any(x < 0 for x in h) else 0.0,
                "p10_us": round(float(np.percentile(h, 10)) / 1e3, 1)}
        ev = engine_vs_sleep[c]
        if ev:  # does the engine wait for the tap to sleep? (its switch-in within 10 us after the tap's sleep)
            out["conditions"][c]["engine_vs_tap_asleep"] = {
                "n": len(ev), "p50_us": round(float(np.percentile(ev, 50)) / 1e3, 1),
                "runs_before_tap_sleeps_share": round(sum(1 for x in ev if x < 0) / len(ev), 3),
                "runs_within_10us_after_share": round(sum(1 for x in ev if 0 <= x <= 10_000) / len(ev), 3)}
    out["stamp_minus_wire"] = {k: _stats(v) for k, v in stamp_err.items()}
    for c in conds:
        if c.startswith("direct@"):
            continue
        lay = c.split("@", 1)[1]
        d = rows.get(f"direct@{lay}", {}).get("path", [])
        t = rows[c]
        if not d or not t["left"]:
            continue
        d50 = float(np.percentile(d, 50))
        g = out["conditions"][c]
        g["gap_us"] = round((float(np.percentile(t["left"], 50)) - d50) / 1e3, 1)
        g["gap_with_hop_us"] = round((float(np.percentile(t["left_hop"], 50)) - d50) / 1e3, 1) if t["left_hop"] else None
        if t["left_hop_after"]:  # the same with the after-forward bound counted as reported too
            g["gap_with_hop_and_after_forward_us"] = round((float(np.percentile(t["left_hop_after"], 50)) - d50) / 1e3, 1)
        dd = out["conditions"][f"direct@{lay}"]
        # the gap in segment means (means add up; medians do not): what each segment adds over the direct path
        g["mean_gap_by_segment_us"] = {
            "client_send": round(g["client_send"]["mean_us"] - dd["client_send"]["mean_us"], 1),
            "tap_request_unreported": g["tap_request_unreported"]["mean_us"],
            "engine": round(g["engine"]["mean_us"] - dd["engine"]["mean_us"], 1),
            **({"of_which_engine_wake": round(g["engine_wake"]["mean_us"] - dd["engine_wake"]["mean_us"], 1)}
               if g["engine_wake"]["n"] and dd["engine_wake"]["n"] else {}),
            "tap_first_token_unreported": g["tap_first_token_unreported"]["mean_us"],
            "client_read": round(g["client_read"]["mean_us"] - dd["client_read"]["mean_us"], 1),
        }
        g["mean_gap_us"] = round((float(np.mean(t["left"])) - float(np.mean(d))) / 1e3, 1)
        g["paired"] = paired_gap(per_req, c, f"direct@{lay}", names)
    return out


def paired_gap(per_req: dict[str, dict[str, float]], cond: str, direct: str, names: list[str] | None = None) -> dict | None:
    """The gap per pair: a tap request and the direct request of the same block index (``--rounds`` = ``--requests``
    gives one request per block, the two paths in a shuffled order each round: pairs close in time). Per pair
    ``gap = (tap path - self-report) - direct path`` = Δclient_send + tap_request_unreported + Δengine +
    tap_first_token_unreported + Δclient_read exactly; each part's median and mean over pairs (the means add up to
    the mean gap), and the gap's median with a 95 % bootstrap interval over pairs. ``names`` (``--turns``: the paths
    in their turn order, reversed every other turn): the same again for the tap requests that came right after a
    request on the same tap (``after_same_path``) and after one on another path (``after_other_path``)."""
    pairs = []
    prev_same: list[bool] = []
    path = cond.split("@", 1)[0]
    for rid, seg in per_req.items():
        c = rid.rsplit("-", 2)[0]  # ids: CONDITION-ROUND-INDEX
        idx = rid[len(c):]
        if c != cond or "left" not in seg:
            continue
        other = per_req.get(direct + idx)
        if other is not None:
            pairs.append((seg, other))
            if names and path in names:
                i = int(idx.split("-")[1])
                order = names if i % 2 == 0 else names[::-1]
                k = order.index(path)
                prev_same.append((order[k - 1] if k else (names if (i - 1) % 2 == 0 else names[::-1])[-1]) == path)
    if len(pairs) < 2:
        return None
    out = _gap_parts(pairs)
    if names and len(prev_same) == len(pairs):
        for label, want in (("after_same_path", True), ("after_other_path", False)):
            sub = [pr for pr, same in zip(pairs, prev_same) if same == want]
            if len(sub) >= 2:
                out[label] = _gap_parts(sub)
    return out


def _gap_parts(pairs: list[tuple[dict, dict]]) -> dict:
    from tap_overhead import boot_ci

    parts: dict[str, list[float]] = {"gap": [], "gap_with_hop": [], "client_send": [], "tap_request_unreported": [],
                                     "engine": [], "engine_wake": [], "engine_rest": [], "tap_first_token_unreported": [],
                                     "client_read": []}
    for t, d in pairs:
        parts["gap"].append(t["left"] - d["path"])
        if "hop" in t:
            parts["gap_with_hop"].append(t["left"] - t["hop"] - d["path"])
        for k in ("client_send", "engine", "client_read"):
            parts[k].append(t[k] - d[k])
        for k in ("tap_request_unreported", "tap_first_token_unreported", "tap_awake_after_forward"):
            if k in t:
                parts.setdefault(k, []).append(t[k])
        if "engine_wake" in t and "engine_wake" in d:
            parts["engine_wake"].append(t["engine_wake"] - d["engine_wake"])
            parts["engine_rest"].append((t["engine"] - t["engine_wake"]) - (d["engine"] - d["engine_wake"]))
    med = lambda a: np.median(a, axis=-1)  # noqa: E731
    out: dict = {"pairs": len(pairs)}
    for k, v in parts.items():
        if v:
            ci = boot_ci(med, v, paired=True)
            out[k] = {"median_us": round(float(np.median(v)) / 1e3, 1), "mean_us": round(float(np.mean(v)) / 1e3, 1),
                      "ci95_median_us": [round(x / 1e3, 1) for x in ci] if ci else None}
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=400, help="requests per condition (path x layout)")
    p.add_argument("--rounds", type=int, default=8, help="blocks per condition, interleaved")
    p.add_argument("--pin", action="append", default=[], metavar="LAYOUT",
                   help="a CPU layout besides free, e.g. client=0,tap=0,sink=0,engine=1 (repeatable)")
    p.add_argument("--no-free", action="store_true", help="only the --pin layouts")
    p.add_argument("--perf-sched", action="store_true",
                   help="also record the scheduler's switch and waking events (perf, system-wide): the engine's wake-up delay "
                        "for each request and who held the CPUs meanwhile")
    p.add_argument("--tree", action="append", default=[], metavar="NAME=DIR",
                   help="also run a tap from this source tree (path tap-NAME, interleaved with the others; e.g. a scratch copy "
                        "with a change, for before/after in one run)")
    p.add_argument("--warm", type=int, default=3, help="warm-up requests before each block (with --turns: turns before the first; left out)")
    p.add_argument("--turns", action="store_true",
                   help="no blocks: --requests turns of one request per path on kept connections, order ABBA (per-pair gap and parts: 'paired')")
    p.add_argument("--seed", type=int, default=15)
    p.add_argument("--keep", metavar="DIR", help="keep the pcap and the span file here")
    p.add_argument("--out", default=str(HERE / "results" / "selfreport_gap.json"))
    args = p.parse_args()
    if tcpdump_path() is None:
        print("tcpdump is not installed: nothing to split the path with (apt-get install tcpdump)", file=sys.stderr)
        return 2
    if args.requests < args.rounds or args.rounds < 1:
        print("--requests must be at least --rounds (>= 1): each round runs one block per condition", file=sys.stderr)
        return 2
    cpus = os.cpu_count() or 1
    try:
        layouts: dict[str, dict[str, set[int]] | None] = {} if args.no_free else {"free": None}
        for spec in args.pin:
            layouts[spec] = parse_layout(spec, cpus)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    if not layouts:
        print("--no-free needs at least one --pin layout", file=sys.stderr)
        return 2
    if args.perf_sched and SchedTrace.available() is None:
        print("--perf-sched needs perf (apt-get install linux-perf)", file=sys.stderr)
        return 2
    trees: dict[str, Path] = {}
    for spec in args.tree:
        name, _, d = spec.partition("=")
        tree = Path(d).resolve() if d else None
        if not name or tree is None or not (tree / "setup.py").is_file() or not (tree / "deltatap").is_dir():
            print(f"--tree {spec!r}: NAME=DIR with DIR a deltatap source tree (setup.py and deltatap/ in it)", file=sys.stderr)
            return 2
        trees[name] = tree
    py = sys.executable
    up_port, tap_port, sink_port = free_port(), free_port(), free_port()
    extra_ports = {name: free_port() for name in trees}
    tmp = Path(tempfile.mkdtemp(prefix="deltatap-selfreport-"))
    spans_path = tmp / "spans.bin"
    procs: list[subprocess.Popen] = []
    cap = Capture(tmp / "run.pcap", [up_port, tap_port, sink_port, *extra_ports.values()])
    trace = SchedTrace(tmp / "sched.data") if args.perf_sched else None
    sched_index = None
    engine_tid = 0
    try:
        sink = subprocess.Popen([py, str(HERE / "tap_sink.py"), "--port", str(sink_port), "--out", str(spans_path)], stdout=subprocess.DEVNULL)
        procs.append(sink)
        wait_port(sink_port, sink, "OTLP sink")
        up = subprocess.Popen([py, str(HERE / "tap_mock_upstream.py"), "--port", str(up_port)], stdout=subprocess.DEVNULL)
        procs.append(up)
        wait_port(up_port, up, "mock upstream")
        def start_tap(port: int, what: str, env: dict | None = None, cwd: Path | None = None) -> subprocess.Popen:
            proc = subprocess.Popen([py, "-m", "deltatap.app.cli", "tap", "--link", "fw-engine", "--listen", f"127.0.0.1:{port}", "--no-admin",
                                     "--upstream", f"http://127.0.0.1:{up_port}", "--otlp", f"http://127.0.0.1:{sink_port}"],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, **(env or {})}, cwd=cwd)
            procs.append(proc)
            wait_port(port, proc, what)
            return proc

        tap = start_tap(tap_port, "deltatap tap")
        extra: dict[str, subprocess.Popen] = {}
        for name, tree in trees.items():
            from tap_cpu_ab import shim

            extra[name] = start_tap(extra_ports[name], f"deltatap tap ({tree})", {"PYTHONPATH": str(shim(tree, tmp / f"shim-{name}"))}, tmp)
        try:
            cap.start()
        except CaptureError as exc:
            print(f"capture: {exc}", file=sys.stderr)
            return 2
        pids = {"client": os.getpid(), "tap": tap.pid, "engine": up.pid, "sink": sink.pid, **{f"tap-{n}": pr.pid for n, pr in extra.items()}}
        engine_tid = up.pid  # (the mock's event loop runs on its main thread)
        if trace is not None:
            trace.start()
        tids_of = {t: name for name, pid in pids.items() for t in tids(pid)}
        urls = {"direct": f"http://127.0.0.1:{up_port}/v1/chat/completions", "tap": f"http://127.0.0.1:{tap_port}/v1/chat/completions",
                **{f"tap-{n}": f"http://127.0.0.1:{extra_ports[n]}/v1/chat/completions" for n in trees}}
        load_before = os.getloadavg()
        t_start = time.monotonic()
        detail, sched = aio.run((drive_turns if args.turns else drive)(args, urls, layouts, pids))
        wall = time.monotonic() - t_start
        load_after = os.getloadavg()
        tids_of.update({t: name for name, pid in pids.items() for t in tids(pid)})
        if trace is not None:
            trace.stop()
            sched_index = trace.load(tids_of)
        for pr in (tap, *extra.values()):
            pr.terminate()  # (its queued spans are exported on the way out)
        for pr in (tap, *extra.values()):
            pr.wait(30)
        time.sleep(0.3)
        counts = cap.stop()
        spans = read_tap_spans(spans_path)
        wires = [load_wire(tmp / "run.pcap", {"edge": port, "engine": up_port, "gateway": -1, "gw-fw": -2, "firewall": -3, "fw-engine": -4})
                 for port in (tap_port, *extra_ports.values())]
        wire = wires[0]
        for w in wires[1:]:  # (each tap's port read as the chain's edge in turn; the requests' ids tell the paths apart)
            for rid, hops in w.by_request.items():
                if TAP_HOP in hops:
                    wire.by_request.setdefault(rid, {})[TAP_HOP] = hops[TAP_HOP]
        if args.keep:
            Path(args.keep).mkdir(parents=True, exist_ok=True)
            for f in ("run.pcap", "spans.bin"):
                shutil.copy(tmp / f, Path(args.keep) / f)
    finally:
        if trace is not None:
            trace.stop()
        cap.stop()
        stop_all(procs)
        shutil.rmtree(tmp, ignore_errors=True)
    conds = [f"{path}@{lay}" for lay in layouts for path in urls]
    result = analyse(detail, spans, wire, conds, sched_index, engine_tid, {p: pids[p] for p in urls if p != "direct"},
                     list(urls) if args.turns else None)
    for c, per in sched.items():
        g = result["conditions"].setdefault(c, {})
        g["sched_per_request_us"] = {name: {"cpu": round(v[0] / max(v[3], 1) / 1e3, 1), "run_delay": round(v[1] / max(v[3], 1) / 1e3, 1),
                                            "slices": round(v[2] / max(v[3], 1), 2)} for name, v in per.items()}
    result.update({
        "benchmark": "selfreport_gap", "command": "python benchmarks/selfreport_gap.py " + " ".join(sys.argv[1:]),
        "layouts": {k: ({n: sorted(c) for n, c in v.items()} if v else "free") for k, v in layouts.items()},
        "requests_per_condition": args.requests, "rounds": args.rounds, "wall_s": round(wall, 1),
        "loadavg_1m": {"before": load_before[0], "after": load_after[0]}, "capture": counts, "wire": wire.stats,
        "machine": {"cpus": cpus, "python": platform.python_version(), "platform": platform.platform()},
    })
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print_report(result)
    print(f"wrote {out}")
    return 0


def print_report(result: dict) -> None:
    print(f"load average {result['loadavg_1m']['before']:.2f} -> {result['loadavg_1m']['after']:.2f}; capture {result['capture']}")
    for c, g in result["conditions"].items():
        if not g.get("path", {}).get("n"):
            continue
        segs = "  ".join(f"{k} {g[k]['p50_us']}/{g[k]['mean_us']}" for k in SEGMENTS if g.get(k, {}).get("n"))
        print(f"{c}: n {g['path']['n']} path p50 {g['path']['p50_us']} us; segments p50/mean us: {segs}")
        if "engine_wake_over_20us" in g:
            w = g["engine_wake_over_20us"]
            print(f"    engine wake-ups waiting > 20 us for a CPU: {w['share']}; CPUs held by {w['cpus_held_by']}")
        if "gap_us" in g:
            after = f", with hop and after-forward {g['gap_with_hop_and_after_forward_us']}" if "gap_with_hop_and_after_forward_us" in g else ""
            print(f"    gap {g['gap_us']} us (with hop {g['gap_with_hop_us']}{after}), mean gap {g['mean_gap_us']}; by segment (means) "
                  f"{g['mean_gap_by_segment_us']}")
        if g.get("paired"):
            pr = g["paired"]
            for label, sub in (("paired", pr), *((k, pr[k]) for k in ("after_same_path", "after_other_path") if k in pr)):
                print(f"    {label} ({sub['pairs']} pairs), median [95 % CI] / mean us: " + "  ".join(
                    f"{k} {v['median_us']} {v['ci95_median_us']} / {v['mean_us']}" for k, v in sub.items()
                    if isinstance(v, dict) and "median_us" in v))
        if "hop_bound_check" in g:
            print(f"    hop bound per request: below the wire's unreported in {g['hop_bound_check']['short_share']} "
                  f"(by {g['hop_bound_check']['short_by_p50_us']} us p50), margin p10 {g['hop_bound_check']['p10_us']} us")
        if "engine_vs_tap_asleep" in g:
            e = g["engine_vs_tap_asleep"]
            print(f"    engine running - tap asleep p50 {e['p50_us']} us; engine ran before the tap slept {e['runs_before_tap_sleeps_share']}, "
                  f"within 10 us after it {e['runs_within_10us_after_share']}")
        sp = g.get("sched_per_request_us")
        if sp:
            print("    per request, CPU / run delay us: " + ", ".join(f"{n} {v['cpu']}/{v['run_delay']}" for n, v in sp.items()))
    print("stamp - wire (p50/mean us): " + ", ".join(f"{k} {v.get('p50_us')}/{v.get('mean_us')}" for k, v in result["stamp_minus_wire"].items()))


if __name__ == "__main__":
    sys.exit(main())
