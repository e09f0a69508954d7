"""TCP streams by 4-tuple and sequence number, HTTP/1.1 messages on them, SSE events of a response.

A :class:`Stream` is one direction of one connection. Every data byte keeps the stream offset it
was sent at (sequence number minus the initial sequence number) and the capture stamp of the
*first* segment that carried it (a retransmission carries the same bytes later; its stamp is not the
byte's arrival). Overlapping segments must agree byte for byte, else the stream is marked
inconsistent. Holes (bytes the capture never saw) end the contiguous data: the HTTP parser stops
there and the stream is marked incomplete.

HTTP parsing keeps, for every message, the stream offsets of its first and last byte and, for a
body, the map decoded body offset -> stream offset (chunked transfer coding removed), so a byte of
the body seen by an application (an SSE event's last byte) can be traced to the packet that carried
it.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Iterable
from dataclasses import dataclass, field

from .pcap import ACK as ACK_FLAG, FIN, RST, SYN, TcpSegment

Key = tuple[str, int, str, int]  # (src, sport, dst, dport)


@dataclass
class Stream:
    key: Key
    isn: int | None = None  # sequence number of the first data byte (SYN's seq + 1)
    syn_ns: int | None = None
    fin_offset: int | None = None
    rst: bool = False
    raw: list[tuple[int, bytes, int, int]] = field(default_factory=list)  # (seq, payload, ts_ns, packet index)
    # built by finish():
    data: bytes = b""
    seg_start: list[int] = field(default_factory=list)  # stream offset where each kept segment starts
    seg_end: list[int] = field(default_factory=list)
    seg_ts: list[int] = field(default_factory=list)
    seg_pkt: list[int] = field(default_factory=list)
    retransmitted_bytes: int = 0
    inconsistent: int = 0  # overlapping bytes that differed
    holes: int = 0  # gaps in the sequence space (bytes never captured)
    # later copies of bytes already kept (retransmissions): (start offset, end offset, capture stamp)
    copies: list[tuple[int, int, int]] = field(default_factory=list)
    acks_sent: list[tuple[int, int, tuple]] = field(default_factory=list)  # (capture stamp, raw ACK number, SACK blocks) sent
    # the other direction's ACKs of this stream's bytes, by capture time: stamps and the running highest acked offset
    ack_ts: list[int] = field(default_factory=list)
    ack_upto: list[int] = field(default_factory=list)
    ack_sack: list[tuple[tuple[int, int], ...]] = field(default_factory=list)  # each ACK's SACK blocks, as offsets
    copies_ambiguous: int = 0  # bytes with several copies and no ACK to tell which one arrived

    def finish(self) -> None:
        if not self.raw:
            return
        base = self.isn if self.isn is not None else min(s for s, *_ in self.raw)  # no SYN seen: first byte seen
        segs = sorted((((seq - base) & 0xFFFFFFFF), payload, ts, pkt) for seq, payload, ts, pkt in self.raw)
        # earliest capture first among segments starting at the same offset: sort by (offset, ts)
        segs.sort(key=lambda s: (s[0], s[2]))
        out = bytearray()
        end = 0
        for off, payload, ts, pkt in segs:
            if off > end:
                self.holes += 1
                break
            new_from = end - off
            if new_from > 0:  # overlap with bytes already kept: a retransmission
                overlap = payload[: min(new_from, len(payload))]
                if bytes(out[off : off + len(overlap)]) != overlap:
                    self.inconsistent += 1
                self.retransmitted_bytes += len(overlap)
                self.copies.append((off, off + len(overlap), ts))
            if new_from < len(payload):
                part = payload[max(new_from, 0) :]
                self.seg_start.append(end)
                self.seg_end.append(end + len(part))
                self.seg_ts.append(ts)
                self.seg_pkt.append(pkt)
                out += part
                end += len(part)
        self.data = bytes(out)
        self.raw = []

    def ts_at(self, offset: int) -> int:
        """Capture stamp of the segment that carried stream byte ``offset``."""
        i = bisect.bisect_right(self.seg_start, offset) - 1
        if i < 0 or offset >= self.seg_end[i]:
            raise KeyError(f"byte {offset} not captured on {self.key}")
        return self.seg_ts[i]

    def set_acks(self, acks: list[tuple[int, int, tuple]]) -> None:
        """The other direction's ACKs ``(capture stamp, raw ACK number, SACK blocks)`` of this stream's bytes."""
        if self.isn is None:
            return
        hi = 0
        rel = lambda x: (x - self.isn) & 0xFFFFFFFF  # noqa: E731
        for ts, ack, sack in sorted(acks, key=lambda a: a[0]):
            off = rel(ack)
            if off > 1 << 31:  # (an ACK from before this stream's first byte: nothing acked)
                off = 0
            hi = max(hi, off)
            self.ack_ts.append(ts)
            self.ack_upto.append(hi)
            self.ack_sack.append(tuple((rel(a), rel(b)) for a, b in sack))

    def arrival_at(self, offset: int) -> int:
        """When stream byte ``offset`` reached the receiver: the capture stamp of its only copy; of several copies
        (retransmissions), the latest one captured at or before the receiver's first ACK that covers the byte -- on
        loopback a packet is captured as it is sent and can still be dropped on the way in (the backlog), so the
        first copy seen is not always the one that arrived -- unless that ACK reports the byte as a duplicate
        (D-SACK, RFC 2883: an earlier copy had arrived; a delayed ACK and a spurious, e.g. tail-loss-probe,
        retransmission): then the first copy. Without such an ACK: the first copy (counted in
        ``copies_ambiguous``)."""
        first = self.ts_at(offset)
        later = [ts for a, b, ts in self.copies if a <= offset < b]
        if not later:
            return first
        stamps = sorted([first, *later])
        i = bisect.bisect_right(self.ack_upto, offset)  # first ACK whose acked offset is past the byte
        if i >= len(self.ack_ts):
            self.copies_ambiguous += 1
            return stamps[0]
        t_ack = self.ack_ts[i]
        if any(a <= offset < b for a, b in self.ack_sack[i]):  # a duplicate: an earlier copy had arrived
            return stamps[0]
        got = [ts for ts in stamps if ts <= t_ack]
        return got[-1] if got else stamps[0]

    def departure_at(self, offset: int) -> int:
        """When stream byte ``offset`` was first sent: the earliest capture of any of its copies."""
        return min([self.ts_at(offset), *(ts for a, b, ts in self.copies if a <= offset < b)])

    def segment_index(self, offset: int) -> int:
        i = bisect.bisect_right(self.seg_start, offset) - 1
        if i < 0 or offset >= self.seg_end[i]:
            raise KeyError(f"byte {offset} not captured on {self.key}")
        return i


@dataclass
class Connection:
    client: Stream  # the connecting side -> the listening side
    server: Stream  # the listening side -> the connecting side

    @property
    def server_port(self) -> int:
        return self.client.key[3]

    @property
    def client_port(self) -> int:
        return self.client.key[1]


def reassemble(segments: Iterable[TcpSegment], listen_ports: set[int] | None = None) -> tuple[list[Connection], dict]:
    """Group segments into connections. A connection's client side is the one that sent the SYN; without
    a SYN in the capture, the side whose destination is one of ``listen_ports``."""
    streams: dict[Key, Stream] = {}
    syn_from: dict[frozenset, Key] = {}  # connection (unordered pair) -> key of the SYN sender
    stats = {"segments": 0, "data_segments": 0, "bytes": 0, "reused_tuples": 0}
    for s in segments:
        stats["segments"] += 1
        key = (s.src, s.sport, s.dst, s.dport)
        st = streams.get(key)
        if st is None:
            st = streams[key] = Stream(key)
        if s.flags & SYN:
            if st.isn is not None and st.isn != (s.seq + 1) & 0xFFFFFFFF and st.raw:
                # a new connection on a reused 4-tuple: keep the old one under a renamed key
                # (not expected within one run: TIME_WAIT keeps a closed 4-tuple unused for a minute)
                old = streams.pop(key)
                streams[(key[0] + f"#{s.index}", key[1], key[2], key[3])] = old
                stats["reused_tuples"] += 1
                st = streams[key] = Stream(key)
            st.isn = (s.seq + 1) & 0xFFFFFFFF
            st.syn_ns = s.ts_ns
            if not s.flags & ACK_FLAG:
                syn_from[frozenset((key, (s.dst, s.dport, s.src, s.sport)))] = key
        if s.flags & RST:
            st.rst = True
        if s.flags & ACK_FLAG:
            st.acks_sent.append((s.ts_ns, s.ack, s.sack))
        if s.payload:
            stats["data_segments"] += 1
            stats["bytes"] += len(s.payload)
            st.raw.append((s.seq, s.payload, s.ts_ns, s.index))
        if s.flags & FIN and st.isn is not None:
            st.fin_offset = ((s.seq - st.isn) & 0xFFFFFFFF) + len(s.payload)
    for st in streams.values():
        st.finish()
    conns: list[Connection] = []
    seen: set[Key] = set()
    for key, st in streams.items():
        if key in seen or "#" in key[0]:
            continue  # an earlier connection on a reused 4-tuple is not compared (counted in reused_tuples)
        rkey = (key[2], key[3], key[0], key[1])
        other = streams.get(rkey) or Stream(rkey)
        seen.add(key)
        seen.add(rkey)
        opener = syn_from.get(frozenset((key, rkey)))
        if opener is None:
            opener = key if listen_ports and key[3] in listen_ports else rkey
        st.set_acks(other.acks_sent)
        other.set_acks(st.acks_sent)
        conns.append(Connection(st, other) if opener == key else Connection(other, st))
    return conns, stats




# ------------------------------------------------------------------------------------------ HTTP


@dataclass
class Message:
    start: int  # stream offset of the first byte
    head_end: int  # offset just past the blank line ending the head
    end: int  # offset just past the last byte (body included)
    first_line: str
    headers: dict[str, str]  # lower-case names; repeated headers joined with ", "
    body: bytes = b""  # decoded (transfer coding removed)
    body_map: list[tuple[int, int, int]] = field(default_factory=list)  # (body offset, stream offset, length)
    complete: bool = True

    @property
    def last(self) -> int:
        return self.end - 1

    def stream_offset(self, body_offset: int) -> int:
        i = bisect.bisect_right([b for b, _, _ in self.body_map], body_offset) - 1
        b, s, n = self.body_map[i]
        if not b <= body_offset < b + n:
            raise KeyError(body_offset)
        return s + body_offset - b

    @property
    def status(self) -> int | None:
        parts = self.first_line.split(" ", 2)
        return int(parts[1]) if parts[0].startswith("HTTP/") and len(parts) > 1 and parts[1].isdigit() else None


class HttpError(ValueError):
    pass


def _head(data: bytes, pos: int) -> tuple[int, str, dict[str, str]] | None:
    he = data.find(b"\r\n\r\n", pos)
    if he < 0:
        return None
    lines = data[pos:he].decode("latin-1").split("\r\n")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        k = name.strip().lower()
        v = value.strip()
        headers[k] = f"{headers[k]}, {v}" if k in headers else v
    return he + 4, lines[0], headers


def _body(data: bytes, pos: int, headers: dict[str, str], until_close: bool) -> tuple[int, bytes, list[tuple[int, int, int]], bool]:
    """(end offset, decoded body, body map, complete)."""
    te = headers.get("transfer-encoding", "").lower()
    if "chunked" in te:
        body = bytearray()
        bmap: list[tuple[int, int, int]] = []
        p = pos
        while True:
            le = data.find(b"\r\n", p)
            if le < 0:
                return len(data), bytes(body), bmap, False
            size = int(data[p:le].split(b";")[0].strip() or b"0", 16)
            p = le + 2
            if size == 0:
                te_end = data.find(b"\r\n", p)  # trailers (none expected) then the final CRLF
                while te_end >= 0 and te_end != p:
                    p = te_end + 2
                    te_end = data.find(b"\r\n", p)
                if te_end < 0:
                    return len(data), bytes(body), bmap, False
                return te_end + 2, bytes(body), bmap, True
            if p + size + 2 > len(data):
                n = max(0, min(size, len(data) - p))
                if n:
                    bmap.append((len(body), p, n))
                    body += data[p : p + n]
                return len(data), bytes(body), bmap, False
            bmap.append((len(body), p, size))
            body += data[p : p + size]
            p += size + 2
    if "content-length" in headers:
        n = int(headers["content-length"].split(",")[0])
        end = pos + n
        got = min(end, len(data))
        return got, data[pos:got], [(0, pos, got - pos)] if got > pos else [], got == end
    if until_close:
        return len(data), data[pos:], [(0, pos, len(data) - pos)] if len(data) > pos else [], True
    return pos, b"", [], True


def parse_requests(st: Stream) -> list[Message]:
    out: list[Message] = []
    data, pos = st.data, 0
    while pos < len(data):
        h = _head(data, pos)
        if h is None:
            break
        he, first, headers = h
        end, body, bmap, complete = _body(data, he, headers, until_close=False)
        out.append(Message(pos, he, end, first, headers, body, bmap, complete))
        if not complete:
            break
        pos = end
    return out


def parse_responses(st: Stream, requests: list[Message]) -> list[Message]:
    """Responses in order; a 1xx interim response is skipped (it answers no request on its own)."""
    out: list[Message] = []
    data, pos = st.data, 0
    i = 0
    while pos < len(data):
        h = _head(data, pos)
        if h is None:
            break
        he, first, headers = h
        parts = first.split(" ", 2)
        status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
        if 100 <= status < 200:
            pos = he
            continue
        method = requests[i].first_line.split(" ", 1)[0] if i < len(requests) else "GET"
        if method == "HEAD" or status in (204, 304):
            end, body, bmap, complete = he, b"", [], True
        else:
            end, body, bmap, complete = _body(data, he, headers, until_close=True)
        out.append(Message(pos, he, end, first, headers, body, bmap, complete))
        i += 1
        if not complete:
            break
        pos = end
    return out


# ------------------------------------------------------------------------------------------ SSE


@dataclass
class SseEvent:
    # body offset of the byte that completed the event: the first byte of the blank line's line end (its "\r" when
    # that is "\r\n": a parser dispatches there, WHATWG 9.2.6, as deltatap's does; the "\n" may come in a later packet)
    end: int
    data: str
    text: str  # generated text it carries ("" for role-only, usage, [DONE], ...)


def content_text(obj: object) -> str:
    """Generated text of one decoded SSE payload: OpenAI chat (delta content, reasoning, tool-call
    fragments), OpenAI completions (text), llama.cpp's native /completion (content)."""
    if not isinstance(obj, dict):
        return ""
    parts: list[str] = []
    for ch in obj.get("choices") or []:
        if not isinstance(ch, dict):
            continue
        d = ch.get("delta")
        if isinstance(d, dict):
            for k in ("content", "reasoning_content", "reasoning"):
                v = d.get(k)
                if isinstance(v, str):
                    parts.append(v)
            for tc in d.get("tool_calls") or []:
                f = tc.get("function") if isinstance(tc, dict) else None
                if isinstance(f, dict):
                    parts.append(str(f.get("name") or "") + str(f.get("arguments") or ""))
        t = ch.get("text")
        if isinstance(t, str):
            parts.append(t)
    if not obj.get("choices") and isinstance(obj.get("content"), str):
        parts.append(obj["content"])
    return "".join(parts)


def sse_events(body: bytes) -> list[SseEvent]:
    """Events of an event-stream body (LF, CRLF or CR line ends), each with its completing byte."""
    out: list[SseEvent] = []
    data_lines: list[str] = []
    pos, n = 0, len(body)
    while pos < n:
        nl = body.find(b"\n", pos)
        cr = body.find(b"\r", pos)
        if nl < 0 and cr < 0:
            break
        if cr >= 0 and (nl < 0 or cr < nl):
            line_end = cr
            nxt = cr + 2 if body[cr + 1 : cr + 2] == b"\n" else cr + 1
        else:
            line_end = nl
            nxt = nl + 1
        line = body[pos:line_end]
        if not line:
            if data_lines:
                d = "\n".join(data_lines)
                try:
                    text = content_text(json.loads(d)) if d and d[0] in "{[" else ""
                except ValueError:
                    text = ""
                out.append(SseEvent(line_end, d, text))
            data_lines = []
        elif line.startswith(b"data:"):
            v = line[5:]
            data_lines.append((v[1:] if v.startswith(b" ") else v).decode("utf-8", "replace"))
        pos = nxt
    return out


def first_last_content(events: list[SseEvent]) -> tuple[SseEvent | None, SseEvent | None]:
    """The first content event (leading whitespace-only events are not the first token, as deltatap's
    taps and load generator count it) and the last content event."""
    first = next((e for e in events if e.text and not e.text.isspace()), None)
    last = next((e for e in reversed(events) if e.text), None)
    return first, last
