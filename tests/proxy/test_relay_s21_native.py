"""The usual upstream read in C (session 21): ``Upstream.data_received``, ``Upstream.cuts_received``,
``_Watches.run`` and ``_Watches._round`` as the C methods of ``deltatap.proxy._relay`` (``reads_setup``) against their
definitions in relay.py (``relay._py_data_received``, ``relay._py_cuts_received``, ``relay._py_run``,
``relay._py_round``), both with deferral on.

* Network-free, exact: the generated connection pairs and poll rounds of test_relay_defer (responses of
  test_relay_native cut into reads, cuts lists and ``on_data`` calls, exchange timeouts, upstream closes) through the
  C methods and through the definitions: after every round the records, observers, readers, what each call raised,
  what each watch that raised handed to the transport's ``_fatal``, and the exported spans are identical.
* A watch that raises (the observer's ``take``) goes to ``up.kernel._fatal(exc, "protocol.data_received() failed")``
  and the rest of the round's watches still run, the same either way.
* No Python frame: a usual body read of a streamed response (its forward, stamps, deferral and its watch), and a
  cuts list of body pieces, run no Python function of the relay (only the test's scripted ``send``).
* Live, through a tap on 127.0.0.1: an SSE response with the C methods and with the definitions gives the client
  the same bytes and the spans the same tokens, usage, chunk and byte counts.
"""

from __future__ import annotations

import asyncio
import sys
import types

import pytest
from hypothesis import given
from _pairs import ScriptedDown, socketless_pair, socketless_tap
from test_relay_defer import _SETTINGS, _replay_rounds, _span_view, multi
from test_relay_native import _STREAM, _Bomb, _snapshot, live_stream_attrs

from deltatap.core.sse import StreamObserver
from deltatap.core.vocab import Attr
from deltatap.proxy import relay
from deltatap.proxy.relay import Upstream, _Watches

pytestmark = pytest.mark.skipif(getattr(relay, "_py_run", None) is None,
                                reason="deltatap.proxy._relay is not built or DELTATAP_NATIVE turns it off")


def _definitions(m: pytest.MonkeyPatch) -> None:
    """relay.py's Python methods in place of the C ones."""
    m.setattr(Upstream, "data_received", relay._py_data_received)
    m.setattr(Upstream, "cuts_received", relay._py_cuts_received)
    m.setattr(_Watches, "run", relay._py_run)
    m.setattr(_Watches, "_round", relay._py_round)


def test_the_c_methods_are_in_place():
    assert type(Upstream.__dict__["data_received"]).__name__ == "method_descriptor"
    assert type(_Watches.__dict__["run"]).__name__ == "method_descriptor"
    assert type(Upstream.__dict__["cuts_received"]).__name__ == "method_descriptor"
    assert type(_Watches.__dict__["_round"]).__name__ == "method_descriptor"
    assert relay._py_data_received.__module__ == relay.__name__ and relay._py_run.__qualname__ == "_Watches.run"


@pytest.mark.timeout(300)  # (60 generated cases of up to 2 pairs: a few s on a quiet 2-core machine)
@_SETTINGS
@given(case=multi())
def test_c_reads_leave_what_the_definitions_leave(case, telemetry, span_exporter, monkeypatch):
    monkeypatch.setattr(relay, "mono", lambda: 4_242)  # (a timeout's own stamp: the same either way)
    monkeypatch.setattr(relay, "DEFER_WATCH", True)
    results = []
    for native in (True, False):
        span_exporter.clear()
        tap = socketless_tap(telemetry)
        with monkeypatch.context() as m:
            if not native:
                _definitions(m)
            seen, transport_calls = asyncio.run(_replay_rounds(tap, case, True))
        results.append((seen, transport_calls, _span_view(span_exporter.get_finished_spans()), tap.counters.requests))
    assert results[0] == results[1]


class _Loop:
    """A loop that only queues: each call_soon kept, run when the test says (one poll round)."""

    def __init__(self) -> None:
        self.soon: list = []

    def call_soon(self, fn, *args):
        self.soon.append((fn, args))

    def round(self) -> None:
        soon, self.soon = self.soon, []
        for fn, args in soon:
            fn(*args)


def _pairs_on(loop: _Loop, tap, n_pairs: int):
    w = relay._Watches(loop)  # type: ignore[arg-type]
    sides = []
    for _ in range(n_pairs):
        up, d, exs = socketless_pair(tap, 1, ScriptedDown)
        up.watches = w
        fatal: list = []
        up.kernel = types.SimpleNamespace(rx_mono_ns=None, rx_bound_ns=0,
                                          _fatal=lambda exc, msg, fatal=fatal: fatal.append((repr(exc), msg, repr(sys.exc_info()[1]))))
        sides.append((up, d, exs, fatal))
    return w, sides


def test_a_watch_that_raises_goes_to_fatal_and_the_rest_run(telemetry, monkeypatch):
    """The first pair's record counter fails on every body piece longer than 40 bytes (test_relay_native's _Bomb):
    each such watch goes to its transport's _fatal, the second pair's watches of the same rounds still run."""
    results = []
    for native in (True, False):
        with monkeypatch.context() as m:
            if not native:
                _definitions(m)
            tap = socketless_tap(telemetry)
            loop = _Loop()
            w, sides = _pairs_on(loop, tap, 2)
            sides[0][2][0].rec.response_bytes = _Bomb(0)
            seen = []
            t = 1_000_000
            for i, piece in enumerate(_STREAM):
                for j, (up, d, exs, fatal) in enumerate(sides):  # both pairs read in the same round
                    d.script = [(t + 10 * i + j + 5, 0, False)]
                    up.kernel.rx_mono_ns, up.kernel.rx_bound_ns = t + 10 * i + j, 0
                    up.data_received(piece)
                seen.append((len(loop.soon), len(w.items), [up.deferred for up, *_ in sides]))
                loop.round()
                seen.append([(_snapshot(up, d, exs), list(fatal), up.deferred) for up, d, exs, fatal in sides])
            results.append((seen, sides[1][2][0].done, sides[1][2][0].rec.stream.tokens))
    assert results[0] == results[1]
    fatal = results[0][0][-1][0][1]
    assert len(fatal) == len(_STREAM) - 2 and fatal[0][1] == "protocol.data_received() failed"
    assert fatal[0][0] == "_Boom('a counter failed')"
    assert fatal[0][2] == fatal[0][0]  # (sys.exc_info() is the exception while _fatal runs, as in an except block)
    assert results[0][0][-1][1][1] == [] and results[0][1:] == (True, 6)  # (the other pair's watches ran, unharmed)
    assert results[0][0][0] == (1, 2, [True, True])  # (one call_soon for the round's two reads)


@pytest.mark.skipif(not StreamObserver._native, reason="deltatap.core._content is not built or turned off")
def test_a_body_read_runs_no_python_frame_of_the_relay(telemetry):
    tap = socketless_tap(telemetry)
    loop = _Loop()
    w, sides = _pairs_on(loop, tap, 1)
    up, d, exs, _fatal = sides[0]
    t = 1_000_000
    calls: list[str] = []

    def profile(frame, event, arg):
        if event == "call":
            calls.append(f"{frame.f_code.co_filename.rsplit('/', 1)[-1]}:{frame.f_code.co_name}")

    for i, piece in enumerate(_STREAM):
        d.script = [(t + 10 * i + 5, 0, False)]
        up.kernel.rx_mono_ns = t + 10 * i
        if 0 < i < len(_STREAM) - 1:  # (the body reads: between the head and the read that ends the message)
            sys.setprofile(profile)
            try:
                up.data_received(piece)
                loop.round()
            finally:
                sys.setprofile(None)
        else:
            up.data_received(piece)
            loop.round()
    assert exs[0].done and exs[0].rec.stream.tokens == 6
    ours = {c for c in calls if not c.startswith("test_relay_s21_native.py:")}  # (the test's loop)
    assert ours == {"_pairs.py:send"}, calls  # (the scripted write)


@pytest.mark.skipif(not StreamObserver._native, reason="deltatap.core._content is not built or turned off")
def test_a_cuts_list_of_body_pieces_runs_no_python_frame_of_the_relay(telemetry):
    tap = socketless_tap(telemetry)
    up, d, exs = socketless_pair(tap, 1, ScriptedDown)
    up.kernel = types.SimpleNamespace(rx_mono_ns=None, rx_bound_ns=0)
    t = 1_000_000
    calls: list[str] = []

    def profile(frame, event, arg):
        if event == "call":
            calls.append(f"{frame.f_code.co_filename.rsplit('/', 1)[-1]}:{frame.f_code.co_name}")

    def cuts(group, at):
        data, pieces, pos = b"".join(group), [], 0
        for k, p in enumerate(group):
            pieces.append((pos, pos + len(p), at + k, 0))
            pos += len(p)
        d.script = [(at + 99, 0, False)]
        up.cuts_received(data, pieces)

    cuts(_STREAM[:1], t)  # (the head: Python's)
    sys.setprofile(profile)
    try:
        cuts(_STREAM[1:-1], t + 1000)
    finally:
        sys.setprofile(None)
    cuts(_STREAM[-1:], t + 2000)  # (the message's end: Python's)
    assert exs[0].done and exs[0].rec.stream.tokens == 6
    assert {c for c in calls if not c.startswith("test_relay_s21_native.py:")} == {"_pairs.py:send"}, calls


async def test_live_stream_records_the_same_either_way(make_tap, span_exporter, telemetry, monkeypatch):
    attrs = await live_stream_attrs(make_tap, span_exporter, telemetry, lambda: _definitions(monkeypatch), pause_s=0.002)
    keys = (Attr.GENAI_OUTPUT_TOKENS, Attr.GENAI_INPUT_TOKENS, Attr.BODY_BYTES_OUT, Attr.HTTP_STATUS, Attr.OUTCOME)
    assert [attrs[0].get(k) for k in keys] == [attrs[1].get(k) for k in keys]
    assert attrs[0].get(Attr.GENAI_INPUT_TOKENS) == 5 and attrs[0].get(Attr.CHUNKS) and attrs[1].get(Attr.CHUNKS)
