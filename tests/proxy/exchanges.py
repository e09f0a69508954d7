"""Generated HTTP/1.1 exchanges for the tap's transparency fuzz, and how two runs of one are compared.

One definition, two drivers: ``tests/proxy/test_transparency_fuzz.py`` draws through hypothesis
(:class:`HypothesisDraw`), ``benchmarks/transparency_fuzz.py`` through a seeded :class:`random.Random`
(:class:`RandomDraw`); :func:`generate` is the same code for both.

An :class:`Exchange` is the client's request bytes (sent in pieces), the raw upstream's script (answer after
the head and the body, possibly a 100 or a 103 first, in several writes, then keep the connection or close it)
and what the client should wait for. The messages are HTTP/1.1 (RFC 9112) that lenient servers (h11, llhttp)
accept, often unusual: custom and lowercase methods, targets with bytes RFC 3986 would percent-encode
(0x80–0xFF, ``|{}^``, a bare ``%``) and odd percent-escapes, empty ``?``, ``#fragment``, absolute-form, header names in any casing, duplicates differing in case, obs-text (0x80–0xFF) in values,
optional whitespace around values, header lines over 8190 bytes, more than 128 headers, Content-Length /
chunked (extensions, trailers, hex in either case) / no framing, ``Content-Encoding: gzip`` with valid and
invalid gzip, ``Expect: 100-continue``; responses with 100 and 103 before the final one, 204, 304 with a
Content-Length, HEAD answers with Content-Length or Transfer-Encoding, chunked with trailers, close-delimited
bodies. Left out on purpose: ``Connection``, ``Keep-Alive``, ``TE``, ``Upgrade`` and ``Proxy-*`` (RFC 9110
§7.6.1 lets an intermediary drop or rewrite them), ``traceparent``/``tracestate`` and the correlation header
(the tap's own), Content-Length together with Transfer-Encoding and pipelining (a proxy may refuse those).

Comparison (:func:`compare`): what the upstream received, after :func:`normalise`, and what the client
received must be byte-identical between the direct run and the run through the tap, and the client's
connection must end the same way.
"""

from __future__ import annotations

import gzip
import random
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence, TypeVar

from raw_peer import Body, End, Head, Pause, Send, Step

T = TypeVar("T")

TAP_ADDED = ("traceparent", "tracestate")  # + the tap's correlation header (TapOptions.correlation_header)


# ---- where the randomness comes from ------------------------------------------------------------------
class Draw(Protocol):
    def int(self, lo: int, hi: int) -> int: ...
    def pick(self, seq: Sequence[T]) -> T: ...
    def raw(self, max_size: int) -> bytes: ...


class RandomDraw:
    """Draws from a seeded :class:`random.Random` (the benchmark: fast, one seed per exchange)."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def int(self, lo: int, hi: int) -> int:
        return self.rng.randint(lo, hi)

    def pick(self, seq: Sequence[T]) -> T:
        return seq[self.rng.randrange(len(seq))]

    def raw(self, max_size: int) -> bytes:
        return self.rng.randbytes(self.rng.randint(0, max_size))


class HypothesisDraw:
    """Draws through hypothesis' ``st.data()`` (the test: reproducible with ``derandomize=True``)."""

    def __init__(self, data: Any) -> None:
        from hypothesis import strategies as st

        self.data, self.st = data, st

    def int(self, lo: int, hi: int) -> int:
        return self.data.draw(self.st.integers(lo, hi))

    def pick(self, seq: Sequence[T]) -> T:
        return self.data.draw(self.st.sampled_from(seq))

    def raw(self, max_size: int) -> bytes:
        return self.data.draw(self.st.binary(max_size=max_size))


def chance(d: Draw, percent: int) -> bool:
    return d.int(0, 99) < percent


# ---- the exchange -------------------------------------------------------------------------------------
@dataclass
class Exchange:
    request: bytes
    pieces: list[bytes]  # request split where the client pauses
    script: list[Step]  # the upstream's answer
    response: bytes  # every byte the upstream sends (interim heads included)
    closes: bool  # the upstream closes after the response (close-delimited body)
    method: str
    status: int  # the final status
    features: list[str] = field(default_factory=list)  # what this exchange exercises (for the report)

    def describe(self, limit: int = 600) -> str:
        def cut(b: bytes) -> str:
            return repr(b[:limit]) + (f"... ({len(b)} bytes)" if len(b) > limit else "")

        return f"features={self.features}\n  request={cut(self.request)}\n  response={cut(self.response)}"


METHODS = ["GET", "GET", "POST", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "HEAD", "FOO", "X_CUSTOM", "get", "post", "PROPFIND", "M-SEARCH"]
BODY_METHODS = {"POST", "PUT", "PATCH", "FOO", "X_CUSTOM", "post", "PROPFIND", "M-SEARCH"}
REQUEST_NAMES = ["Accept", "Accept-Language", "User-Agent", "Content-Type", "ETag", "Cache-Control", "Authorization",
                 "Cookie", "X-Tenant", "X-Api-Key", "If-None-Match", "Content-Disposition", "Via", "Forwarded",
                 "X-Forwarded-For", "Date", "Accept-Encoding", "Origin", "Referer", "Pragma"]
RESPONSE_NAMES = ["Content-Type", "ETag", "Set-Cookie", "Server", "Date", "Cache-Control", "Vary", "Link", "Age",
                  "Last-Modified", "Content-Disposition", "X-Request-Cost", "Access-Control-Allow-Origin", "Retry-After",
                  "WWW-Authenticate", "Location", "X-Ratelimit-Remaining"]
TCHAR = b"!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
PATH_PIECES = [b"v1", b"chat", b"completions", b"a%2Fb", b"%20", b"%e9t%C3%A9", b"%", b"%G1", b"~u", b"!$&'()*+,;=",
               b":@", b"\xc3\xa9", b"\xff", b"|{}^", b"..", b".", b"", b"x" * 40]
STATUSES = [200, 200, 200, 201, 202, 204, 206, 299, 301, 304, 400, 401, 404, 418, 429, 500, 503, 599]
REASONS = {200: b"OK", 201: b"Created", 202: b"Accepted", 204: b"No Content", 206: b"Partial Content", 301: b"Moved",
           304: b"Not Modified", 400: b"Bad Request", 401: b"Unauthorized", 404: b"Not Found", 418: b"I'm a teapot",
           429: b"Too Many Requests", 500: b"Internal Server Error", 503: b"Service Unavailable"}
TRAILER_NAMES = ["X-Checksum", "Server-Timing", "X-Trailer", "Grpc-Status"]
KNOWN_NAMES = {n.lower() for n in [*REQUEST_NAMES, *RESPONSE_NAMES, *TRAILER_NAMES, "Host", "Content-Length", "Transfer-Encoding",
                                   "Content-Encoding", "Expect", "Link", "X-Long", "X-Request-Id", "Connection", "Keep-Alive",
                                   "Traceparent", "Tracestate", "Server", "Date"]}
RESERVED = {"connection", "keep-alive", "te", "upgrade", "proxy-connection", "proxy-authorization", "trailer",
            "content-length", "transfer-encoding", "host", "expect", "content-encoding", *TAP_ADDED, "x-request-id"}


def _expand(seed: int, n: int, alphabet: bytes) -> bytes:
    """``n`` bytes from ``alphabet``, derived from ``seed`` (big values from a small draw)."""
    return bytes(random.Random(seed).choices(alphabet, k=n))


def _case(d: Draw, name: str) -> bytes:
    how = d.int(0, 3)
    if how == 0:
        return name.encode()
    if how == 1:
        return name.lower().encode()
    if how == 2:
        return name.upper().encode()
    seed = d.int(0, 1 << 16)
    rng = random.Random(seed)
    return "".join(c.upper() if rng.random() < 0.5 else c.lower() for c in name).encode()


def _name(d: Draw, pool: list[str]) -> bytes:
    if chance(d, 75):
        return _case(d, d.pick(pool))
    token = bytes(c for c in d.raw(12) if c in TCHAR)
    name = b"X-" + token if token else b"X-Fuzz"
    return name if name.decode().lower() not in RESERVED else b"X-Fuzz"


VCHAR = bytes(range(0x21, 0x7F))
OBS = bytes(range(0x80, 0x100))


def _value(d: Draw) -> bytes:
    kind = d.int(0, 7)
    if kind == 0:
        return b""
    if kind == 1:  # obs-text
        return b'attachment; filename="r\xe9sum\xe9.pdf"' if chance(d, 50) else _expand(d.int(0, 1 << 16), d.int(1, 40), VCHAR + OBS + b" ")
    if kind == 2:  # inner whitespace and a list
        return b'a, b ,\t"q, uoted" ;  p=1'
    if kind == 3:
        return _expand(d.int(0, 1 << 16), d.int(1, 200), VCHAR)
    top = 0x100 if chance(d, 30) else 0x7F  # obs-text in some
    raw = bytes(c for c in d.raw(30) if 0x21 <= c < top)
    return raw or b"v"


def _field(d: Draw, name: bytes, value: bytes) -> bytes:
    ows = d.pick([b": ", b": ", b": ", b":", b":  ", b":\t"])
    trail = d.pick([b"", b"", b"", b" ", b"\t"]) if value else b""
    return name + ows + value + trail + b"\r\n"


def _headers(d: Draw, pool: list[str], features: list[str]) -> list[bytes]:
    lines: list[bytes] = []
    for _ in range(d.int(0, 10)):
        name, value = _name(d, pool), _value(d)
        lines.append(_field(d, name, value))
        if chance(d, 20):  # a duplicate: same name in another casing, another value
            features.append("duplicate")
            lines.append(_field(d, _case(d, name.decode("latin-1")), _value(d)))
    if any(any(c >= 0x80 for c in line) for line in lines):
        features.append("obs-text")
    if chance(d, 5):
        features.append("long-line")
        lines.insert(d.int(0, len(lines)), b"X-Long: " + _expand(d.int(0, 1 << 16), d.int(8191, 12000), VCHAR) + b"\r\n")
    if chance(d, 5):
        features.append("many-headers")
        n, base = d.int(129, 160), d.int(0, 1 << 16)
        for i in range(n):
            lines.append(b"%s: %d\r\n" % (random.Random(base + i).choice([b"X-F", b"x-f", b"X-f"]) + str(i).encode(), base + i))
    return lines


def _body(d: Draw, features: list[str]) -> tuple[bytes, list[bytes]]:
    """A body and the Content-Encoding header lines to go with it."""
    size, seed = d.pick([0, 1, 5, 100, 1000, 4000, 20000]), d.int(0, 1 << 16)
    plain = _expand(seed, size, b"abcdefghij \n{}\":,0123456789")
    if size and chance(d, 15):
        name = _case(d, "Content-Encoding")
        if chance(d, 60):
            features.append("gzip")
            return gzip.compress(plain, mtime=0), [name + b": gzip\r\n"]
        features.append("bad-gzip")
        return plain[: max(1, size // 2)] if chance(d, 50) else gzip.compress(plain, mtime=0)[:-5], [name + b": gzip\r\n"]
    return (plain if chance(d, 70) else random.Random(seed).randbytes(size)), []


def _chunked(d: Draw, body: bytes, features: list[str], trailer_pool: list[str]) -> bytes:
    features.append("chunked")
    out, pos, seed = bytearray(), 0, d.int(0, 1 << 16)
    rng = random.Random(seed)
    upper, ext = chance(d, 30), chance(d, 25)
    while pos < len(body):
        n = min(len(body) - pos, rng.choice([1, 7, 100, 1000, 4096, 10000]))
        size = b"%X" % n if upper else b"%x" % n
        if rng.random() < 0.1:
            size = b"0" + size
        out += size + (b";ext=%d" % rng.randrange(100) if ext and rng.random() < 0.5 else b"") + b"\r\n" + body[pos : pos + n] + b"\r\n"
        pos += n
    out += b"0" + (b";last" if ext else b"") + b"\r\n"
    if chance(d, 35):
        features.append("trailers")
        for _ in range(d.int(1, 2)):
            out += _field(d, _name(d, trailer_pool), _value(d))
    if ext:
        features.append("chunk-ext")
    return bytes(out) + b"\r\n"


def _target(d: Draw, features: list[str]) -> bytes:
    path = b"/" + b"/".join(d.pick(PATH_PIECES) for _ in range(d.int(0, 4)))
    q = d.int(0, 5)
    if q == 1:
        features.append("empty-query")
        path += b"?"
    elif q >= 2:
        path += b"?" + d.pick([b"a=1&b=%20&c", b"q=\xe9&q=2", b"x=%zz&&=", b"model=m;v=2"])
    if chance(d, 8):
        features.append("fragment")
        path += b"#" + d.pick([b"frag", b"", b"a?b"])
    if chance(d, 8):
        features.append("absolute-form")
        return b"http://" + d.pick([b"example.test", b"127.0.0.1:8080", b"Engine.Internal"]) + path
    return path


def _split(d: Draw, data: bytes, most: int) -> list[bytes]:
    cuts = sorted({d.int(1, len(data) - 1) for _ in range(d.int(0, most - 1))}) if len(data) > 1 else []
    edges = [0, *cuts, len(data)]
    return [data[a:b] for a, b in zip(edges, edges[1:])]


def generate(d: Draw) -> Exchange:
    features: list[str] = []
    method = d.pick(METHODS)
    if method in ("FOO", "X_CUSTOM", "get", "post", "PROPFIND", "M-SEARCH"):
        features.append("odd-method")
    lines = _headers(d, REQUEST_NAMES, features)
    lines.insert(d.int(0, len(lines)), _field(d, _case(d, "Host"), d.pick([b"example.test", b"127.0.0.1:8000", b"Engine.Internal"])))
    framing = d.pick(["cl", "chunked", "none"]) if method in BODY_METHODS else d.pick(["none", "none", "none", "cl"])
    if method == "HEAD":
        framing = "none"
    body_wire, body, expect_100 = b"", b"", False
    if framing != "none":
        body, ce = _body(d, features)
        for line in ce:
            lines.insert(d.int(0, len(lines)), line)
        if framing == "cl":
            lines.insert(d.int(0, len(lines)), _case(d, "Content-Length") + b": %d\r\n" % len(body))
            body_wire = body
        else:
            lines.insert(d.int(0, len(lines)), _case(d, "Transfer-Encoding") + b": chunked\r\n")
            body_wire = _chunked(d, body, features, TRAILER_NAMES[:3])
        if chance(d, 10):
            features.append("expect-100")
            expect_100 = True
            lines.insert(d.int(0, len(lines)), _case(d, "Expect") + b": 100-continue\r\n")
    elif method in BODY_METHODS:
        features.append("bodyless-" + method.lower())
    request = method.encode() + b" " + _target(d, features) + b" HTTP/1.1\r\n" + b"".join(lines) + b"\r\n" + body_wire

    # the answer
    status = d.pick(STATUSES)
    interim: list[bytes] = []
    if expect_100:
        interim.append(b"HTTP/1.1 100 Continue\r\n\r\n")
    if chance(d, 10):
        features.append("103")
        interim.append(b"HTTP/1.1 103 Early Hints\r\n" + _case(d, "Link") + b": </s.css>; rel=preload\r\n\r\n")
    reason = d.pick([REASONS.get(status, b"Whatever"), REASONS.get(status, b"Whatever"), b"", b"caf\xe9 ok"])
    rlines = _headers(d, RESPONSE_NAMES, features)
    no_body = method.upper() == "HEAD" or status in (204, 304)
    rbody, rbody_wire, closes = b"", b"", False
    if no_body:
        features.append("head" if method.upper() == "HEAD" else str(status))
        if status != 204 and chance(d, 60):
            if method.upper() == "HEAD" and chance(d, 50):
                features.append("head-te")
                rlines.insert(d.int(0, len(rlines)), _case(d, "Transfer-Encoding") + b": chunked\r\n")
            else:
                rlines.insert(d.int(0, len(rlines)), _case(d, "Content-Length") + b": %d\r\n" % d.int(0, 5000))
    else:
        rbody, ce = _body(d, features)
        for line in ce:
            rlines.insert(d.int(0, len(rlines)), line)
        rframing = d.pick(["cl", "cl", "chunked", "close"])
        if rframing == "cl":
            rlines.insert(d.int(0, len(rlines)), _case(d, "Content-Length") + b": %d\r\n" % len(rbody))
            rbody_wire = rbody
        elif rframing == "chunked":
            rlines.insert(d.int(0, len(rlines)), _case(d, "Transfer-Encoding") + b": chunked\r\n")
            rbody_wire = _chunked(d, rbody, features, TRAILER_NAMES[:2] + TRAILER_NAMES[3:])
        else:
            features.append("close-delimited")
            rbody_wire, closes = rbody, True
    final = b"HTTP/1.1 %d %s\r\n" % (status, reason) + b"".join(rlines) + b"\r\n" + rbody_wire
    response = b"".join(interim) + final

    head_len = request.index(b"\r\n\r\n") + 4
    script: list[Step] = [Head()]
    pause = d.pick([0.0, 0.0, 0.001, 0.003])
    rest = list(interim)
    if expect_100:
        script.append(Send(rest.pop(0)))
    if len(request) > head_len:
        script.append(Body(len(request) - head_len, 0.4))
    for i, w in enumerate([*rest, *_split(d, final, 3)]):
        if i and pause:
            script.append(Pause(pause))
        script.append(Send(w))
    script.append(End("close" if closes else "keep"))
    return Exchange(request, _split(d, request, 4), script, response, closes, method, status, sorted(set(features)))


# ---- comparison ---------------------------------------------------------------------------------------
def normalise(received: bytes, correlation_header: str) -> bytes:
    """The request bytes an upstream received, less the header lines the tap may add to the request head:
    ``traceparent``, ``tracestate`` and ``correlation_header`` (names compared case-insensitively). Nothing
    else is touched: no other line, no order, no case, no byte of the body. Applied to both runs (the direct
    one has no such line: :func:`generate` never makes them)."""
    end = received.find(b"\r\n\r\n")
    if end < 0:
        return received
    drop = {n.encode() for n in TAP_ADDED} | {correlation_header.lower().encode()}
    head = received[: end + 2].split(b"\r\n")
    kept = [head[0]] + [ln for ln in head[1:] if ln.split(b":", 1)[0].strip().lower() not in drop]
    return b"\r\n".join(kept) + received[end + 2 :]


@dataclass
class Run:
    """One run of an exchange: what the upstream got (normalised), what the client got, how it ended."""

    upstream: bytes
    client: bytes
    end: str


def _heads(data: bytes) -> tuple[list[bytes], bytes]:
    """Every head at the start of ``data`` (interim 1xx ones, then the final one) and what follows."""
    heads = []
    while True:
        end = data.find(b"\r\n\r\n")
        if end < 0:
            return heads, data
        heads.append(data[: end + 4])
        data = data[end + 4 :]
        if not re.match(rb"HTTP/1\.\d 1\d\d", heads[-1]) or heads[-1].startswith(b"HTTP/1.1 101"):
            return heads, data


def _split_head(data: bytes) -> tuple[bytes, bytes]:
    end = data.find(b"\r\n\r\n")
    return (data[: end + 4], data[end + 4 :]) if end >= 0 else (b"", data)


def head_kinds(side: str, want: bytes, got: bytes) -> list[str]:
    """How the head ``got`` differs from ``want``, in a few named kinds."""
    w, g = want.split(b"\r\n"), got.split(b"\r\n")
    kinds = []
    if w[0] != g[0]:
        kinds.append(f"{side}.start-line")
    wl, gl = [x for x in w[1:] if x], [x for x in g[1:] if x]
    if wl == gl:
        return kinds
    missing, added = Counter(wl) - Counter(gl), Counter(gl) - Counter(wl)

    def name(line: bytes) -> bytes:
        return line.split(b":", 1)[0]

    def label(line: bytes) -> str:  # a generated name (X-F17, X-<random>) counts under one label
        n = name(line).lower().decode("latin-1")
        return n if n in KNOWN_NAMES else "x-f<n>" if re.fullmatch(r"x-f\d+", n) else "x-<random>"

    added_by_name: dict[bytes, list[bytes]] = {}
    for line in added.elements():
        added_by_name.setdefault(name(line).lower(), []).append(line)
    for line in missing.elements():
        twins = added_by_name.get(name(line).lower())
        if not twins:
            kinds.append(f"{side}.header-dropped:{label(line)}")
            continue
        twin = twins.pop(0)
        if name(twin) != name(line):
            kinds.append(f"{side}.name-recased")
        if twin.split(b":", 1)[1:] != line.split(b":", 1)[1:]:
            kinds.append(f"{side}.value-altered")
    for rest in added_by_name.values():
        kinds += [f"{side}.header-added:{label(line)}" for line in rest]
    if not missing and not added:
        kinds.append(f"{side}.reordered")
    return sorted(set(kinds))


def compare(direct: Run, tapped: Run) -> list[str]:
    """Kinds of difference between the direct run and the run through the tap (empty: transparent)."""
    if direct.upstream and not tapped.upstream:  # what the client got then is the tap's own answer, or nothing
        answer = _STATUS.match(tapped.client)
        return [f"request.not-forwarded:tap-answered-{answer.group(1).decode() if answer else 'nothing'}"]
    kinds: list[str] = []
    if direct.upstream != tapped.upstream:
        dh, db = _split_head(direct.upstream)
        th, tb = _split_head(tapped.upstream)
        kinds += head_kinds("request", dh, th) if th else ["request.head-incomplete"]
        if db != tb:
            kinds.append("request.body")
    if direct.client != tapped.client:
        response: list[str] = []
        dh, db = _heads(direct.client)
        th, tb = _heads(tapped.client)
        if [_code(h) for h in dh[:-1]] != [_code(h) for h in th[:-1]]:  # interim (1xx) heads added or lost
            response.append(f"response.interim:{'+'.join(_code(h) for h in dh[:-1]) or 'none'}->"
                            f"{'+'.join(_code(h) for h in th[:-1]) or 'none'}")
        else:
            for a, b in zip(dh[:-1], th[:-1]):
                response += head_kinds("response", a, b)
        if not th:
            response.append("response.none")
        elif _code(dh[-1]) != _code(th[-1]):  # another answer altogether: its fields say nothing more
            response.append(f"response.replaced-by-{_code(th[-1])}")
        else:
            response += head_kinds("response", dh[-1], th[-1])
            if db != tb:
                response.append("response.body")
        kinds += sorted(set(response)) or ["response.other"]
    if direct.end != tapped.end:
        kinds.append(f"end:{direct.end}->{tapped.end}")
    return kinds


_STATUS = re.compile(rb"HTTP/1\.\d (\d{3})")


def _code(head: bytes) -> str:
    m = _STATUS.match(head)
    return m.group(1).decode() if m else "?"


def first_difference(want: bytes, got: bytes, context: int = 60) -> str:
    """Where two byte strings part, with some context on each side (for assertion messages)."""
    n = next((i for i, (a, b) in enumerate(zip(want, got)) if a != b), min(len(want), len(got)))
    lo = max(0, n - context)
    return f"at byte {n} of {len(want)} vs {len(got)}: want {want[lo:n + context]!r}\n{' ' * 20}got  {got[lo:n + context]!r}"
