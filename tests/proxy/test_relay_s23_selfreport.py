"""Is the hop bound a bound? (``deltatap.overhead.hop_ns``, :meth:`deltatap.proxy.record.TapRecord.overheads`; issue 15,
session 23.) Each of the tap's two forwarding writes (the request's last byte upstream, the first token downstream) is
stamped at its issue with a bound (issue -> the send's return), or placed at its departure from the packet log
(bound 0). On loopback the receiver's kernel takes the bytes in inside the sender's ``send``, so the peer's kernel
receive stamp of them lies in ``[stamp, stamp + bound]`` for a write stamped at its issue; for a placed write it lies
after the departure (docs/tap.md "Overhead": its delivery is not counted, the bound falls short there).

Live, on 127.0.0.1: through a tap to a raw upstream that reads with the kernel's receive stamps (the tap's own
``SO_TIMESTAMPING`` flags, converted to the tap's clock as the tap converts its own), and a raw client likewise;
requests with a one-token SSE answer. Usual sends, and every send counted slow (as tests/kernel's
``slow_sends_over(0)``) so that the packet log places both writes. The span's ``hop_ns`` is the two writes' bounds.
"""

from __future__ import annotations

import asyncio
import socket
import threading

import pytest

from deltatap.core.vocab import Attr, TapEvent
from deltatap.net import kstamp, pktstamp
from deltatap.proxy.record import TapRecord

from slow_client_rig import record_finishes
from tap_helpers import wait_spans

TIMEOUT_S = 10.0
SLACK_NS = 2_000  # the two clocks' conversion (one offset for the process, measured over a reading pair)


def _stamping(sock: socket.socket) -> None:
    """The kernel's software receive stamps on ``sock``'s reads (as the tap's own sockets: ``kstamp.RX_FLAGS``)."""
    sock.setsockopt(socket.SOL_SOCKET, pktstamp.SO_TIMESTAMPING, kstamp.RX_FLAGS)


def _recv_stamped(sock: socket.socket) -> tuple[bytes, int]:
    """One read and the kernel's receive stamp of its last packet (mono ns, converted as the tap converts its own:
    ``kstamp._to_mono``, one offset between the clocks for the process)."""
    data, anc, _flags, _addr = sock.recvmsg(65536, pktstamp._ANCBUF)
    wall = pktstamp.kernel_ns(anc)
    assert wall or not data, "no receive stamp on the read"
    return data, kstamp._to_mono(wall)


_EVENT = b'data: {"choices":[{"delta":{"content":"hi"}}]}\n\n'


def _raw_upstream(listener: socket.socket, n: int, arrivals: list[int]) -> None:
    """Answer ``n`` requests (no body), each with an SSE stream of one token, on the connections the tap opens (one
    it opens at its start and closes is passed over); keep each request's arrival (the kernel stamp of the read that
    completed its head)."""
    listener.settimeout(TIMEOUT_S)
    while len(arrivals) < n:
        conn, _ = listener.accept()
        with conn:
            conn.settimeout(TIMEOUT_S)
            buf = b""
            while len(arrivals) < n:
                while b"\r\n\r\n" not in buf:
                    data, t = _recv_stamped(conn)
                    if not data:
                        break
                    buf += data
                if b"\r\n\r\n" not in buf:
                    break  # (the connection ended: the next)
                buf = buf.split(b"\r\n\r\n", 1)[1]
                arrivals.append(t)
                chunk = b"%x\r\n%s\r\n" % (len(_EVENT), _EVENT)
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n" + chunk)
                done = b"data: [DONE]\n\n"
                conn.sendall(b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done))


async def _run(make_tap, span_exporter, telemetry, n: int) -> tuple[list[TapRecord], list[int], list[int], dict]:
    """``n`` requests through a tap to the raw upstream on one client connection: the records, the upstream's arrival
    of each request, the client's arrival of each first token, the spans by request id."""
    listener = socket.create_server(("127.0.0.1", 0))
    _stamping(listener)  # (before any byte: its connection's first read is stamped too)
    arrivals: list[int] = []
    th = threading.Thread(target=_raw_upstream, args=(listener, n, arrivals), daemon=True)
    th.start()
    try:
        tap = await make_tap(f"http://127.0.0.1:{listener.getsockname()[1]}")
        seen = record_finishes(tap)
        client = socket.socket()
        _stamping(client)
        client.settimeout(TIMEOUT_S)
        client.connect(("127.0.0.1", tap.port))
        firsts: list[int] = []

        def one() -> None:  # (blocking, in a thread: the tap's loop runs meanwhile)
            client.sendall(b"GET /v1/chat/completions HTTP/1.1\r\nHost: e\r\n\r\n")
            got, first = b"", None
            while not got.endswith(b"0\r\n\r\n"):
                data, t = _recv_stamped(client)
                assert data, got
                if first is None and b"content" in got + data:
                    # the read's stamp is its last packet's: where the tap's next write (the stream's end) came in the
                    # same read, the kernel merged them and the first token's own arrival is not known (-1: not checked)
                    first = t if b"[DONE]" not in data else -1
                got += data
            firsts.append(first)

        loop = asyncio.get_running_loop()
        async with asyncio.timeout(TIMEOUT_S):
            for _ in range(n):
                await loop.run_in_executor(None, one)
            spans = await wait_spans(span_exporter, telemetry, n)
        client.close()
    finally:
        listener.close()
    th.join(TIMEOUT_S)
    assert len(seen) == n == len(arrivals) == len(firsts)
    return seen, arrivals, firsts, {sp.attributes[Attr.REQUEST_ID]: sp for sp in spans}


@pytest.mark.parametrize("all_slow", [False, True], ids=["usual", "all-placed"])
async def test_the_hop_bound_against_the_peers_kernel_arrival(make_tap, span_exporter, telemetry, monkeypatch, all_slow):
    if not kstamp.enabled():
        pytest.skip("no kernel stamps")
    if all_slow:
        if pktstamp.packet_log() is None:
            pytest.skip("the packet log needs CAP_NET_RAW")
        default = kstamp._SLOW_SEND_NS
        monkeypatch.setattr(kstamp, "_SLOW_SEND_NS", 0)  # (every send slow: each forwarding write placed)
        if kstamp._send is not None:
            kstamp._pktacc.write_setup(kstamp.SLOW_SENDS, 0)
    placed_before = kstamp.SLOW_SENDS["packets"]
    try:
        seen, arrivals, firsts, spans = await _run(make_tap, span_exporter, telemetry, 5)
    finally:
        if all_slow and kstamp._send is not None:
            kstamp._pktacc.write_setup(kstamp.SLOW_SENDS, default)
    issued = 0
    for rec, arrival, first in zip(seen, arrivals, firsts):
        s = rec.stream
        req_bound = rec.bounds[TapEvent.REQUEST_FORWARDED][1]
        ft_bound = s.first_token_forwarded_bound_ns
        assert spans[rec.request_id].attributes[Attr.OVERHEAD_HOP_NS] == req_bound + ft_bound
        for what, stamp, bound, got in (("request", rec.forwarded, req_bound, arrival),
                                        ("first token", s.first_token_forwarded_mono_ns, ft_bound, first)):
            if got == -1:
                continue
            assert got >= stamp - SLACK_NS, (what, got - stamp, bound)  # (never before the write's stamp)
            # stamped at its issue, or placed at its departure (session 25: the bound then reaches the send's return):
            # either way the peer had the bytes when the send returned
            assert bound >= 0 and got <= stamp + bound + SLACK_NS, (what, got - stamp, bound)
            issued += 1
    assert issued > 0
    if all_slow:
        assert kstamp.SLOW_SENDS["packets"] > placed_before  # (the packet log placed some: the case was met)


@pytest.mark.skipif(not kstamp.enabled(), reason="a request's account is deferred only on kernel-stamped reads (DELTATAP_KERNEL_STAMPS=0)")
async def test_without_timeout_a_deferred_account_makes_no_timer_and_is_counted_in_flight(make_tap, span_exporter, telemetry):
    """A tap without ``--timeout-s`` (session 23): a forwarded request's account waits for the pair's next event with no
    backstop timer on the loop, its request counted in flight from the forward; the upstream's answer runs it first, and
    the exchange ends whole (its span has the request's events and the forwarded stamp)."""
    from deltatap.proxy import relay

    got = asyncio.Event()
    answer = asyncio.Event()

    async def upstream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")  # (the first request, answered: the pair's upstream connection is open)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await reader.readuntil(b"\r\n\r\n")
        got.set()
        await answer.wait()
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await reader.read()
        writer.close()

    server = await asyncio.start_server(upstream, "127.0.0.1", 0)
    try:
        tap = await make_tap(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}")
        assert tap.tap.o.timeout_s is None
        reader, writer = await asyncio.open_connection("127.0.0.1", tap.port)
        async with asyncio.timeout(TIMEOUT_S):
            writer.write(b"GET /a HTTP/1.1\r\nHost: e\r\n\r\n")
            await reader.readuntil(b"\r\n\r\nok")
            for _ in range(200):  # (the first exchange ends in the round after its answer's read)
                if tap.tap.in_flight == 0:
                    break
                await asyncio.sleep(0.005)
            writer.write(b"GET /b HTTP/1.1\r\nHost: e\r\n\r\n")
            await got.wait()
            await asyncio.sleep(0.05)  # (longer than ACCOUNT_DELAY_S: no timer ran it meanwhile)
            w = relay._loop_watches.get(asyncio.get_running_loop())
            (d,) = tap.tap.connections
            assert d.accounting and w is not None and len(w.accounts) == 1 and w.timer is None
            assert tap.tap.in_flight == 1 and not d.exchanges  # (in flight, its exchange not begun yet)
            answer.set()
            assert (await reader.readuntil(b"\r\n\r\nok")).startswith(b"HTTP/1.1 200 OK\r\n")
            spans = await wait_spans(span_exporter, telemetry, 2)
        assert not d.accounting and tap.tap.in_flight == 0 and not w.accounts
        sp = next(sp for sp in spans if sp.attributes.get("url.path") == "/b")
        names = [e.name for e in sp.events]
        assert str(TapEvent.REQUEST_RECEIVED) in names and str(TapEvent.REQUEST_FORWARDED) in names
        writer.close()
    finally:
        server.close()
