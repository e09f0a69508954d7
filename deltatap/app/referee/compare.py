"""Rows vs the wire: which packet each point is about, and the per point / per delta errors.

The mapping (default topology client -> gateway -> firewall -> engine; links edge, gw-fw, fw-engine;
``docs/concepts.md`` section 2 and ``deltatap/core/vocab.py``'s ``TAP_EVENT_OBSERVES``). A *hop* is one
TCP connection kind, named ``<connecting side>><listening side>``; each tap has a downstream hop (D) and
an upstream hop (U). "req first / req last": the packet that carried the request's first / last byte
on that hop; "first / last": the packet that carried the byte completing the first / last content SSE
event (the first event with non-whitespace generated text -- never the role-only chunk -- and its
blank line's first line-end byte, the byte that makes an SSE parser dispatch it: the ``\r`` of a ``\r\n``) of the response on that hop.

=================================  ==========  ==================  =========================================
point (t-name)                     observer    hop                 bytes
=================================  ==========  ==================  =========================================
client.send (t0)                   loadgen     client>edge         req last (T_submit: last byte written)
client.send                        tap:edge    client>edge         req first (request.received)
gateway.in.arrive (t1)             tap:edge    edge>gateway        req last (request.forwarded)
gateway.in.exit (t2)               tap:gw-fw   gateway>gw-fw       req last (request.body_received: an
                                                                   intermediary's in.exit is its last byte)
firewall.in.arrive (t3)            tap:gw-fw   gw-fw>firewall      req last
firewall.in.exit (t5)              tap:fw-eng  firewall>fw-engine  req last (body_received)
engine.queue (t6)                  tap:fw-eng  fw-engine>engine    req last
engine.first_token (t7)            tap:fw-eng  fw-engine>engine    first (first_token.received)
engine.last_token (t8)             tap:fw-eng  fw-engine>engine    last
firewall.out.first_in (t9)         tap:fw-eng  firewall>fw-engine  first (first_token.forwarded)
firewall.out.first_out (t10)       tap:gw-fw   gw-fw>firewall      first
gateway.out.first_in               tap:gw-fw   gateway>gw-fw       first
gateway.out.first_out (t11)        tap:edge    edge>gateway        first
client.first_token_received (t12)  loadgen     client>edge         first (also tap:edge's forward)
*.out.last_* / *last_token*        as above, with the last content event
=================================  ==========  ==================  =========================================

Deltas are recomputed from the wire points of the observers the row's points came from (``src``);
where the collector preferred another observer's pair (``within`` true while the row's two points
come from different observers) the common observer's wire points are used. The taps' overheads:
``tap_<link>_request`` = U req last - D req last, ``tap_<link>_first_token`` = D first - U first.

A point's wire time is when its bytes were first sent where the observer sends them (a write) and when they
reached the observer where it receives them (a read). The two differ only for a retransmitted byte: on loopback
tcpdump captures a packet as it is sent, and the packet can still be dropped on the way in (the receive backlog), so
the copy that arrived is the latest one captured at or before the receiver's first ACK covering the byte
(``Stream.arrival_at``; ``reassembly`` stats ``arrivals_on_a_later_copy``, ``copies_without_ack``).

Errors are ``row - wire`` (positive: the row's stamp is late). Where the row states an interval for a point
(``stamp_bounds``: the tap or client could not know the time exactly), a point is *covered* when the wire time lies
in ``[t - before, t + after]`` widened by ``STAMP_EXACT_NS`` (an exact stamp is exact to that; a side stated unknown,
``BOUND_UNKNOWN``, is open: it claims nothing that way, and such values are counted apart), a delta when its error
is within its stamp bound plus ``STAMP_EXACT_NS`` per end. A point outside its interval is counted by point,
direction (late: the row after the wire) and whether it was stated exact or as an interval.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from deltatap.core.vocab import STAMP_EXACT_NS

from .pcap import read_tcp
from .reassembly import Connection, Message, first_last_content, parse_requests, parse_responses, reassemble, sse_events

LINKS = {"edge": ("client", "gateway"), "gw-fw": ("gateway", "firewall"), "fw-engine": ("firewall", "engine")}
HOPS = ["client>edge", "edge>gateway", "gateway>gw-fw", "gw-fw>firewall", "firewall>fw-engine", "fw-engine>engine"]
ALIASES = {
    "client.send": "t0", "gateway.in.arrive": "t1", "gateway.in.exit": "t2", "firewall.in.arrive": "t3", "firewall.in.exit": "t5",
    "engine.queue": "t6", "engine.first_token": "t7", "engine.last_token": "t8", "firewall.out.first_in": "t9",
    "firewall.out.first_out": "t10", "gateway.out.first_out": "t11", "client.first_token_received": "t12",
}
THRESHOLD_NS = 300_000  # "off by more than 0.3 ms"
LATER_PACKET_TOL_NS = 5_000


def _d(link: str) -> str:
    return f"{LINKS[link][0]}>{link}"


def _u(link: str) -> str:
    return f"{link}>{LINKS[link][1]}"


# point -> observer -> (hop, what); what in req_first, req_last, first, last
POINT_WIRE: dict[str, dict[str, tuple[str, str]]] = {
    "client.send": {"client": ("client>edge", "req_last"), "tap:edge": ("client>edge", "req_first")},
    "client.first_token_received": {"client": ("client>edge", "first"), "tap:edge": ("client>edge", "first")},
    "client.last_token_received": {"client": ("client>edge", "last"), "tap:edge": ("client>edge", "last")},
    "gateway.in.arrive": {"tap:edge": (_u("edge"), "req_last")},
    "gateway.in.exit": {"tap:gw-fw": (_d("gw-fw"), "req_last")},
    "gateway.out.first_in": {"tap:gw-fw": (_d("gw-fw"), "first")},
    "gateway.out.first_out": {"tap:edge": (_u("edge"), "first")},
    "gateway.out.last_in": {"tap:gw-fw": (_d("gw-fw"), "last")},
    "gateway.out.last_out": {"tap:edge": (_u("edge"), "last")},
    "firewall.in.arrive": {"tap:gw-fw": (_u("gw-fw"), "req_last")},
    "firewall.in.exit": {"tap:fw-engine": (_d("fw-engine"), "req_last")},
    "firewall.out.first_in": {"tap:fw-engine": (_d("fw-engine"), "first")},
    "firewall.out.first_out": {"tap:gw-fw": (_u("gw-fw"), "first")},
    "firewall.out.last_in": {"tap:fw-engine": (_d("fw-engine"), "last")},
    "firewall.out.last_out": {"tap:gw-fw": (_u("gw-fw"), "last")},
    "engine.queue": {"tap:fw-engine": (_u("fw-engine"), "req_last")},
    "engine.first_token": {"tap:fw-engine": (_u("fw-engine"), "first")},
    "engine.last_token": {"tap:fw-engine": (_u("fw-engine"), "last")},
}
NOT_ON_WIRE = {"client.end", "engine.exec_start"}  # the response's end as the client saw it; llama.cpp's prompt_ms


@dataclass
class Exchange:
    """One request/response on one hop."""

    hop: str
    conn: Connection
    req: Message
    resp: Message | None
    times: dict[str, int] = field(default_factory=dict)  # what -> wire ns: the bytes' first sending (departure)
    arrive: dict[str, int] = field(default_factory=dict)  # what -> wire ns: the copy the receiver took (arrival)
    later_ts: dict[str, list[int]] = field(default_factory=dict)  # what -> stamps of the response's later packets
    problems: list[str] = field(default_factory=list)


@dataclass
class Wire:
    by_request: dict[str, dict[str, Exchange]]
    stats: dict
    problems: Counter


def _fill(ex: Exchange) -> None:
    c, s = ex.conn.client, ex.conn.server
    for what, off in (("req_first", ex.req.start), ("req_last", ex.req.last)):
        ex.times[what] = c.departure_at(off)
        ex.arrive[what] = c.arrival_at(off)
    r = ex.resp
    if r is None:
        ex.problems.append("no response")
        return
    if not r.complete:
        ex.problems.append("response incomplete")
    first, last = first_last_content(sse_events(r.body))
    for what, ev in (("first", first), ("last", last)):
        if ev is None:
            continue
        off = r.stream_offset(ev.end)
        i = s.segment_index(off)
        ex.times[what] = s.departure_at(off)
        ex.arrive[what] = s.arrival_at(off)
        end_i = s.segment_index(r.last) if r.end > r.start else i
        ex.later_ts[what] = s.seg_ts[i + 1 : end_i + 1]


def load_wire(pcap: Path, ports: dict[str, int], header: str = "x-request-id") -> Wire:
    hop_of_port = {ports[h.split(">")[1]]: h for h in HOPS}
    conns, stats = reassemble(read_tcp(pcap), set(hop_of_port))
    problems: Counter = Counter()
    by_request: dict[str, dict[str, Exchange]] = {}
    stats.update({"connections": len(conns), "exchanges": 0, "holes": 0, "inconsistent_overlaps": 0, "retransmitted_bytes": 0,
                  "incomplete_messages": 0, "requests_without_id": 0, "unparsed_bytes": 0,
                  "arrivals_on_a_later_copy": 0, "copies_without_ack": 0})
    for conn in conns:
        hop = hop_of_port.get(conn.server_port)
        if hop is None:
            problems["connection to an unknown port"] += 1
            continue
        for st in (conn.client, conn.server):
            stats["holes"] += st.holes
            stats["inconsistent_overlaps"] += st.inconsistent
            stats["retransmitted_bytes"] += st.retransmitted_bytes
        reqs = parse_requests(conn.client)
        resps = parse_responses(conn.server, reqs)
        if reqs and reqs[-1].end < len(conn.client.data):
            stats["unparsed_bytes"] += len(conn.client.data) - reqs[-1].end
        if resps and resps[-1].end < len(conn.server.data):
            stats["unparsed_bytes"] += len(conn.server.data) - resps[-1].end
        if not reqs and conn.client.data:
            stats["unparsed_bytes"] += len(conn.client.data)
        for i, req in enumerate(reqs):
            if not req.complete:
                stats["incomplete_messages"] += 1
            rid = req.headers.get(header)
            if rid is None:
                stats["requests_without_id"] += 1
                continue
            ex = Exchange(hop, conn, req, resps[i] if i < len(resps) else None)
            try:
                _fill(ex)
            except KeyError as exc:
                ex.problems.append(f"byte not captured: {exc}")
            stats["arrivals_on_a_later_copy"] += sum(1 for k, t in ex.arrive.items() if t != ex.times.get(k))
            for p in ex.problems:
                problems[f"{hop}: {p}"] += 1
            stats["exchanges"] += 1
            slot = by_request.setdefault(rid, {})
            if hop in slot:
                problems[f"{hop}: request id seen twice"] += 1
            slot[hop] = ex
    stats["copies_without_ack"] = sum(st.copies_ambiguous for conn in conns for st in (conn.client, conn.server))
    return Wire(by_request, stats, problems)


def _observer(src: str) -> str:
    ob = src.split("/", 1)[0]
    return "client" if ob.startswith("client:") else ob


def wire_point(wire_req: dict[str, Exchange], point: str, observer: str) -> tuple[int | None, list[int]]:
    """(wire ns, stamps of later packets of the same response) of ``point`` as ``observer`` sees it: when the bytes
    reached it where it receives them (a read), when they were first sent where it sends them (a write)."""
    spec = POINT_WIRE.get(point, {}).get(observer)
    if spec is None:
        return None, []
    ex = wire_req.get(spec[0])
    if ex is None:
        return None, []
    times = ex.arrive if receives(spec[0], spec[1], observer) else ex.times
    return times.get(spec[1]), ex.later_ts.get(spec[1], [])


def receives(hop: str, what: str, observer: str) -> bool:
    """Whether ``observer`` is the receiving end of ``what``'s bytes on ``hop`` (``A>B``: B receives the request,
    A the response)."""
    a, b = hop.split(">")
    name = observer.split(":", 1)[1] if observer.startswith("tap:") else observer
    return name == (b if what.startswith("req") else a)


def tap_delta_wire(wire_req: dict[str, Exchange], name: str) -> int | None:
    from deltatap.collector.deltas import delta_name  # the tap deltas' names (the collector is imported lazily here)

    for link in LINKS:
        d, u = wire_req.get(_d(link)), wire_req.get(_u(link))
        if name == delta_name("tap_request", link):
            if d and u and "req_last" in d.arrive and "req_last" in u.times:  # (read from D, written to U)
                return u.times["req_last"] - d.arrive["req_last"]
            return None
        if name == delta_name("tap_first_token", link):
            if d and u and "first" in d.times and "first" in u.arrive:  # (read from U, written to D)
                return d.times["first"] - u.arrive["first"]
            return None
    return None


@dataclass
class Comparison:
    point_err: dict[str, list[int]]  # point -> row - wire (ns)
    delta_err: dict[str, list[int]]
    later_packet: dict[str, int]  # point -> stamps late by > 0.1 ms that equal a later packet of the same response
    late_over_01: dict[str, int]
    rows_total: int
    rows_compared: int
    rows_skipped_warmup: int
    rows_not_ok: int
    rows_unmatched: list[str]  # request ids
    rows_missing_hops: Counter
    points_not_on_wire: Counter  # row points the wire could not place
    points_unmapped: Counter  # row points with no rule
    deltas_pair_changed: Counter
    wire_requests_without_row: int
    examples: list[dict]
    # honest bounds: per point / delta, how many values were intervals (the row's stamp_bounds) and whether the
    # wire time lay inside each value's interval (widened by STAMP_EXACT_NS per exact end: "exact" means that close)
    point_bounded: Counter = field(default_factory=Counter)
    point_covered: dict[str, list[bool]] = field(default_factory=dict)
    delta_bounded: Counter = field(default_factory=Counter)
    delta_covered: dict[str, list[bool]] = field(default_factory=dict)
    # points whose wire time lies outside the value's interval: late (the row after the interval's end) or early,
    # split by whether the value was stated exact or as an interval, with the first few as examples
    point_outside: Counter = field(default_factory=Counter)  # "<point> late|early exact|interval" -> count
    outside_examples: list[dict] = field(default_factory=list)
    point_unknown: Counter = field(default_factory=Counter)  # values with a side stated unknown (BOUND_UNKNOWN, -1)
    outside_worst_ns: dict[str, int] = field(default_factory=dict)  # "<point> late|early exact|interval" -> max |error|


def compare(rows, wire: Wire, warmup: int = 10, all_outcomes: bool = False) -> Comparison:
    """``all_outcomes``: rows whatever their outcome are compared too (e.g. a non-streamed answer to the load
    generator's streamed request is ``non_sse`` to it, yet every point the taps stamped is still on the wire)."""
    from deltatap.collector.deltas import TAP, delta_defs  # the delta definitions the collector uses

    defs = {d.name: d for d in delta_defs()}
    rows = sorted(rows, key=lambda r: r.start_unix_ns or 0)
    ok = [r for r in rows if all_outcomes or str(r.outcome) == "ok"]
    skipped, kept = ok[:warmup], ok[warmup:]
    point_err: dict[str, list[int]] = {}
    delta_err: dict[str, list[int]] = {}
    later: Counter = Counter()
    late01: Counter = Counter()
    unmatched: list[str] = []
    missing_hops: Counter = Counter()
    not_on_wire: Counter = Counter()
    unmapped: Counter = Counter()
    pair_changed: Counter = Counter()
    examples: list[dict] = []
    point_bounded: Counter = Counter()
    point_covered: dict[str, list[bool]] = {}
    delta_bounded: Counter = Counter()
    delta_covered: dict[str, list[bool]] = {}
    outside: Counter = Counter()
    point_unknown: Counter = Counter()
    outside_worst: dict[str, int] = {}
    outside_examples: list[dict] = []
    row_ids = {r.request_id for r in rows}
    for r in kept:
        w = wire.by_request.get(r.request_id or "")
        if w is None:
            unmatched.append(r.request_id or r.trace_id)
            continue
        for h in HOPS:
            if h not in w:
                missing_hops[h] += 1
        wp: dict[str, int] = {}
        for name, obs in r.points.items():
            ob = _observer(obs.observer if hasattr(obs, "observer") and obs.observer else "")
            if name in NOT_ON_WIRE:
                continue
            if name not in POINT_WIRE or ob not in POINT_WIRE[name]:
                unmapped[f"{name} by {ob or '?'}"] += 1
                continue
            t, later_ts = wire_point(w, name, ob)
            if t is None:
                not_on_wire[name] += 1
                continue
            e = obs.unix_ns - t
            wp[name] = t
            point_err.setdefault(name, []).append(e)
            before, after = r.point_bounds.get(name, (0, 0))
            if before or after:
                point_bounded[name] += 1
            if before < 0 or after < 0:  # a side stated unknown (BOUND_UNKNOWN): no claim that way
                point_unknown[name] += 1
            inside = (after < 0 or -(after + STAMP_EXACT_NS) <= e) and (before < 0 or e <= before + STAMP_EXACT_NS)
            point_covered.setdefault(name, []).append(inside)
            if not inside:
                how = f"{name} {'late' if e > 0 else 'early'} {'interval' if before or after else 'exact'}"
                outside[how] += 1
                outside_worst[how] = max(outside_worst.get(how, 0), abs(e))
                if len(outside_examples) < 40:
                    outside_examples.append({"request_id": r.request_id, "point": name, "observer": ob, "error_ms": e / 1e6,
                                             "before_ms": before / 1e6, "after_ms": after / 1e6})
            if e > 100_000:
                late01[name] += 1
                if any(abs(obs.unix_ns - x) <= LATER_PACKET_TOL_NS for x in later_ts):
                    later[name] += 1
            if abs(e) > THRESHOLD_NS and len(examples) < 40:
                examples.append({"request_id": r.request_id, "point": name, "observer": ob, "error_ms": e / 1e6})
        for name, dv in r.deltas.items():
            d = defs.get(name)
            if d is None or d.signed:
                continue
            if d.phase == TAP:
                wv = tap_delta_wire(w, name)
            else:
                pe, ps = r.points.get(d.end), r.points.get(d.start)
                if pe is None or ps is None:
                    continue
                oe, os_ = _observer(pe.observer), _observer(ps.observer)
                if dv.within_observer and oe != os_:
                    common = set(POINT_WIRE.get(d.end, {})) & set(POINT_WIRE.get(d.start, {}))
                    pair_changed[name] += 1
                    if len(common) != 1:
                        continue
                    oe = os_ = common.pop()
                te, _ = wire_point(w, d.end, oe)
                ts, _ = wire_point(w, d.start, os_)
                wv = te - ts if te is not None and ts is not None else None
            if wv is None:
                continue
            delta_err.setdefault(name, []).append(dv.ns - wv)
            b = r.delta_bounds.get(name, 0)
            if b:
                delta_bounded[name] += 1
            delta_covered.setdefault(name, []).append(b < 0 or abs(dv.ns - wv) <= b + 2 * STAMP_EXACT_NS)  # (b < 0: unknown)
    wire_without_row = sum(1 for rid in wire.by_request if rid not in row_ids)
    return Comparison(point_err, delta_err, dict(later), dict(late01), len(rows), len(kept), len(skipped), len(rows) - len(ok),
                      unmatched, missing_hops, not_on_wire, unmapped, pair_changed, wire_without_row, examples,
                      point_bounded, point_covered, delta_bounded, delta_covered, outside, outside_examples, point_unknown, outside_worst)


def stats(errs: list[int]) -> dict:
    a = np.asarray(errs, dtype=np.int64)
    if not len(a):
        return {"n": 0}
    ab = np.abs(a) / 1e6
    s = a / 1e6
    return {
        "n": int(len(a)),
        "abs_p50_ms": float(np.percentile(ab, 50)), "abs_p99_ms": float(np.percentile(ab, 99)), "abs_max_ms": float(ab.max()),
        "share_over_0_3ms": float(np.mean(ab > THRESHOLD_NS / 1e6)),
        "late_over_0_3ms": int(np.sum(s > THRESHOLD_NS / 1e6)), "early_over_0_3ms": int(np.sum(s < -THRESHOLD_NS / 1e6)),
        "signed_p50_ms": float(np.percentile(s, 50)), "signed_min_ms": float(s.min()), "signed_max_ms": float(s.max()),
    }
