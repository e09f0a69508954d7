"""One connection pair of relay sides without sockets, for the relay's network-free tests (test_relay_native,
test_relay_fastpath, test_relay_defer): a real (not started) :class:`~deltatap.proxy.server.Tap`, a
:class:`~deltatap.proxy.relay.Downstream` side and an :class:`~deltatap.proxy.relay.Upstream` side linked to each
other, and ``n`` POST exchanges whose responses the upstream's reader expects."""

from __future__ import annotations

from deltatap.core.fingerprint import Fingerprinter
from deltatap.proxy import TapOptions
from deltatap.proxy.record import TapRecord
from deltatap.proxy.relay import Downstream, Exchange, Upstream
from deltatap.proxy.server import Tap
from deltatap.proxy.spans import begin


def socketless_tap(telemetry) -> Tap:
    """A real tap, not started (no listening socket; its upstream address is never dialled)."""
    return Tap(TapOptions(upstream="http://127.0.0.1:9", link="fw-engine"), telemetry)


class PlacedDown(Downstream):
    """A downstream side whose slow writes are placed (as the kernel's packet log places them: a later departure than
    the write's stamp), so that which stamp each record field took shows."""

    def place(self, unplaced, t, bound):
        return (t, bound) if unplaced is None else (unplaced[0] + 12_345, 0)


class ScriptedDown(PlacedDown):
    """A :class:`PlacedDown` that writes nothing: each write gets the next of ``script``'s stamps ``(t, bound,
    unplaced)`` and is left unplaced when it says so, as the kernel's packet log leaves a slow write."""

    script: list = []

    def send(self, data):
        tw, bw, unplaced = self.script.pop(0)
        self.unplaced = (tw, tw + 1, 0) if unplaced else None
        self.last_write_mono, self.last_write_bound = tw, bw
        return tw, bw


def socketless_pair(tap: Tap, n: int, down: type[Downstream] = PlacedDown) -> tuple[Upstream, Downstream, list[Exchange]]:
    """The two sides of one connection, linked, with ``n`` POST exchanges sent (their requests done) and awaiting
    their responses, in order: (upstream side, downstream side, exchanges)."""
    d = down(tap)
    d.closed = True  # (no socket: no head timer)
    up = Upstream(tap)
    up.down, d.up = d, up
    exs = []
    for i in range(n):
        ex = Exchange(TapRecord(received=i, method="POST", path="/v1/chat/completions"), begin({}), Fingerprinter(tap.fp_key), b"POST")
        ex.request_done = True
        tap.exchange_started()
        d.exchanges.append(ex)
        up.reader.expect(b"POST")
        exs.append(ex)
    return up, d, exs
