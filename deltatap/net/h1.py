"""Sans-I/O HTTP/1.1 framing for a byte relay: where messages begin and end, never what they say.

A relay forwards the bytes it reads as it reads them; it only needs to know where each message's head ends
(to add trace context to a request head), which bytes of a body are payload (to watch a token stream), where
a message ends (to close its record and find the next one on a keep-alive or pipelined connection), and when
a connection stops being HTTP (after ``101 Switching Protocols`` or a ``CONNECT`` tunnel). :class:`Reader`
answers exactly that for one direction of one connection, from the bytes alone (RFC 9112 section 6):

* requests: ``Transfer-Encoding`` ending in ``chunked`` → chunked; another final coding, or ``Content-Length``
  as well (ambiguous framing: request smuggling) → an error; else ``Content-Length`` (equal duplicates
  allowed); else no body. Only HTTP/1.x heads are framed (an HTTP/2 preface is an error).
* responses: to ``HEAD``, ``1xx``, ``204`` and ``304`` → no body; a ``2xx`` to ``CONNECT`` and any ``101``
  → the connection becomes opaque (every later byte is body, both ways: :meth:`Reader.switch`); ``chunked``
  as above; another final coding → until the connection closes; ``Content-Length``; else until the close.
* ``1xx`` heads other than 101 are interim: the same exchange's final head follows.
* chunk sizes with extensions, trailers, heads split anywhere, pipelined messages, bare ``LF`` line ends,
  leading empty lines before a request, and ``obs-fold`` continuation lines are accepted. Header names and
  values stay bytes exactly as sent (case, order, duplicates, obs-text); nothing is normalised.

A head the reader cannot frame (no colon, whitespace before the colon, a bad start line, a conflicting or
invalid ``Content-Length``, a head larger than ``max_head``; a request's as soon as its first byte or its first
line shows it cannot begin one, without waiting for an empty line) yields an :data:`ERROR` event and the reader
becomes opaque: a relay then passes the rest of the connection on as bytes, unchanged — an upstream that
meets the same bytes answers them itself, as it would have without the relay.

Events are tuples, in the order their bytes came, with offsets into the ``data`` just fed:

* ``(HEAD, start, end, head)`` — a head ended at ``end``; ``start`` is where it began in this ``data``
  (``-1``: it began in an earlier feed; those bytes are in ``head.raw``);
* ``(BODY, start, end)`` — payload bytes ``data[start:end]`` (chunk framing excluded; opaque bytes too);
* ``(END, end)`` — the message (trailers included) ended at ``end``;
* ``(ERROR, start, reason)`` — from ``start`` on the bytes are not HTTP the reader can frame.

:attr:`Reader.pending_from` tells where, in the last ``data``, bytes begin that no event has accounted for
yet (an unfinished head): a relay that rewrites heads holds those back. A request that asks to switch
protocols (``Upgrade`` or ``CONNECT``) puts the request reader on hold after its end (:attr:`Reader.held`)
until the response says whether the switch happened: :meth:`Reader.switch` then returns the held bytes.
"""

from __future__ import annotations

from collections import deque

from deltatap.core import native

HEAD, BODY, END, ERROR = 1, 2, 3, 4

_S_HEAD, _S_LENGTH, _S_CHUNK_SIZE, _S_CHUNK_DATA, _S_CHUNK_CRLF, _S_TRAILER, _S_CLOSE, _S_OPAQUE, _S_HELD, _S_ERROR = range(10)
_TCHAR = b"!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"  # (checked with translate: C speed)
_CTL_SP = bytes(range(0x21)) + b"\x7f"
_HEXB = b"0123456789abcdefABCDEF"  # (checked with translate, as the tokens are)
MAX_HEAD = 1 << 20  # bytes; a longer head is passed on unparsed (see the module doc)
MAX_CHUNK_LINE = 64 * 1024  # a chunk-size line (with extensions) or a trailer section longer than this is an error


class Head:
    """A message head as sent. ``headers``: ``[(name, value), ...]`` bytes, in order, names as cased, values
    without surrounding whitespace; :meth:`get` and :meth:`values` look names up case-insensitively."""

    __slots__ = ("raw", "method", "target", "version", "status", "reason", "headers", "_index", "_keep_alive")

    def __init__(self, raw: bytes, method: bytes, target: bytes, version: bytes, status: int, reason: bytes, headers: list[tuple[bytes, bytes]]) -> None:
        self.raw = raw
        self.method = method  # b"" for a response
        self.target = target
        self.version = version  # b"HTTP/1.1"
        self.status = status  # 0 for a request
        self.reason = reason
        self.headers = headers
        self._index: dict[bytes, list[bytes]] | None = None
        self._keep_alive: bool | None = None  # (keep_alive, once asked; the accelerator's reader fills it in)

    def index(self) -> dict[bytes, list[bytes]]:
        """Lower-cased name -> every value of that header, in order (made once, when first asked for)."""
        index = self._index
        if index is None:
            index = self._index = {}
            for name, value in self.headers:
                index.setdefault(name.lower(), []).append(value)
        return index

    def values(self, lname: bytes) -> list[bytes]:
        """Every value of the header named ``lname`` (lower case), in order: what :meth:`index` holds for it (with the
        accelerator and no index made yet, read from ``headers`` in one C call, ``_h1.header_values``, exactly so:
        a head's few lookups cost less than its index)."""
        index = self._index
        if index is None:
            if _acc is not None:
                got = _acc.header_values(self.headers, lname, True)
                if got is not NotImplemented:
                    return got
            index = self.index()
        return index.get(lname, [])

    def get(self, lname: bytes) -> bytes | None:
        """The first value of the header named ``lname`` (lower case), None without one."""
        if self._index is None and _acc is not None:
            got = _acc.header_values(self.headers, lname, False)
            if got is not NotImplemented:
                return got
        v = self.values(lname)
        return v[0] if v else None

    def tokens(self, lname: bytes) -> list[bytes]:
        """The comma-separated list elements of every ``lname`` header, lower-cased (``Connection``, ``Transfer-Encoding``)."""
        return [t.strip().lower() for v in self.values(lname) for t in v.split(b",") if t.strip()]

    @property
    def keep_alive(self) -> bool:
        """Whether the sender means to keep the connection open after this message (RFC 9112 section 9.3)."""
        ka = self._keep_alive
        if ka is None:
            conn = self.tokens(b"connection")
            ka = self._keep_alive = b"close" not in conn and (self.version != b"HTTP/1.0" or b"keep-alive" in conn)
        return ka

    def __repr__(self) -> str:
        first = self.raw.split(b"\n", 1)[0].rstrip(b"\r")
        return f"<Head {first[:80]!r} {len(self.headers)} headers>"


def parse_head(raw: bytes, request: bool) -> Head:
    """Parse one complete head (ending in an empty line); raises ``ValueError`` with the reason."""
    if _acc is not None:
        method, target, version, status, reason, headers, index = _acc.parse_head(raw, request)
        head = Head(raw, method, target, version, status, reason, headers)
        head._index = index  # (what values() would build)
        return head
    return _py_parse_head(raw, request)


def _py_parse_head(raw: bytes, request: bool) -> Head:
    """The definition of :func:`parse_head` (the C accelerator does exactly this)."""
    lines = raw.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    if lines and lines[-1] in (b"", b"\r"):
        lines.pop()
    lines = [ln[:-1] if ln.endswith(b"\r") else ln for ln in lines]
    if not lines:
        raise ValueError("empty head")
    start = lines[0]
    if request:
        parts = start.split(b" ")
        if len(parts) != 3:
            raise ValueError("request line is not METHOD SP TARGET SP VERSION")
        method, target, version = parts
        if not method or method.translate(None, _TCHAR):
            raise ValueError("invalid method")
        if not target or len(target.translate(None, _CTL_SP)) != len(target):
            raise ValueError("invalid request target")
        if not _version_ok(version):
            raise ValueError("invalid HTTP version")
        status, reason = 0, b""
    else:
        parts = start.split(b" ", 2)
        if len(parts) < 2 or not _version_ok(parts[0]) or len(parts[1]) != 3 or not parts[1].isdigit():
            raise ValueError("invalid status line")
        version, method, target = parts[0], b"", b""
        status = int(parts[1])
        reason = parts[2] if len(parts) == 3 else b""
        if status < 100:
            raise ValueError("invalid status code")
    headers: list[tuple[bytes, bytes]] = []
    for line in lines[1:]:
        if line[:1] in (b" ", b"\t"):  # obs-fold: a continuation of the previous value
            if not headers:
                raise ValueError("continuation line before any header")
            name, value = headers[-1]
            headers[-1] = (name, (value + b" " + line.strip(b" \t")).strip(b" \t"))
            continue
        colon = line.find(b":")
        if colon <= 0:
            raise ValueError("header line without a name and colon")
        name = line[:colon]
        if name.translate(None, _TCHAR):
            raise ValueError("invalid header name")
        value = line[colon + 1 :].strip(b" \t")
        if b"\r" in value or b"\0" in value:
            raise ValueError("invalid byte in a header value")
        headers.append((name, value))
    return Head(raw, method, target, version, status, reason, headers)


def _version_ok(v: bytes) -> bool:
    """HTTP/1.x only: anything else (an HTTP/2 connection preface ``PRI * HTTP/2.0``) is not framed here."""
    return len(v) == 8 and v.startswith(b"HTTP/1.") and v[7:8].isdigit()


def _content_length(head: Head) -> int | None:
    values = head.values(b"content-length")
    if not values:
        return None
    found: set[bytes] = set()
    for v in values:
        for part in v.split(b","):
            found.add(part.strip())
    if len(found) != 1:
        raise ValueError("conflicting Content-Length values")
    (text,) = found
    if not text.isdigit() or len(text) > 18:
        raise ValueError("invalid Content-Length")
    return int(text)


class Reader:
    """Framing of one direction of one HTTP/1.1 connection (see the module doc).

    ``request``: this reader reads requests (a server's side) rather than responses. A response reader must
    be told each request's method, in order (``expect(method)``): a response to ``HEAD`` has no body whatever it
    says, and a ``2xx`` to ``CONNECT`` opens a tunnel.
    """

    __slots__ = ("request", "max_head", "_state", "_buf", "_remaining", "_methods", "expect", "head", "pending_from", "messages",
                 "_hold", "_held", "error")

    def __init__(self, request: bool, max_head: int = MAX_HEAD) -> None:
        self.request = request
        self.max_head = max_head
        self._state = _S_HEAD
        self._buf = b""  # an unfinished head, chunk-size line or trailer section
        self._remaining = 0
        self._methods: deque[bytes] = deque()
        # expect(method): the next request on this connection was ``method`` (response readers only). The methods'
        # deque's own append, bound once per reader (the relay calls it per request: no Python frame for it)
        self.expect = self._methods.append
        self.head: Head | None = None  # the current message's head (its final head, for a response)
        self.pending_from: int | None = None  # offset in the last data of bytes no event accounts for yet
        self.messages = 0  # messages ended so far
        self._hold = False  # the current request asked to switch protocols: hold what follows its end
        self._held: list[bytes] = []
        self.error: str | None = None

    # ---- state --------------------------------------------------------------------------
    @property
    def idle(self) -> bool:
        """Between messages, with nothing of the next one read."""
        return self._state == _S_HEAD and not self._buf

    @property
    def in_message(self) -> bool:
        return self._state in (_S_LENGTH, _S_CHUNK_SIZE, _S_CHUNK_DATA, _S_CHUNK_CRLF, _S_TRAILER, _S_CLOSE) or (self._state == _S_HEAD and bool(self._buf))

    @property
    def opaque(self) -> bool:
        return self._state in (_S_OPAQUE, _S_ERROR)

    @property
    def held(self) -> bool:
        """A protocol switch was asked for: bytes wait until :meth:`switch` says whether it happened."""
        return self._state == _S_HELD

    @property
    def close_delimited(self) -> bool:
        return self._state == _S_CLOSE

    def switch(self, switched: bool) -> tuple[bytes, list[tuple]]:
        """End the hold: ``switched`` (101, or 2xx to CONNECT) makes the connection opaque, else HTTP goes on.
        Returns the bytes held and their events (as if fed now)."""
        held = b"".join(self._held)
        self._held = []
        if self._state != _S_HELD:
            return held, []
        if switched:
            self._state = _S_OPAQUE
            return held, [(BODY, 0, len(held))] if held else []
        self._state = _S_HEAD
        return held, self.feed(held) if held else []

    # ---- feeding ------------------------------------------------------------------------
    def feed(self, data: bytes) -> list[tuple]:
        out: list[tuple] = []
        n = len(data)
        pos = 0
        self.pending_from = None
        body = _body
        while pos < n:
            st = self._state
            if body is not None and st in _BODY_STATES:  # the C accelerator: the body states, one call per read
                pos, self._state, self._remaining, self._buf, how, arg = body(data, pos, st, self._remaining, self._buf, out)
                if how == 1:
                    self._end(out, pos)
                elif how == 2:
                    pos = self._fail(out, arg[0], arg[1])
            elif st == _S_HEAD:  # (second: with the accelerator, every read that begins a message comes here)
                acc = _acc
                if acc is None:
                    pos = self._feed_head(data, pos, out)
                    continue
                # the C accelerator: _feed_head and the usual head's framing (_begin) in one call (here, not in a method
                # of its own: a cold tap paid a Python frame per head for it; session 26, "cold")
                if self.request:
                    r = acc.feed_head(data, pos, self._buf, True, self.max_head)
                else:  # (a response's framing needs the request's method, as _begin takes it)
                    methods = self._methods
                    r = acc.feed_head(data, pos, self._buf, False, self.max_head, methods[0] if methods else b"GET")
                kind = r[0]
                if kind == 1:  # (1, new_pos, event_start, head, fail_start, framing, length, hold)
                    self._buf = b""
                    new_pos, head, framing = r[1], r[3], r[5]
                    if framing < 0:  # a response that _begin frames (interim, 101, to HEAD or CONNECT, 204, 304)
                        try:
                            self._begin(head, out, r[2], new_pos)
                        except ValueError as exc:
                            pos = self._fail(out, r[4], str(exc))
                            continue
                        pos = new_pos
                        continue
                    self.head = head  # a request or the usual final response, framed as _begin frames it
                    out.append((HEAD, r[2], new_pos, head))
                    if self.request:
                        self._hold = r[7]
                    elif methods:
                        methods.popleft()
                    if framing == 1:
                        self._state = _S_LENGTH
                        self._remaining = r[6]
                    elif framing == 2:
                        self._state = _S_CHUNK_SIZE
                    elif framing == 3:  # (a response only: read to the connection's close)
                        self._state = _S_CLOSE
                    else:
                        self._end(out, new_pos)
                    pos = new_pos
                elif kind == 0:  # (0, new_pos, buf, pending_from): the head goes on in a later read
                    self._buf, self.pending_from = r[2], r[3]
                    pos = r[1]
                elif kind == 3:  # (3, new_pos): only empty lines before a request line
                    pos = r[1]
                else:
                    pos = self._fail(out, r[1], r[2])  # (2, start, reason)
            elif st == _S_LENGTH:
                take = min(self._remaining, n - pos)
                out.append((BODY, pos, pos + take))
                pos += take
                self._remaining -= take
                if not self._remaining:
                    self._end(out, pos)
            elif st == _S_OPAQUE or st == _S_CLOSE:
                out.append((BODY, pos, n))
                return out
            elif st == _S_CHUNK_DATA:
                take = min(self._remaining, n - pos)
                out.append((BODY, pos, pos + take))
                pos += take
                self._remaining -= take
                if not self._remaining:
                    if data[pos : pos + 2] == b"\r\n":  # (the usual case: the CRLF after the data is here)
                        pos += 2
                        self._state = _S_CHUNK_SIZE
                    else:
                        self._state = _S_CHUNK_CRLF
                    self._buf = b""
            elif st == _S_CHUNK_SIZE and not self._buf:  # fast path: a whole size line without extensions
                nl = data.find(b"\n", pos)
                line = data[pos : nl - 1] if nl > pos and data[nl - 1] == 13 else None
                if line and len(line) <= 15 and not line.translate(None, _HEXB):
                    size = int(line, 16)
                    pos = nl + 1
                    if size:
                        self._state, self._remaining = _S_CHUNK_DATA, size
                    else:
                        self._state, self._remaining = _S_TRAILER, 0  # _remaining: trailer bytes so far
                else:
                    pos = self._feed_chunk_framing(data, pos, out)
            elif st == _S_CHUNK_SIZE or st == _S_CHUNK_CRLF or st == _S_TRAILER:
                pos = self._feed_chunk_framing(data, pos, out)
            elif st == _S_HELD:
                self._held.append(data[pos:])
                self.pending_from = pos
                return out
            else:  # _S_ERROR
                return out
        return out

    def feed_eof(self) -> list[tuple]:
        """The peer closed its sending side: ends a close-delimited body; anything else unfinished is an error."""
        if self._state == _S_CLOSE:
            out: list[tuple] = []
            self._end(out, 0)
            return out
        if self.in_message:
            return [(ERROR, 0, "the connection closed before the message ended")]
        return []

    def _feed_head(self, data: bytes, pos: int, out: list[tuple]) -> int:
        """A head's bytes from ``pos`` (the definition; with the accelerator :meth:`feed` makes one C call,
        ``_h1.feed_head``, instead, exactly as this and :meth:`_begin` do for the usual head)."""
        start = pos
        if not self._buf:
            # leading empty lines before a request line are ignored (RFC 9112 section 2.2)
            while self.request and pos < len(data) and data[pos] in (10, 13):
                pos += 1
            start = pos
            if pos == len(data):
                return pos
        buf = self._buf
        search_from = max(0, len(buf) - 3)
        joined = buf + data[pos:] if buf else data[pos:]
        end = _head_end(joined, search_from)
        if end < 0:
            if len(joined) > self.max_head:
                return self._fail(out, pos if not buf else 0, "the head is larger than the reader's limit")
            if self.request:
                bad = _py_request_start(joined)
                if bad is not None:
                    return self._fail(out, pos if not buf else 0, bad)
            self._buf = joined if buf else bytes(data[pos:])
            self.pending_from = start if not buf else 0
            return len(data)
        raw = joined[:end]
        consumed = end - len(buf)  # bytes of this data that belong to the head
        self._buf = b""
        if len(raw) > self.max_head:
            return self._fail(out, start if not buf else 0, "the head is larger than the reader's limit")
        try:
            head = parse_head(raw, self.request)
        except ValueError as exc:
            return self._fail(out, start if not buf else 0, str(exc))
        new_pos = pos + consumed
        try:
            self._begin(head, out, -1 if buf else start, new_pos)
        except ValueError as exc:
            return self._fail(out, start if not buf else 0, str(exc))
        return new_pos

    def _begin(self, head: Head, out: list[tuple], start: int, end: int) -> None:
        """A head ended at ``end``: decide the framing of what follows."""
        if self.request:
            te = head.tokens(b"transfer-encoding")
            if te:
                if te[-1] != b"chunked":
                    raise ValueError("request Transfer-Encoding does not end in chunked")
                if head.values(b"content-length"):
                    # RFC 9112 6.3: chunked wins, but a server that reads the length instead would see another
                    # message boundary (request smuggling): not framed here, so never pooled or watched
                    raise ValueError("request has both Transfer-Encoding and Content-Length")
                framing = "chunked"
            else:
                length = _content_length(head)
                framing = "length" if length else "none"
            self.head = head
            out.append((HEAD, start, end, head))
            self._hold = head.method == b"CONNECT" or (head.get(b"upgrade") is not None and b"upgrade" in head.tokens(b"connection"))
            self._after_head(framing, length if framing == "length" else 0, out, end)
            return
        status = head.status
        method = self._methods[0] if self._methods else b"GET"
        te = head.tokens(b"transfer-encoding")
        bodyless = status < 200 or method == b"HEAD" or status in (204, 304) or (method == b"CONNECT" and status < 300)
        # a Content-Length that frames the body is checked before the head is announced (as for a request):
        # a head the reader cannot frame yields ERROR only
        length = None if bodyless or te else _content_length(head)
        out.append((HEAD, start, end, head))
        if status < 200:
            if status == 101:
                self._methods.popleft() if self._methods else None
                self.head = head
                self.messages += 1
                out.append((END, end))
                self._state = _S_OPAQUE
            return  # interim: the final head follows
        self.head = head
        if self._methods:
            self._methods.popleft()
        if method == b"CONNECT" and 200 <= status < 300:
            self.messages += 1
            out.append((END, end))
            self._state = _S_OPAQUE
            return
        if method == b"HEAD" or status in (204, 304):
            self._end(out, end)
            return
        if te:
            if te[-1] == b"chunked":
                self._after_head("chunked", 0, out, end)
            else:
                self._state = _S_CLOSE
            return
        if length is None:
            self._state = _S_CLOSE
        elif length:
            self._after_head("length", length, out, end)
        else:
            self._end(out, end)

    def _after_head(self, framing: str, length: int, out: list[tuple], end: int) -> None:
        if framing == "length":
            self._state = _S_LENGTH
            self._remaining = length
        elif framing == "chunked":
            self._state = _S_CHUNK_SIZE
            self._buf = b""
        else:
            self._end(out, end)

    def _end(self, out: list[tuple], end: int) -> None:
        self.messages += 1
        out.append((END, end))
        self._buf = b""
        if self._hold:
            self._hold = False
            self._state = _S_HELD
        else:
            self._state = _S_HEAD

    def _feed_chunk_framing(self, data: bytes, pos: int, out: list[tuple]) -> int:
        st = self._state
        if st == _S_CHUNK_CRLF:  # the CRLF after a chunk's data
            buf = self._buf + data[pos : pos + 2 - len(self._buf)]
            used = len(buf) - len(self._buf)
            if buf[:1] == b"\n":  # a bare LF
                self._state = _S_CHUNK_SIZE
                return pos + 1
            if len(buf) < 2:
                if buf != b"\r":
                    return self._fail(out, pos, "chunk data not followed by CRLF")
                self._buf = buf
                return pos + used
            if buf != b"\r\n":
                return self._fail(out, pos, "chunk data not followed by CRLF")
            self._state, self._buf = _S_CHUNK_SIZE, b""
            return pos + used
        if st == _S_CHUNK_SIZE:
            nl = data.find(b"\n", pos)
            if nl < 0:
                self._buf += data[pos:]
                if len(self._buf) > MAX_CHUNK_LINE:
                    return self._fail(out, pos, "chunk-size line too long")
                return len(data)
            line = self._buf + data[pos:nl]
            self._buf = b""
            if len(line) > MAX_CHUNK_LINE:  # (whether or not it came in one read)
                return self._fail(out, pos, "chunk-size line too long")
            if line.endswith(b"\r"):
                line = line[:-1]
            size_text = line.split(b";", 1)[0].strip(b" \t")
            if not size_text or size_text.translate(None, _HEXB) or len(size_text) > 15:
                return self._fail(out, pos, "invalid chunk size")
            size = int(size_text, 16)
            pos = nl + 1
            if size:
                self._state, self._remaining = _S_CHUNK_DATA, size
            else:
                self._state, self._buf, self._remaining = _S_TRAILER, b"", 0  # _remaining: trailer bytes so far
            return pos
        # _S_TRAILER: trailer lines up to an empty line
        while True:
            nl = data.find(b"\n", pos)
            if nl < 0:
                self._buf += data[pos:]
                if self._remaining + len(self._buf) > MAX_CHUNK_LINE:
                    return self._fail(out, pos, "trailer section too long")
                return len(data)
            line = self._buf + data[pos:nl]
            self._buf = b""
            self._remaining += len(line) + 1
            if self._remaining > MAX_CHUNK_LINE:
                return self._fail(out, pos, "trailer section too long")
            pos = nl + 1
            if line in (b"", b"\r"):
                self._end(out, pos)
                return pos

    def _fail(self, out: list[tuple], start: int, reason: str) -> int:
        self._state = _S_ERROR
        self._buf = b""
        self.error = reason
        self.pending_from = None
        out.append((ERROR, start, reason))
        return 1 << 62  # (past any data: the caller's loop ends)


def _py_request_start(joined: bytes) -> str | None:
    """Why the unfinished request head ``joined`` (its leading empty lines skipped) cannot begin a request, or None
    while it may: its first byte is no method character, or its first line is whole and is no request line (the
    rule of :func:`_py_parse_head`). Bytes that are not HTTP (a TLS ClientHello to a plain port, binary junk, a bare
    ``GET /``) are then passed on unparsed at once, and the upstream answers them as it would directly, instead of
    waiting in the reader for an empty line that never comes. (The C accelerator's ``feed_head`` does the same.)"""
    if joined[:1].translate(None, _TCHAR):
        return "request line does not begin with a method"
    nl = joined.find(b"\n")
    if nl < 0:
        return None
    try:
        _py_parse_head(joined[: nl + 1], True)
    except ValueError as exc:
        return str(exc)
    return None


def _py_head_end(buf: bytes, start: int) -> int:
    """Offset just past the empty line that ends the head in ``buf`` (``CRLFCRLF`` or bare ``LFLF``), or -1."""
    i = buf.find(b"\n", start)
    while i >= 0:
        j = i + 1
        if buf[j : j + 1] == b"\n":
            return j + 1
        if buf[j : j + 2] == b"\r\n":
            return j + 2
        i = buf.find(b"\n", j)
    return -1


_head_end = _py_head_end
_BODY_STATES = frozenset({_S_LENGTH, _S_CHUNK_SIZE, _S_CHUNK_DATA, _S_CHUNK_CRLF, _S_TRAILER})
# parse_head, _head_end, Reader._feed_head with a request's framing (inline in Reader.feed), the body states, and the request head's rewrite
# (deltatap.proxy.headers) in C; h1.py and headers.py are the definition
_acc = native.load("deltatap.net._h1", __name__)
_body = None
if _acc is not None:
    _acc.set_head(Head)
    _head_end = _acc.head_end
    _body = _acc.body
