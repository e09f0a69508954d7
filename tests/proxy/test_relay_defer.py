"""Deferred watching (:class:`deltatap.proxy.relay._Watches`): the usual upstream read is forwarded at once and
watched after the loop has handled every I/O callback of the poll round; before any other work touches the pair, its
pending watch runs first. With deferral on and off the records and spans must be identical.

* The loop: on asyncio's own loop and on uvloop, a handle queued by ``call_soon`` from an I/O callback runs after
  every I/O callback of that poll round (a timer due in the same round runs before it: the tap's timers run the
  pair's pending watch first).
* Network-free, exact: one or two connection pairs of a real (not started) Tap with relay sides without sockets, the
  generated responses of ``test_relay_native`` cut into reads, cuts lists and ``on_data`` calls, interleaved across the
  pairs in poll rounds, with the exchange timeout firing and the upstream closing mid-round; after every round the
  records, observers, readers and the exported spans (their attributes and events, times included: the stamps are the
  generated ones) are the same with deferral on and off, and so is what each call raised.
* Live: the same generated traffic through a tap on 127.0.0.1 (chunked and Content-Length SSE streams written in
  bursts across many connections, keep-alive and pipelined exchanges, client cancels, an upstream that closes
  mid-stream, the tap's own timeout) with deferral on and off: the same spans, attribute by attribute, but for the
  values a second run changes anyway (times, read counts).
"""

from __future__ import annotations

import asyncio
import random
import re
import socket
import types

import pytest
import uvloop
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from _pairs import ScriptedDown, socketless_pair, socketless_tap
from tap_helpers import wait_spans
from test_relay_native import _snapshot, cases

from deltatap.core.vocab import Attr
from deltatap.net import kstamp
from deltatap.proxy import relay
from deltatap.proxy.server import Tap


# ---- the loop ---------------------------------------------------------------------------------
async def _round_order() -> list:
    loop = asyncio.get_running_loop()
    pairs = [socket.socketpair() for _ in range(12)]
    log: list = []
    queued = False

    def after_round() -> None:
        nonlocal queued
        queued = False
        log.append("call_soon")

    def readable(i: int) -> None:
        nonlocal queued
        pairs[i][1].recv(16)
        log.append(i)
        if not queued:
            queued = True
            loop.call_soon(after_round)

    try:
        for i, (_a, b) in enumerate(pairs):
            b.setblocking(False)
            loop.add_reader(b.fileno(), readable, i)
        await asyncio.sleep(0.01)
        loop.call_later(0, log.append, "timer")
        for a, _b in pairs:
            a.send(b"x")
        for _ in range(200):  # (bounded: a few ms)
            await asyncio.sleep(0.005)
            if "call_soon" in log:
                break
    finally:
        for a, b in pairs:
            loop.remove_reader(b.fileno())
            a.close()
            b.close()
    return log


@pytest.mark.parametrize("loop_kind", ["asyncio", "uvloop"])
def test_call_soon_runs_after_the_rounds_io_callbacks(loop_kind):
    log = (uvloop.run if loop_kind == "uvloop" else asyncio.run)(_round_order())
    assert sorted(x for x in log if isinstance(x, int)) == list(range(12))
    assert log.index("call_soon") > max(i for i, x in enumerate(log) if isinstance(x, int))  # after every read of the round
    assert log.index("timer") < log.index("call_soon")  # (a timer due in that round comes first: the tap's timers flush)


# ---- network-free, exact -------------------------------------------------------------------------
class _Transport:
    """What the relay sides call on a transport here: nothing is written (the sides' ``send`` is the script's)."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def can_write_eof(self) -> bool:
        return False

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        self.calls.append("close")

    def abort(self) -> None:
        self.calls.append("abort")

    def pause_reading(self) -> None:
        self.calls.append("pause")

    def resume_reading(self) -> None:
        self.calls.append("resume")


@st.composite
def multi(draw):
    """1-2 connection pairs, each with a generated response cut into calls, interleaved into poll rounds; some pairs'
    exchange timeout fires at a drawn call; an upstream that sent a close-delimited body closes in the round after."""
    pairs = [draw(cases()) for _ in range(draw(st.integers(1, 2)))]
    order = [i for i, (calls, _n, _c) in enumerate(pairs) for _ in calls]
    order = draw(st.permutations(order))
    timeouts = {i: draw(st.integers(0, len(c))) for i, (c, _n, _cl) in enumerate(pairs) if draw(st.integers(0, 4)) == 0}
    rounds, cur = [], []
    for i in order:
        cur.append(i)
        if draw(st.booleans()):
            rounds.append(cur)
            cur = []
    if cur:
        rounds.append(cur)
    return pairs, rounds, timeouts


def _span_view(spans) -> list:
    return sorted(repr((s.name, sorted(s.attributes.items()), s.start_time, s.end_time,
                        [(e.name, e.timestamp, sorted((e.attributes or {}).items())) for e in s.events])) for s in spans)


async def _replay_rounds(tap: Tap, case, defer: bool) -> tuple[list, list]:
    """The case's calls with deferral on or off: what each pair raised and left after every round."""
    pairs_in, rounds, timeouts = case
    sides = []
    for calls, n, close in pairs_in:
        up, d, exs = socketless_pair(tap, n, ScriptedDown)
        assert (up.watches is not None) == defer
        d.transport, up.transport = _Transport(), _Transport()
        d.script = [c[2] for c in calls]
        raised: list = []
        kernel = types.SimpleNamespace(rx_mono_ns=None, rx_bound_ns=0, _fatal=lambda exc, msg, raised=raised: raised.append(repr(exc)))
        up.kernel = kernel
        sides.append((up, d, kernel, exs, raised, list(calls), close))
    done = [0] * len(sides)
    seen = []
    for rnd in rounds:
        for p in rnd:
            up, d, kernel, exs, raised, calls, close = sides[p]
            if timeouts.get(p) == done[p]:  # the exchange timeout fires before this call
                # (for the exchange in flight once the pair's pending work is done, as the tap's timer settles it first:
                # picked before that, a deferred run's exchanges[0] could be one an undeferred run had already ended)
                if d.accounting or (d.up is not None and d.up.deferred):
                    d._settle()
                if d.exchanges:
                    d._timed_out(d.exchanges[0])
            kind, group, _write = calls[done[p]]
            done[p] += 1
            try:
                if kind == "read":
                    kernel.rx_mono_ns, kernel.rx_bound_ns = group[0][1], group[0][2]
                    up.data_received(group[0][0])
                elif kind == "on_data":
                    up.on_data(group[0][0], group[0][1], group[0][2])
                else:
                    data, pieces, pos = b"".join(g[0] for g in group), [], 0
                    for piece, t, b in group:
                        pieces.append((pos, pos + len(piece), t, b))
                        pos += len(piece)
                    up.cuts_received(data, pieces)
            except Exception as exc:  # (the same exception, from the same read, either way)
                raised.append(repr(exc))
            if done[p] == len(calls) and close:
                up.on_eof()  # (a close-delimited body ends with the upstream's FIN: its pending watch first)
        await asyncio.sleep(0)  # (the round's deferred watches run)
        seen.append([(_snapshot(up, d, exs), list(raised), up.deferred) for up, d, _k, exs, raised, _c, _cl in sides])
    tap.telemetry.processor.force_flush()
    return seen, [s.transport.calls for s in (x[0] for x in sides)]


_SETTINGS = settings(max_examples=60, deadline=None, database=None,
                     suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large])


@pytest.mark.timeout(300)  # (60 generated cases of up to 2 pairs: ~5 s on a quiet 2-core machine, mostly generating them)
@_SETTINGS
@given(case=multi())
def test_deferred_watches_leave_what_the_undeferred_leave(case, telemetry, span_exporter, monkeypatch):
    monkeypatch.setattr(relay, "mono", lambda: 4_242)  # (a timeout's own stamp: the same either way)
    results = []
    for defer in (True, False):
        span_exporter.clear()
        tap = socketless_tap(telemetry)
        with monkeypatch.context() as m:
            m.setattr(relay, "DEFER_WATCH", defer)
            seen, transport_calls = asyncio.run(_replay_rounds(tap, case, defer))
        results.append((seen, transport_calls, _span_view(span_exporter.get_finished_spans()), tap.counters.requests))
    assert results[0] == results[1]
    assert not any(pending for rnd in results[0][0] for _s, _r, pending in rnd)  # (every round ends with nothing pending)


# ---- live, through a tap on 127.0.0.1 ------------------------------------------------------------
_TICK_S = 0.004  # every live response writes its next event at the same tick: the tap reads them in bursts
_ROLE = b'data: {"id":"c","model":"m","choices":[{"index":0,"delta":{"role":"assistant"}}]}\n\n'
_TOKEN = b'data: {"id":"c","model":"m","choices":[{"index":0,"delta":{"content":"t%d"}}]}\n\n'
_USAGE = b'data: {"id":"c","model":"m","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":%d,"total_tokens":%d}}\n\n'


class _BurstEngine:
    """A raw HTTP/1.1 engine: ``POST /s/<framing>/<tokens>/<end>`` answers an SSE stream of ``tokens`` content
    events (role first, usage and [DONE] last), chunked or with Content-Length, one event per tick for every open
    stream at once; ``end``: ``ok``, ``close`` (the connection closes after half the events) or ``stall`` (the rest
    never comes). Pipelined requests are answered in order."""

    def __init__(self) -> None:
        self.tick = asyncio.Event()
        self.server: asyncio.AbstractServer | None = None
        self.ticker: asyncio.Task | None = None

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.ticker = asyncio.ensure_future(self._tick())
        return self.server.sockets[0].getsockname()[1]

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(_TICK_S)
            self.tick.set()
            self.tick = asyncio.Event()

    async def close(self) -> None:
        self.ticker.cancel()
        self.server.close()
        await self.server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                await reader.readexactly(length)
                _, _s, framing, tokens, end = head.split(b" ")[1].decode().split("/")
                n = int(tokens)
                events = [_ROLE, *[_TOKEN % i for i in range(n)], _USAGE % (n, n + 3), b"data: [DONE]\n\n"]
                cut = len(events) // 2 if end != "ok" else len(events)
                body = b"".join(events)
                if framing == "chunked":
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
                else:
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n" % len(body))
                for ev in events[:cut]:
                    await self.tick.wait()
                    writer.write(b"%x\r\n%s\r\n" % (len(ev), ev) if framing == "chunked" else ev)
                if end == "close":
                    writer.close()
                    return
                if end == "stall":
                    await reader.read()  # (until the tap gives up and closes)
                    return
                if framing == "chunked":
                    writer.write(b"0\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError, ValueError):
            pass
        finally:
            writer.close()


def _request(path: str, rid: str) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: e\r\nx-request-id: {rid}\r\nContent-Type: application/json\r\n"
            f"Content-Length: 2\r\n\r\n{{}}").encode()


async def _client(port: int, kind: str, paths: list[str], rids: list[str]) -> None:
    """One connection: ``single``, ``keepalive`` (one request after the other's end), ``pipelined`` (both at once) or
    ``cancel`` (closed after the first event)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        async with asyncio.timeout(20):
            if kind == "pipelined":
                writer.write(b"".join(_request(p, r) for p, r in zip(paths, rids)))
            for i, (p, r) in enumerate(zip(paths, rids)):
                if kind != "pipelined":
                    writer.write(_request(p, r))
                if kind == "cancel":
                    await reader.readuntil(b"data: ")
                    return
                while True:  # (to this response's end: [DONE] then, if chunked, the last chunk; or the close)
                    line = await reader.readline()
                    if not line:
                        return
                    if line.startswith(b"data: [DONE]"):
                        if "chunked" in p:
                            await reader.readuntil(b"0\r\n\r\n")
                        else:
                            await reader.readexactly(1)
                        break
    except (asyncio.IncompleteReadError, ConnectionError, TimeoutError):
        pass
    finally:
        writer.close()


def _traffic(seed: int) -> list[tuple[str, list[str], list[str]]]:
    rnd = random.Random(seed)
    out = []
    for c in range(40):
        kind = rnd.choice(["single", "single", "keepalive", "pipelined", "cancel"])
        n = 2 if kind in ("keepalive", "pipelined") else 1
        paths = []
        for i in range(n):
            end = rnd.choice(["ok", "ok", "ok", "close", "stall"]) if i == n - 1 and kind != "cancel" else "ok"
            paths.append(f"/s/{rnd.choice(['chunked', 'length'])}/{rnd.randint(1, 12)}/{end}")
        out.append((kind, paths, [f"r{c}-{i}" for i in range(n)]))
    return out


# what a second run changes anyway, deferral or not: times, durations, the order of events of one read (by their
# times), and how the bytes fell into reads
_VARYING = re.compile(r"(_ns|_ms)$|\.gap|overhead|chunks|clock\.|stamp\.bounds|gen_ai\.latency")


def _comparable(span, cancelled: bool) -> tuple:
    attrs = {k: v for k, v in span.attributes.items() if not _VARYING.search(k)}
    if cancelled:  # (how much of the stream passed before the client's close is the race the client set up)
        attrs = {k: v for k, v in attrs.items() if not re.search(r"token|bytes|events|usage|finish|last_token", k)}
        return span.name, sorted(attrs.items()), sorted({e.name for e in span.events} - {"last_token.received", "last_token.forwarded"})
    return span.name, sorted(attrs.items()), sorted(e.name for e in span.events)


async def test_live_traffic_spans_the_same_either_way(make_tap, span_exporter, telemetry, monkeypatch):
    traffic = _traffic(19)
    cancelled = {r for kind, _p, rids in traffic if kind == "cancel" for r in rids}
    runs = []
    rounds = [0]
    original = relay._Watches._round

    def counted(self):
        rounds.append(len(self.items))
        original(self)

    monkeypatch.setattr(relay._Watches, "_round", counted)
    engine = _BurstEngine()
    port = await engine.start()
    try:
        for defer in (True, False):
            monkeypatch.setattr(relay, "DEFER_WATCH", defer)
            span_exporter.clear()
            tap = await make_tap(f"http://127.0.0.1:{port}", timeout_s=2.0)  # (the stalled streams end with it; generous for a loaded machine)
            await asyncio.gather(*(_client(tap.port, kind, paths, rids) for kind, paths, rids in traffic))
            want = sum(len(rids) for _k, _p, rids in traffic)
            spans = await wait_spans(span_exporter, telemetry, want, timeout_s=10)
            by_id = {s.attributes.get(Attr.REQUEST_ID): s for s in spans}
            runs.append({r: _comparable(s, r in cancelled) for r, s in by_id.items()})
            await tap.close(grace_s=1)
    finally:
        await engine.close()
    assert len(runs[0]) == sum(len(rids) for _k, _p, rids in traffic)
    assert {r: v for r, v in runs[0].items() if runs[1].get(r) != v} == {r: v for r, v in runs[1].items() if runs[0].get(r) != v}
    if kstamp.enabled():  # (watches are deferred only for kernel-stamped reads)
        assert max(rounds) >= 2  # (deferral on: the reads of several streams were forwarded in one round before their watches)
    outcomes = {dict(v[1]).get(Attr.OUTCOME) for v in runs[0].values()}
    assert len(outcomes) >= 3, outcomes  # (the traffic reached completed, cancelled, upstream-error and timeout paths)
