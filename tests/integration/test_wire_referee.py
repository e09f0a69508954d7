"""The wire referee (benchmarks/wire_referee.py) on a small run: what is deterministic about it.

A short run of the whole chain -- ``deltatap load`` -> tap -> plain aiohttp gateway -> tap -> plain
firewall -> tap -> plain engine (role-only chunk, first token, 2 ms gaps), ``deltatap collect``, tcpdump
on loopback -- and checks that the referee itself works: the capture lost nothing, every TCP stream
reassembles without holes or conflicting retransmissions, every request is found on all six hops by
its ``x-request-id`` with byte-identical bodies (the taps and the plain proxies forward bytes
unchanged), the wire times are causal along the path, every row is matched to packets and every one
of its points is found on the wire. How far the rows are from the wire (the accuracy figures) is the
benchmark's to report, never asserted here: it depends on how busy the machine is.

The fast tests at the bottom check the pcap reader and the reassembly on synthetic packets (out of
order, retransmitted, chunked bodies, SSE events split across packets).
"""

from __future__ import annotations

import os
import struct
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from deltatap.app.referee.capture import tcpdump_path  # noqa: E402
from deltatap.app.referee.compare import HOPS, NOT_ON_WIRE, compare, load_wire  # noqa: E402
from deltatap.app.referee.pcap import ACK, PSH, SYN, read_tcp  # noqa: E402
from deltatap.app.referee.reassembly import first_last_content, parse_requests, parse_responses, reassemble, sse_events  # noqa: E402

REQUESTS = 60
RATE = 20.0


def _can_capture() -> str | None:
    if sys.platform != "linux":
        return "loopback capture needs Linux"
    if tcpdump_path() is None:
        return "tcpdump is not installed"
    if os.geteuid() != 0:
        return "tcpdump needs root (or CAP_NET_RAW)"
    return None


@pytest.fixture(scope="module")
def referee_run(tmp_path_factory):
    why = _can_capture()
    if why:
        pytest.skip(why)
    from deltatap.app.referee.chain import ChainConfig, run_chain
    from deltatap.collector.sinks import read_rows

    work = tmp_path_factory.mktemp("referee")
    run = run_chain(ChainConfig(rate=RATE, requests=REQUESTS, gap_ms=2.0, output_tokens=(4, 10), max_wall_s=100.0), work, log=lambda *_: None)
    wire = load_wire(run.pcap, run.ports)
    rows = read_rows(run.rows_path)
    return run, wire, rows, compare(rows, wire, warmup=0)


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_capture_and_reassembly_are_complete(referee_run):
    run, wire, _rows, _comp = referee_run
    assert run.capture_counts.get("dropped_by_kernel", 0) == 0, run.capture_counts
    st = wire.stats
    assert st["holes"] == 0 and st["inconsistent_overlaps"] == 0, st
    assert st["incomplete_messages"] == 0 and st["unparsed_bytes"] == 0 and st["requests_without_id"] == 0, st
    assert not wire.problems, wire.problems
    assert st["exchanges"] == len(HOPS) * REQUESTS, st
    assert len(wire.by_request) == REQUESTS
    for rid, hops in wire.by_request.items():
        assert set(hops) == set(HOPS), (rid, sorted(hops))
        # the taps and the plain proxies forward the bytes unchanged: same request body, same SSE payloads
        bodies = {hops[h].req.body for h in HOPS}
        assert len(bodies) == 1, rid
        payloads = {tuple(e.data for e in sse_events(hops[h].resp.body)) for h in HOPS}
        assert len(payloads) == 1, rid
        events = sse_events(hops["fw-engine>engine"].resp.body)
        assert events[0].text == "" and '"role":"assistant"' in events[0].data  # the role-only chunk is no token
        assert events[-1].data == "[DONE]"


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_wire_times_are_causal_along_the_path(referee_run):
    _run, wire, _rows, _comp = referee_run
    for rid, hops in wire.by_request.items():
        t = [hops[h].times for h in HOPS]
        for a, b in zip(t, t[1:]):  # each request leaves a hop before it can enter the next
            assert a["req_first"] <= b["req_first"] and a["req_last"] <= b["req_last"], rid
        for a, b in zip(t[1:], t):  # the first and last token come back from the engine outwards
            assert b["first"] >= a["first"] and b["last"] >= a["last"], rid
            assert a["first"] <= a["last"]


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_every_row_and_point_is_matched_to_packets(referee_run):
    _run, wire, rows, comp = referee_run
    assert len(rows) == REQUESTS and comp.rows_not_ok == 0
    assert comp.rows_compared == REQUESTS
    assert comp.rows_unmatched == [] and not comp.rows_missing_hops
    assert comp.wire_requests_without_row == 0
    assert not comp.points_unmapped, comp.points_unmapped
    assert not comp.points_not_on_wire, comp.points_not_on_wire
    expected = {p for r in rows for p in r.points if p not in NOT_ON_WIRE}
    assert set(comp.point_err) == expected
    assert all(len(v) == REQUESTS for v in comp.point_err.values())
    for name in ("gateway_inbound", "firewall_inbound", "engine_ttft", "firewall_outbound", "gateway_outbound", "system_ttft",
                 "output_path_overhead", "tap_edge_request", "tap_fw-engine_first_token"):
        assert len(comp.delta_err.get(name, [])) == REQUESTS, name


# ---------------------------------------------------------------- fast: synthetic packets


def _pcap(path: Path, packets: list[tuple[int, tuple[int, int], int, int, bytes]]) -> None:
    """Ethernet/IPv4/TCP packets: (ts_ns, (sport, dport), seq, flags, payload)."""
    out = bytearray(struct.pack("<IHHiIII", 0xA1B23C4D, 2, 4, 0, 0, 262144, 1))
    for ts, (sp, dp), seq, flags, payload in packets:
        tcp = struct.pack("!HHIIHHHH", sp, dp, seq, 0, (5 << 12) | flags, 65535, 0, 0) + payload
        ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(tcp), 0, 0x4000, 64, 6, 0, bytes([127, 0, 0, 1]), bytes([127, 0, 0, 1])) + tcp
        frame = b"\0" * 12 + b"\x08\x00" + ip
        out += struct.pack("<IIII", ts // 1_000_000_000, ts % 1_000_000_000, len(frame), len(frame)) + frame
    path.write_bytes(out)


def test_reassembly_orders_segments_keeps_first_stamps_and_maps_body_bytes(tmp_path):
    req = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Request-ID: r1\r\nContent-Length: 5\r\n\r\nhello"
    ev1 = b'data: {"choices":[{"delta":{"role":"assistant"}}]}\n\n'
    ev2 = b'data: {"choices":[{"delta":{"content":"Hi"}}]}\n\n'
    ev3 = b"data: [DONE]\n\n"
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    c1 = f"{len(ev1):x}\r\n".encode() + ev1 + b"\r\n"
    c2 = f"{len(ev2):x}\r\n".encode() + ev2 + b"\r\n"
    c3 = f"{len(ev3):x}\r\n".encode() + ev3 + b"\r\n0\r\n\r\n"
    cs, ss = 1000, 5000  # initial sequence numbers
    split = len(c2) - 5  # the first token's event ends in the packet after
    pk = [
        (1_000, (40000, 8080), cs, SYN, b""),
        (1_100, (8080, 40000), ss, SYN | ACK, b""),
        (2_000, (40000, 8080), cs + 1 + 10, ACK | PSH, req[10:]),  # out of order
        (2_100, (40000, 8080), cs + 1, ACK | PSH, req[:10]),
        (3_000, (8080, 40000), ss + 1, ACK | PSH, head + c1),
        (4_000, (8080, 40000), ss + 1 + len(head + c1), ACK | PSH, c2[:split]),
        (5_000, (8080, 40000), ss + 1 + len(head + c1) + split, ACK | PSH, c2[split:] + c3),
        (6_000, (8080, 40000), ss + 1 + len(head + c1), ACK | PSH, c2[:split]),  # a retransmission: stamp stays 4_000
    ]
    p = tmp_path / "t.pcap"
    _pcap(p, pk)
    segs = list(read_tcp(p))
    assert [s.ts_ns for s in segs] == [x[0] for x in pk]
    conns, _ = reassemble(segs)
    assert len(conns) == 1
    c = conns[0]
    assert c.server_port == 8080 and c.client.data == req
    assert c.server.retransmitted_bytes == split and c.server.inconsistent == 0 and c.server.holes == 0
    reqs = parse_requests(c.client)
    resps = parse_responses(c.server, reqs)
    assert reqs[0].headers["x-request-id"] == "r1" and reqs[0].body == b"hello"
    assert c.client.ts_at(reqs[0].start) == 2_100 and c.client.ts_at(reqs[0].last) == 2_000
    assert resps[0].complete and resps[0].body == ev1 + ev2 + ev3
    first, last = first_last_content(sse_events(resps[0].body))
    assert first is last and first.text == "Hi"
    assert c.server.ts_at(resps[0].stream_offset(first.end)) == 5_000  # the packet with the event's last byte
    assert c.server.ts_at(resps[0].stream_offset(first.end - len(ev2) + 1)) == 4_000


def _pcap_acks(path: Path, packets: list[tuple[int, tuple[int, int], int, int, int, bytes, bytes]]) -> None:
    """As :func:`_pcap` with an ACK number and TCP options: (ts_ns, (sport, dport), seq, ack, flags, options, payload)."""
    out = bytearray(struct.pack("<IHHiIII", 0xA1B23C4D, 2, 4, 0, 0, 262144, 1))
    for ts, (sp, dp), seq, ack, flags, opts, payload in packets:
        opts = opts + b"\x01" * (-len(opts) % 4)
        tcp = struct.pack("!HHIIHHHH", sp, dp, seq, ack, ((5 + len(opts) // 4) << 12) | flags, 65535, 0, 0) + opts + payload
        ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(tcp), 0, 0x4000, 64, 6, 0, bytes([127, 0, 0, 1]), bytes([127, 0, 0, 1])) + tcp
        frame = b"\0" * 12 + b"\x08\x00" + ip
        out += struct.pack("<IIII", ts // 1_000_000_000, ts % 1_000_000_000, len(frame), len(frame)) + frame
    path.write_bytes(out)


@pytest.mark.parametrize("ack", ["none", "before", "after", "after-dsack"])
def test_a_retransmitted_byte_arrives_with_the_copy_the_receivers_ack_answers(tmp_path, ack):
    # a response byte sent at 3_000 and again at 9_000 (tcpdump on loopback captures a packet as it is sent; the first
    # copy may still be dropped on the way in): which copy arrived is told by the receiver's first ACK covering it
    cs, ss = 1000, 5000
    data = b"0123456789"
    sack = lambda a, b: b"\x01\x01\x05\x0a" + struct.pack("!II", a, b)  # noqa: E731  (NOP NOP, SACK one block)
    pk = [(1_000, (40000, 8080), cs, 0, SYN, b"", b""), (1_100, (8080, 40000), ss, cs + 1, SYN | ACK, b"", b""),
          (3_000, (8080, 40000), ss + 1, cs + 1, ACK | PSH, b"", data)]
    if ack == "before":  # the first copy acked before the retransmission: a spurious retransmission
        pk.append((4_000, (40000, 8080), cs + 1, ss + 11, ACK, b"", b""))
    pk.append((9_000, (8080, 40000), ss + 1, cs + 1, ACK | PSH, b"", data))
    if ack == "after":  # acked only after the second copy: the first was lost
        pk.append((9_010, (40000, 8080), cs + 1, ss + 11, ACK, b"", b""))
    if ack == "after-dsack":  # acked after the second copy, reporting it a duplicate (D-SACK): the first had arrived
        pk.append((9_010, (40000, 8080), cs + 1, ss + 11, ACK, sack(ss + 1, ss + 11), b""))
    p = tmp_path / "r.pcap"
    _pcap_acks(p, pk)
    segs = list(read_tcp(p))
    assert segs[-1].sack == ((ss + 1, ss + 11),) if ack == "after-dsack" else segs[-1].sack == ()
    conns, _ = reassemble(segs)
    srv = conns[0].server
    assert srv.data == data and srv.retransmitted_bytes == len(data)
    assert srv.departure_at(4) == 3_000  # first sent
    assert srv.arrival_at(4) == (9_000 if ack == "after" else 3_000)
    assert srv.copies_ambiguous == (1 if ack == "none" else 0)


def test_which_end_of_a_hop_receives_the_bytes():
    from deltatap.app.referee.compare import receives

    assert receives("client>edge", "req_last", "tap:edge") and not receives("client>edge", "first", "tap:edge")
    assert receives("edge>gateway", "first", "tap:edge") and not receives("edge>gateway", "req_last", "tap:edge")
    assert receives("client>edge", "first", "client") and not receives("client>edge", "req_last", "client")
    assert receives("gw-fw>firewall", "last", "tap:gw-fw") and receives("gateway>gw-fw", "req_first", "tap:gw-fw")
