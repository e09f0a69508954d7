"""Session 24 (tail): a slow request write's departure is looked up in the packet log by the request's deferred
account, not in the forward (``proxy/relay.py``: ``Downstream._process`` passes ``placing`` to ``_account``); the stamp
is what the forward's own lookup gave: every request's forwarded stamp placed (bound 0) no later than the upstream's
kernel receive stamp of its bytes, with every send slow (``kstamp._SLOW_SEND_NS`` 0), on real loopback connections."""

from __future__ import annotations

import sys

import pytest

from deltatap.core.vocab import TapEvent
from deltatap.net import kstamp, pktstamp
from deltatap.proxy import relay

from test_relay_s23_selfreport import SLACK_NS, _run


async def test_a_slow_request_write_is_placed_in_its_account_at_its_departure(make_tap, span_exporter, telemetry, monkeypatch):
    if not kstamp.enabled() or pktstamp.packet_log() is None or not relay.DEFER_WATCH:
        pytest.skip("needs kernel stamps, the packet log (CAP_NET_RAW) and deferred accounts")
    where: list[str] = []
    real_place = relay._Side.place

    def place(self, unplaced, t, bound):  # (who placed a request write: the forward or the account)
        if isinstance(self, relay.Upstream) and unplaced is not None:
            where.append(sys._getframe(1).f_code.co_name)
        return real_place(self, unplaced, t, bound)

    monkeypatch.setattr(relay._Side, "place", place)
    default, placed_before = kstamp._SLOW_SEND_NS, kstamp.SLOW_SENDS["packets"]
    monkeypatch.setattr(kstamp, "_SLOW_SEND_NS", 0)  # (every send slow: each forwarding write left to be placed)
    if kstamp._send is not None:
        kstamp._pktacc.write_setup(kstamp.SLOW_SENDS, 0)
    try:
        seen, arrivals, _, _ = await _run(make_tap, span_exporter, telemetry, 4)
    finally:
        if kstamp._send is not None:
            kstamp._pktacc.write_setup(kstamp.SLOW_SENDS, default)
    # the first request waits for the connection and goes out with it (Downstream._attach: placed at once, as before);
    # each later one from its read's deferred account, never in the forward (_send_up)
    assert len(where) == 4 and where[0] == "_send_up" and set(where[1:]) == {"_account"}, where
    for rec, arrival in zip(seen, arrivals):
        stamp, bound = rec.forwarded, rec.bounds[TapEvent.REQUEST_FORWARDED][1]
        assert arrival >= stamp - SLACK_NS, (arrival - stamp, bound)  # (its departure: never after the upstream had it)
        # placed at its departure or not, the interval reaches the upstream's arrival (session 25: a placed write's
        # bound runs to the send's return)
        assert bound >= 0 and arrival <= stamp + bound + SLACK_NS, (arrival - stamp, bound)
    assert kstamp.SLOW_SENDS["packets"] > placed_before  # (the log placed some: the case was met)
