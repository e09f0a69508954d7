"""Deferred accounting (:class:`deltatap.proxy.relay._Watches`, ``defer``/``settle``; issue 15): a request read's
accounting (:meth:`Downstream._account`: the exchanges begun, fingerprints, captures, timers, counters, the stamps
already taken) runs after the tap gave its CPU back — at the next event that touches the pair, a watch round, or the
loop's one timer :data:`relay.ACCOUNT_DELAY_S` later — and must leave exactly what running it at once leaves.

* Network-free, exact: generated requests (Content-Length and chunked bodies, pipelined) cut into reads at random
  points, with the upstream's answers (as ``on_data``, the usual ``data_received`` read and a ``cuts_received`` list),
  loop rounds and timer waits between them, on a real (not started) Tap with relay sides without sockets; with
  deferral on and off, every record after each answer and wait, the counters, what the upstream was sent, and the
  exported spans (attributes and events, times included) are the same. With deferral on, a read that was written
  upstream leaves its account waiting (``d.accounting``), the timer alone runs it, and the ``--timeout-s`` timer
  counts from the read, not from when the account ran.
* Live, on 127.0.0.1: an upstream that answers nothing: the exchange is begun by the timer alone (the tap's
  ``in_flight`` becomes 1 with no other event), and the tap's own timeout answers it.
"""

from __future__ import annotations

import asyncio
import re
import types

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deltatap.net import kstamp
from deltatap.proxy import TapOptions, relay
from deltatap.proxy.relay import Downstream, Upstream
from deltatap.proxy.server import Tap

from test_relay_defer import _Transport as _DeferTransport
from test_relay_defer import _span_view
from test_relay_native import _REC_FIELDS

TIMEOUT_S = 30.0


class _Transport(_DeferTransport):
    """test_relay_defer's transport, and what a downstream side also asks of one here (its peer, write_eof)."""

    def get_extra_info(self, name, default=None):
        return ("127.0.0.1", 5) if name == "peername" else default

    def is_reading(self) -> bool:
        return True

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self.calls.append("write_eof")


class _Kernel:
    """What the relay reads of a kernel-stamped transport here: the latest read's stamps and ``_fatal``."""

    def __init__(self) -> None:
        self.rx_mono_ns: int | None = None
        self.rx_bound_ns = 0
        self.raised: list = []

    def _fatal(self, exc, msg) -> None:
        self.raised.append(repr(exc))


class _Stamped:
    """A side whose writes are kept, each stamped with the next of a counter (never left unplaced)."""

    clock = [10_000_000]

    def send(self, data):
        self.sent.append(bytes(data))
        self.clock[0] += 1_000
        self.last_write_mono, self.last_write_bound = self.clock[0], 3
        return self.clock[0], 3


class _Down(_Stamped, Downstream):
    pass


class _Up(_Stamped, Upstream):
    pass


def _request(body: bytes, chunked: bool, rid: int) -> bytes:
    if chunked:
        framed = (b"%x\r\n%s\r\n" % (len(body), body) if body else b"") + b"0\r\n\r\n"
        return b"POST /v1/chat/completions?stream=1 HTTP/1.1\r\nHost: e\r\nx-request-id: r%d\r\nTransfer-Encoding: chunked\r\n\r\n%s" % (rid, framed)
    return b"POST /v1/chat/completions HTTP/1.1\r\nHost: e\r\nx-request-id: r%d\r\nContent-Length: %d\r\n\r\n%s" % (rid, len(body), body)


def _response(i: int) -> bytes:
    body = b'{"model":"m%d","usage":{"prompt_tokens":3,"completion_tokens":%d}}' % (i, i + 1)
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)


@st.composite
def traffic(draw):
    """Requests on one connection cut into reads; between reads: a loop round, a wait past the account timer, or the
    upstream's answer to the oldest request whose bytes all went (as ``on_data``, ``data_received`` or a cuts list)."""
    reqs = [_request(draw(st.binary(max_size=40)), draw(st.booleans()), i) for i in range(draw(st.integers(1, 3)))]
    stream = b"".join(reqs)
    ends = [sum(len(r) for r in reqs[: i + 1]) for i in range(len(reqs))]
    cuts = sorted(set(draw(st.lists(st.integers(1, len(stream) - 1), max_size=6))))
    reads = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)])]
    steps, fed, answered = [], 0, 0
    for r in reads:
        steps.append(("read", r))
        fed += len(r)
        for _ in range(draw(st.integers(0, 2))):
            kind = draw(st.sampled_from(["round", "wait", "answer"]))
            if kind == "answer":
                if answered < len(reqs) and ends[answered] <= fed:
                    steps.append(("answer", answered, draw(st.sampled_from(["on_data", "read", "cuts"]))))
                    answered += 1
            else:
                steps.append((kind,))
    while answered < len(reqs):
        steps.append(("answer", answered, draw(st.sampled_from(["on_data", "read", "cuts"]))))
        answered += 1
    return steps


def _records(d: Downstream, exs: list) -> list:
    return [(repr([getattr(ex.rec, f) for f in _REC_FIELDS]), ex.request_done, ex.done, ex.forward_pending,
             None if ex.capture is None else bytes(ex.capture), ex.fp.result() if not ex.done else None,
             ex.timer is not None) for ex in exs] + [len(d.exchanges), d.current is not None]


async def _replay(tap: Tap, steps: list, defer: bool) -> tuple[list, list, dict]:
    loop = asyncio.get_running_loop()
    d, up = _Down(tap), _Up(tap)
    assert (up.watches is not None) == defer
    d.sent, up.sent = [], []
    d.transport, up.transport = _Transport(), _Transport()
    d.kernel, up.kernel = _Kernel(), _Kernel()
    d.loop, d.closed = loop, True  # (no socket: no head timer)
    d.up, up.down = up, d
    seen: list = []
    windows: list = []  # the loop's time before and after each read
    timers: dict = {}  # each exchange's --timeout-s deadline, where seen

    def records() -> list:
        for ex in d.exchanges:
            if ex.timer is not None and ex not in timers:
                timers[ex] = ex.timer.when() - TIMEOUT_S
            if ex not in exs:
                exs.append(ex)
        return _records(d, exs)

    exs: list = []
    t = 1_000_000
    for step in steps:
        t += 10_000
        if step[0] == "read":
            n_sent = len(up.sent)
            before = loop.time()
            d.on_data(step[1], t, 5)
            windows.append((before, loop.time()))
            wrote = len(up.sent) > n_sent
            # deferral on: a read written upstream leaves its account waiting (a read of part of a head writes nothing,
            # and this call ran any earlier account first)
            assert d.accounting == (defer and wrote)
            seen.append(("read", d.accounting))
        elif step[0] == "round":
            await asyncio.sleep(0)
        elif step[0] == "wait":
            await asyncio.sleep(relay.ACCOUNT_DELAY_S * 3)
            assert not d.accounting  # (the timer ran it)
            seen.append(("wait", records()))
        else:
            _, i, how = step
            data = _response(i)
            if how == "on_data":
                up.on_data(data, t, 2)
            elif how == "read":
                up.kernel.rx_mono_ns, up.kernel.rx_bound_ns = t, 2
                up.data_received(data)
            else:
                half = len(data) // 2
                up.cuts_received(data, [(0, half, t - 1, 1), (half, len(data), t, 2)])
            await asyncio.sleep(0)  # (the round's deferred watch)
            assert not d.accounting and not up.deferred
            seen.append(("answer", records()))
    await asyncio.sleep(0)
    seen.append(("end", records(), d.kernel.raised, up.kernel.raised))
    # every timeout counts from its request head's read, deferred or not (not from when the account ran)
    assert len(timers) == len(exs) and all(any(b <= at <= a + 1e-6 for b, a in windows) for at in timers.values())
    c = tap.counters
    sent_up = [re.sub(rb"traceparent: 00-[0-9a-f]{32}-[0-9a-f]{16}-", b"traceparent: 00-(ids)-", b) for b in up.sent]  # (new ids each run)
    return seen, [d.sent, sent_up, d.transport.calls, up.transport.calls], {"requests": dict(c.requests), "in_flight": tap.in_flight,
                                                                           "request_bytes": c.request_bytes, "response_bytes": c.response_bytes}


_SETTINGS = settings(max_examples=40, deadline=None, database=None,
                     suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large])


@pytest.mark.timeout(120)
@_SETTINGS
@given(steps=traffic())
def test_deferred_accounts_leave_what_immediate_ones_leave(steps, telemetry, span_exporter, monkeypatch):
    monkeypatch.setattr(relay, "mono", lambda: 4_242)
    monkeypatch.setattr(relay, "ACCOUNT_DELAY_S", 0.002)  # (the "wait" steps: short)
    results = []
    for defer in (True, False):
        span_exporter.clear()
        _Stamped.clock[0] = 10_000_000
        tap = Tap(TapOptions(upstream="http://127.0.0.1:9", link="fw-engine", timeout_s=TIMEOUT_S), telemetry)
        with monkeypatch.context() as m:
            m.setattr(relay, "DEFER_WATCH", defer)
            seen, written, counters = asyncio.run(_replay(tap, steps, defer))
        tap.telemetry.processor.force_flush()
        results.append((seen, written, counters, _span_view(span_exporter.get_finished_spans())))
    on, off = results
    assert [s for s in on[0] if s[0] != "read"] == [s for s in off[0] if s[0] != "read"]
    assert on[1:] == off[1:]
    assert on[2]["in_flight"] == 0 and sum(on[2]["requests"].values()) == sum(1 for s in steps if s[0] == "answer")
    assert any(s == ("read", True) for s in on[0])  # (deferral on: some read's account waited)


async def _second_request_at_upstream(tap, reader, writer, got: asyncio.Event) -> None:
    """The pair's first request answered and ended (its upstream connection opened: a first request's account is run
    at once), then its second written and arrived at the upstream (``got``): the second's account is the one that waits."""
    writer.write(b"GET /x HTTP/1.1\r\nHost: e\r\n\r\n")
    await reader.readuntil(b"\r\n\r\nok")
    for _ in range(200):  # (its exchange ends in the round after the answer's read)
        if tap.tap.in_flight == 0:
            break
        await asyncio.sleep(0.005)
    writer.write(b"GET /x HTTP/1.1\r\nHost: e\r\n\r\n")
    await got.wait()


async def test_the_timer_alone_begins_the_exchange(make_tap):
    """An upstream that reads the request and answers nothing: nothing else happens on the pair, so the timer alone
    runs the account (the exchange is begun, in flight), and the tap's own timeout then answers it."""
    got = asyncio.Event()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")  # (the first request, answered: the pair's upstream connection is open)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await reader.readuntil(b"\r\n\r\n")
        got.set()
        await reader.read()  # (until the tap closes)
        writer.close()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    try:
        tap = await make_tap(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", timeout_s=0.5)
        reader, writer = await asyncio.open_connection("127.0.0.1", tap.port)
        async with asyncio.timeout(10):
            await _second_request_at_upstream(tap, reader, writer, got)
            for _ in range(200):  # (a bounded wait for the timer: ACCOUNT_DELAY_S, a loaded machine's scheduling aside)
                if tap.tap.in_flight == 1:
                    break
                await asyncio.sleep(0.005)
            assert tap.tap.in_flight == 1
            answer = await reader.read()
        assert answer.startswith(b"HTTP/1.1 504 "), answer[:40]
        writer.close()
    finally:
        server.close()


@pytest.mark.skipif(not kstamp.enabled(), reason="a request's account waits only on kernel-stamped reads (DELTATAP_KERNEL_STAMPS=0)")
async def test_close_waits_for_a_request_whose_account_waits(make_tap, monkeypatch):
    """A tap closing while a forwarded request's account waits (a long timer here, so it surely does): close runs it
    first (the request counted in flight since its deferral, session 23), the grace period waits for its answer, and
    the client gets it whole."""
    monkeypatch.setattr(relay, "ACCOUNT_DELAY_S", 30.0)
    got = asyncio.Event()

    async def slow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")  # (the first request: answered at once; the second waits 50 ms)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await reader.readuntil(b"\r\n\r\n")
        got.set()
        await asyncio.sleep(0.05)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await reader.read()
        writer.close()

    server = await asyncio.start_server(slow, "127.0.0.1", 0)
    try:
        tap = await make_tap(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}")
        reader, writer = await asyncio.open_connection("127.0.0.1", tap.port)
        async with asyncio.timeout(10):
            await _second_request_at_upstream(tap, reader, writer, got)
            assert [d.accounting for d in tap.tap.connections] == [True] and tap.tap.in_flight == 1
            await tap.close(grace_s=5)
            answer = await reader.read()
        assert answer.startswith(b"HTTP/1.1 200 OK\r\n") and answer.endswith(b"\r\n\r\nok"), answer
        writer.close()
    finally:
        server.close()


def test_the_timer_is_never_later_than_the_taps_timeout():
    """The backstop timer comes ACCOUNT_DELAY_S after the first account waits, or sooner where the tap's --timeout-s is
    shorter (the timeout's own timer is made by the account); a tap without --timeout-s makes none (session 23)."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        w = relay._Watches(loop)
        d = types.SimpleNamespace(accounting=False)
        t0 = loop.time()
        w.defer((d,), None)
        assert d.accounting and w.timer is None
        w.defer((d,), 30.0)
        assert w.timer.when() >= t0 + relay.ACCOUNT_DELAY_S - 0.002
        w.defer((d,), 60.0)  # (a longer timeout: the same timer)
        first = w.timer
        w.defer((d,), 0.004)  # (a shorter one: a sooner timer)
        assert first.cancelled() and w.timer.when() <= loop.time() + 0.004 + 0.002
        w.accounts.clear()
        w.timer.cancel()

    asyncio.run(main())
