"""deltatap.net._h1 (the C accelerator of deltatap.net.h1) against h1.py's Python, the definition.

Differential property tests: the same bytes, split at the same random points, go through a Reader running the
accelerator and a Reader running the Python reference; every event, every offset, every Head field and every
piece of reader state after each feed must be equal, and ``parse_head`` must return the same head or raise the
same ``ValueError``. The inputs are valid generated streams (the generators of test_h1.py's h11/httptools
differential harness, which itself runs with the accelerator whenever it is built) and malformed ones: chunk
sizes with bad digits, spaces, extensions, overlong lines, broken CRLFs, oversize trailers, random bytes.
"""

from __future__ import annotations

import contextlib
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deltatap.net import h1
from deltatap.net.h1 import HEAD
from tests.kernel.test_h1 import request_stream, response_stream, wire

pytestmark = pytest.mark.skipif(h1._acc is None, reason="deltatap.net._h1 is not built or DELTATAP_NATIVE turns it off")

EXAMPLES = settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@contextlib.contextmanager
def reference():
    """h1.py with its accelerator unplugged: the Python definition runs (restored on exit)."""
    saved = h1._acc, h1._body, h1._head_end
    h1._acc, h1._body, h1._head_end = None, None, h1._py_head_end
    try:
        yield
    finally:
        h1._acc, h1._body, h1._head_end = saved


def head_fields(head: h1.Head) -> tuple:
    index = {n.lower(): head.values(n.lower()) for n, _ in head.headers}
    return (head.raw, head.method, head.target, head.version, head.status, head.reason, head.headers, index, head.keep_alive)


def state(r: h1.Reader) -> tuple:
    return (r._state, r._buf, r._remaining, r.pending_from, r.messages, r.error, r.idle, r.in_message, r.opaque, r.held,
            r.close_delimited, r._held, None if r.head is None else head_fields(r.head))


def trace(pieces: list[bytes], request: bool, methods: list[bytes], max_head: int = h1.MAX_HEAD) -> list:
    """Everything a Reader says about ``pieces``: each feed's events and the state after it, then feed_eof."""
    r = h1.Reader(request, max_head)
    for m in methods:
        r.expect(m)
    out: list = []
    for data in pieces:
        events = r.feed(data)
        out.append([(e[0], e[1], e[2], head_fields(e[3])) if e[0] == HEAD else e for e in events])
        out.append(state(r))
        if r.held:  # a protocol switch asked for: the answer (alternating) lets the rest be read
            held, evs = r.switch(len(out) % 4 == 0)
            out.append((held, [(e[0], e[1], e[2], head_fields(e[3])) if e[0] == HEAD else e for e in evs], state(r)))
    out.append(r.feed_eof())
    out.append(state(r))
    return out


def both(pieces: list[bytes], request: bool, methods: list[bytes] = (), max_head: int = h1.MAX_HEAD) -> list:
    fast = trace(pieces, request, list(methods), max_head)
    with reference():
        slow = trace(pieces, request, list(methods), max_head)
    assert fast == slow
    return fast


def cut(data: bytes, points: list[int]) -> list[bytes]:
    bounds = [0, *sorted({p % (len(data) + 1) for p in points}), len(data)]
    return [data[a:b] for a, b in zip(bounds, bounds[1:]) if b > a] or [data]


# ---- valid streams (the h11/httptools harness's generators) ------------------------------------------------------

GENERATED = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])  # (slow generators)


@GENERATED
@given(request_stream(), st.lists(st.integers(0, 1 << 16), max_size=12))
def test_generated_request_streams_split_anywhere(gen, points):
    msgs, _ = gen
    both(cut(wire(msgs, True), points), True)


@GENERATED
@given(response_stream(), st.lists(st.integers(0, 1 << 16), max_size=12))
def test_generated_response_streams_split_anywhere(gen, points):
    methods, msgs, _ = gen
    both(cut(wire(msgs, False), points), False, methods)


# ---- malformed framing ----------------------------------------------------------------------------------------

SIZE_LINES = st.one_of(
    st.sampled_from([b"0", b"5", b"A", b"a", b"fF", b"000000000000005", b"0000000000000005", b"fffffffffffffff", b"1000000000000000",
                     b"", b" ", b"5 ", b" 5", b"\t5\t", b"5;ext", b"5 ;a=b", b";", b"5;" + b"x" * 70000, b"-5", b"+5", b"0x5",
                     b"5\r", b"g", b"\x00", b"\xff", b"5\x00", "５".encode()]),
    st.binary(max_size=20),
)
EOLS = st.sampled_from([b"\r\n", b"\n", b"\r", b"", b"\r\r\n", b"\n\r"])


@st.composite
def chunked_message(draw) -> bytes:
    out = b""
    for _ in range(draw(st.integers(0, 4))):
        size_line = draw(SIZE_LINES)
        out += size_line + draw(EOLS)
        body_len = draw(st.integers(0, 20))
        out += draw(st.binary(min_size=body_len, max_size=body_len)) + draw(EOLS)
    if draw(st.booleans()):
        out += b"0" + draw(EOLS)
        for _ in range(draw(st.integers(0, 3))):
            out += draw(st.sampled_from([b"X-T: 1", b"", b"\r", b"a" * draw(st.integers(0, 70000)), b"Trailer:\xff"])) + draw(EOLS)
        out += draw(EOLS)
    return out


@EXAMPLES
@given(st.lists(chunked_message(), min_size=1, max_size=3), st.booleans(), st.lists(st.integers(0, 1 << 18), max_size=10))
def test_malformed_chunked_bodies_split_anywhere(bodies, request, points):
    stream = b""
    for body in bodies:
        if request:
            stream += b"POST /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n" + body
        else:
            stream += b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + body
    both(cut(stream, points), request, [b"GET"] * len(bodies))


@EXAMPLES
@given(st.lists(st.tuples(st.integers(0, 40), st.binary(max_size=60)), min_size=1, max_size=4), st.lists(st.integers(0, 4000), max_size=8))
def test_content_length_bodies_with_random_lengths(parts, points):
    stream = b""
    for length, data in parts:
        stream += b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % length + data
    both(cut(stream, points), False, [b"GET"] * len(parts))


HEAD_PIECES = st.sampled_from([
    b"GET", b"POST", b"get", b"X_C", b" ", b"  ", b"\t", b"/", b"/a?b#c", b"HTTP/1.1", b"HTTP/1.0", b"HTTP/2.0", b"HTTP/1.x",
    b"HTTP/1.1 200 OK", b"HTTP/1.1 101 Switching", b"HTTP/1.1 099 X", b"HTTP/1.1 20x", b"HTTP/1.1 2000", b"HTTP/1.1 100",
    b"\r\n", b"\n", b"\r", b"\r\n\r\n", b"\n\n", b":", b"Host: a", b"Content-Length: 3", b"Content-Length: 3, 3",
    b"Content-Length: 3, 4", b"Content-Length: -1", b"Content-Length: 99999999999999999999", b"Transfer-Encoding: chunked",
    b"Transfer-Encoding: gzip", b"Connection: close", b"Connection: Upgrade", b"Upgrade: websocket", b"X:\x80\xff",
    b"X: a\x00b", b"X: a\rb", b"Bad Name: v", b"\x00", b"\xef\xbb\xbf", b"CONNECT", b"HEAD", b"abc", b"0\r\n\r\n",
])


@settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(HEAD_PIECES, max_size=24), st.booleans())
def test_parse_head_of_any_bytes_returns_the_same_head_or_the_same_error(pieces, request):
    raw = b"".join(pieces)
    got = want = None
    try:
        got = ("ok", head_fields(h1.parse_head(raw, request)))
    except ValueError as exc:
        got = ("error", str(exc))
    try:
        want = ("ok", head_fields(h1._py_parse_head(raw, request)))
    except ValueError as exc:
        want = ("error", str(exc))
    assert got == want
    assert h1._head_end(raw, 0) == h1._py_head_end(raw, 0)


@EXAMPLES
@given(st.lists(HEAD_PIECES, max_size=40), st.booleans(), st.lists(st.integers(0, 600), max_size=10), st.sampled_from([h1.MAX_HEAD, 64]))
def test_random_heads_and_bodies_split_anywhere(pieces, request, points, max_head):
    stream = b"".join(pieces)
    both(cut(stream, points), request, [b"GET", b"HEAD", b"CONNECT"] * 3, max_head)


def test_a_seeded_random_byte_soup_in_thousands_of_splits():
    """Bytes from a small alphabet that makes framing characters likely, read in random pieces."""
    rng = random.Random(1515)
    alphabet = b"0123456789abcdefXZ;: \t\r\n\r\n\x00\xff"
    prefix_req = b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
    prefix_resp = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    for i in range(3000):
        body = bytes(rng.choice(alphabet) for _ in range(rng.randint(0, 60)))
        request = bool(i % 2)
        stream = (prefix_req if request else prefix_resp) + body
        both(cut(stream, [rng.randint(0, len(stream)) for _ in range(rng.randint(0, 6))]), request, [b"GET"])


def test_the_accelerator_refuses_wrong_argument_types_with_type_errors():
    with pytest.raises(TypeError):
        h1._acc.body(b"", 0, 1, 0, "not bytes", [])
    with pytest.raises(TypeError):
        h1._acc.body(b"", 0, 1, 0, b"", ())
    with pytest.raises(TypeError):
        h1._acc.parse_head("text", True)
