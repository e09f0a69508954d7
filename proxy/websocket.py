"""WebSocket frames watched on a tunnel the tap relays after ``101 Switching Protocols`` — no sockets here.

The relay (:mod:`deltatap.proxy.relay`) forwards every byte of the tunnel as it reads it, unchanged; this module is
fed a copy, ``(bytes, read stamp, write stamp)`` per read, one :class:`WsDirection` per direction, and keeps what a
latency instrument needs from RFC 6455 framing: frames, messages (a data frame with FIN, after its continuation
frames), control frames (ping, pong, close: they may come between the fragments of a message), each message's
arrival (the read that delivered its last byte) and departure (the write that carried that read on), the first
message's stamps, and the close frame's status code and who sent it first.

Payloads are never unmasked or kept, except the two bytes of a close frame's status code. A message sent with
permessage-deflate (RSV1 on its first frame, when the 101 negotiated the extension) is counted like any other: its
payload is compressed, which the tap does not inflate (``compressed`` counts such messages; sizes are wire sizes).

A frame that breaks RFC 6455 (a reserved opcode or RSV bit, a fragmented or over-long control frame, a
continuation with nothing to continue, a client frame without a mask or a server frame with one, a 64-bit length
with its top bit set) stops the watching of that direction (``malformed`` says why); the relay goes on as before.
"""

from __future__ import annotations

from typing import Any

from deltatap.core.clock import to_unix_ns
from deltatap.core.gap_stats import GapStats
from deltatap.core.vocab import Attr

# opcodes (RFC 6455 section 5.2)
CONTINUATION, TEXT, BINARY, CLOSE, PING, PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA
ARRIVALS_MAX = 256  # messages per direction whose arrival offset is kept on the span (the gap statistics see all)
CLIENT, SERVER = "client", "server"  # the direction's sender: downstream (client) or upstream (server)

# the tunnel's attributes, per direction: (Attr for client-sent, Attr for server-sent)
_DIR_ATTRS = {
    CLIENT: Attr.WS_CLIENT,
    SERVER: Attr.WS_SERVER,
}


def is_websocket_upgrade(head: Any) -> bool:
    """Whether a 101 response head switches to WebSocket (``Upgrade: websocket``)."""
    return any(tok == b"websocket" for tok in (head.get(b"upgrade") or b"").lower().replace(b" ", b"").split(b","))


def negotiated_deflate(head: Any) -> bool:
    """Whether the 101's ``Sec-WebSocket-Extensions`` accepted permessage-deflate (RSV1 then marks compressed)."""
    return b"permessage-deflate" in (head.get(b"sec-websocket-extensions") or b"").lower()


class WsDirection:
    """RFC 6455 framing of one direction of a tunnel, fed each read as it is relayed (bytes split anywhere)."""

    __slots__ = ("sender", "masked", "deflate", "frames", "messages", "pings", "pongs", "compressed", "wire_bytes",
                 "payload_bytes", "close_code", "close_mono_ns", "malformed", "first_mono_ns", "first_bound_ns",
                 "first_forwarded_mono_ns", "first_forwarded_bound_ns", "last_mono_ns", "arrivals_ns", "gaps",
                 "gaps_forwarded", "_hdr", "_need", "_left", "_op", "_fin", "_key", "_close", "_in_message",
                 "_msg_compressed", "_pos_in_payload")

    def __init__(self, sender: str, *, deflate: bool = False) -> None:
        self.sender = sender
        self.masked = sender == CLIENT  # client frames are masked, server frames never (RFC 6455 5.1)
        self.deflate = deflate
        self.frames = 0
        self.messages = 0  # data messages completed (text or binary, after their continuations)
        self.pings = 0
        self.pongs = 0
        self.compressed = 0  # messages with RSV1 (permessage-deflate): payload counted, not inflated
        self.wire_bytes = 0  # every byte fed (frames, headers included), also after a malformed frame
        self.payload_bytes = 0  # payload of the frames parsed
        self.close_code: int | None = None  # None: no close frame; 1005: a close frame without a code
        self.close_mono_ns: int | None = None
        self.malformed: str | None = None
        self.first_mono_ns: int | None = None  # read that completed the first message
        self.first_bound_ns = 0
        self.first_forwarded_mono_ns: int | None = None  # write that carried its last byte on
        self.first_forwarded_bound_ns = 0
        self.last_mono_ns: int | None = None
        self.arrivals_ns: list[int] = []  # each message's arrival (mono), the first ARRIVALS_MAX
        self.gaps = GapStats()  # between message arrivals
        self.gaps_forwarded = GapStats()  # between their departures
        self._hdr = bytearray()  # header bytes of the frame being read
        self._need = 2  # header bytes still wanted (0: in the payload)
        self._left = 0  # payload bytes left in the current frame
        self._op = 0
        self._fin = False
        self._key = b""
        self._close = bytearray()  # the close frame's first two payload bytes (masked as sent)
        self._in_message = False  # a fragmented message has begun
        self._msg_compressed = False

    # ---- feeding ---------------------------------------------------------------------------
    def feed(self, data: bytes | bytearray | memoryview, t: int, bound: int, tw: int, bw: int) -> None:
        """One read, ``data`` arrived in ``[t - bound, t]`` and left in ``[tw, tw + bw]`` (``bw`` -1: it waited)."""
        n = len(data)
        self.wire_bytes += n
        if self.malformed is not None:
            return
        pos = 0
        while pos < n:
            if self._need:
                take = min(self._need, n - pos)
                self._hdr += data[pos : pos + take]
                pos += take
                self._need -= take
                if self._need:
                    return
                if not self._header():
                    return
                if self._need:  # (the length or the mask follow)
                    continue
                if self._left == 0:
                    self._frame_end(t, bound, tw, bw)
                continue
            take = min(self._left, n - pos)
            if self._op == CLOSE and len(self._close) < 2:
                self._close += data[pos : pos + min(take, 2 - len(self._close))]
            pos += take
            self._left -= take
            if self._left == 0:
                self._frame_end(t, bound, tw, bw)

    def _header(self) -> bool:
        """The header bytes so far; asks for more (length, mask) or starts the payload. False: malformed."""
        h = self._hdr
        b0, b1 = h[0], h[1]
        ln = b1 & 0x7F
        masked = bool(b1 & 0x80)
        want = 2 + (2 if ln == 126 else 8 if ln == 127 else 0) + (4 if masked else 0)
        if len(h) < want:
            self._need = want - len(h)
            return True
        op = b0 & 0x0F
        fin = bool(b0 & 0x80)
        rsv1 = bool(b0 & 0x40)
        if b0 & 0x30:
            return self._bad("RSV2/RSV3 set (no extension defines them)")
        if op not in (CONTINUATION, TEXT, BINARY, CLOSE, PING, PONG):
            return self._bad(f"reserved opcode 0x{op:x}")
        if masked != self.masked:
            return self._bad("a client frame without a mask" if self.masked else "a server frame with a mask")
        if ln == 126:
            length = int.from_bytes(h[2:4], "big")
            off = 4
        elif ln == 127:
            length = int.from_bytes(h[2:10], "big")
            if length >> 63:
                return self._bad("a 64-bit length with its most significant bit set")
            off = 10
        else:
            length = ln
            off = 2
        if op >= CLOSE:
            if not fin:
                return self._bad("a fragmented control frame")
            if length > 125:
                return self._bad(f"a control frame of {length} bytes (at most 125)")
            if rsv1:
                return self._bad("RSV1 on a control frame")
        elif op == CONTINUATION:
            if not self._in_message:
                return self._bad("a continuation frame with no message to continue")
            if rsv1:
                return self._bad("RSV1 on a continuation frame")
        else:
            if self._in_message:
                return self._bad("a new data frame before the fragmented message ended")
            if rsv1 and not self.deflate:
                return self._bad("RSV1 without permessage-deflate negotiated")
            self._in_message = True
            self._msg_compressed = rsv1
        self._key = bytes(h[off : off + 4]) if masked else b""
        self._op, self._fin, self._left = op, fin, length
        self._close = bytearray()
        self._need = 0
        self.frames += 1
        self.payload_bytes += length
        return True

    def _frame_end(self, t: int, bound: int, tw: int, bw: int) -> None:
        op = self._op
        self._hdr = bytearray()
        self._need = 2
        if op >= CLOSE:
            if op == PING:
                self.pings += 1
            elif op == PONG:
                self.pongs += 1
            elif self.close_code is None:
                c = self._close
                if self._key and c:
                    c = bytearray(b ^ self._key[i] for i, b in enumerate(c))
                self.close_code = int.from_bytes(c, "big") if len(c) == 2 else 1005
                self.close_mono_ns = t
            return
        if not self._fin:
            return
        self._in_message = False
        self.messages += 1
        if self._msg_compressed:
            self.compressed += 1
        if self.first_mono_ns is None:
            self.first_mono_ns, self.first_bound_ns = t, bound
            self.first_forwarded_mono_ns, self.first_forwarded_bound_ns = tw, max(0, bw)
        self.last_mono_ns = t
        if len(self.arrivals_ns) < ARRIVALS_MAX:
            self.arrivals_ns.append(t)
        self.gaps.observe(t)
        self.gaps_forwarded.observe(tw)

    def _bad(self, why: str) -> bool:
        self.malformed = why
        return False

    # ---- the span ----------------------------------------------------------------------------
    def attributes(self, out: dict[str, Any]) -> None:
        a = _DIR_ATTRS[self.sender]
        out[a.MESSAGES] = self.messages
        out[a.FRAMES] = self.frames
        out[a.BYTES] = self.wire_bytes
        out[a.PAYLOAD_BYTES] = self.payload_bytes
        out[a.PINGS] = self.pings
        out[a.PONGS] = self.pongs
        if self.compressed:
            out[a.COMPRESSED] = self.compressed
        if self.close_code is not None:
            out[a.CLOSE_CODE] = self.close_code
        if self.malformed is not None:
            out[a.MALFORMED] = self.malformed
        if self.first_mono_ns is not None:
            out[a.FIRST_RECEIVED_UNIX_NS] = to_unix_ns(self.first_mono_ns)
            out[a.FIRST_RECEIVED_BOUND_NS] = self.first_bound_ns
            out[a.ARRIVALS_MS] = [(t - self.first_mono_ns) / 1e6 for t in self.arrivals_ns]
        if self.first_forwarded_mono_ns is not None:
            out[a.FIRST_FORWARDED_UNIX_NS] = to_unix_ns(self.first_forwarded_mono_ns)
            out[a.FIRST_FORWARDED_BOUND_NS] = self.first_forwarded_bound_ns
        g, gf = self.gaps, self.gaps_forwarded
        if g.count:
            out[a.GAP_MEAN_MS] = g.mean_ns / 1e6
            out[a.GAP_MAX_MS] = g.max_ns / 1e6
            out[a.GAP_P99_MS] = g.p99_ns() / 1e6
        if gf.count:
            out[a.GAP_FWD_MAX_MS] = gf.max_ns / 1e6


class WsTunnel:
    """Both directions of one WebSocket tunnel, and how it ended."""

    __slots__ = ("client", "server", "closed_by", "deflate", "last_write_mono_ns")

    def __init__(self, deflate: bool = False) -> None:
        self.deflate = deflate
        self.client = WsDirection(CLIENT, deflate=deflate)
        self.server = WsDirection(SERVER, deflate=deflate)
        self.closed_by: str | None = None  # who ended it: the first close frame's sender, else the first TCP close
        self.last_write_mono_ns: int | None = None

    def connection_closed(self, by: str) -> None:
        """A side's connection ended (``by``: client or server); the first close frame, if any, says who closed."""
        if self.closed_by is None:
            self.closed_by = by

    def who_closed(self) -> str | None:
        c, s = self.client.close_mono_ns, self.server.close_mono_ns
        if c is not None or s is not None:
            return CLIENT if s is None or (c is not None and c <= s) else SERVER
        return self.closed_by

    def malformed(self) -> list[tuple[str, str]]:
        return [(d.sender, d.malformed) for d in (self.client, self.server) if d.malformed is not None]

    def attributes(self, out: dict[str, Any]) -> None:
        out[Attr.WS] = True
        if self.deflate:
            out[Attr.WS_DEFLATE] = True
        by = self.who_closed()
        if by is not None:
            out[Attr.WS_CLOSED_BY] = by
        self.client.attributes(out)
        self.server.attributes(out)
