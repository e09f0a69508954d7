"""The request head's work in one C call (``_h1.feed_head``, ``_h1.rewrite_head``) against the Python definition.

``Reader._feed_head`` (with a request's framing, ``Reader._begin``) and
:func:`deltatap.proxy.headers.rewrite_request_head` each run once with deltatap.net._h1 and once as h1.py /
headers.py's Python on thousands of generated heads: standard, custom and lowercase methods, origin-, absolute-,
authority-form and odd targets (control bytes, obs-text), HTTP/1.0, /1.1 and others, duplicate and mixed-case names,
obs-text and NUL/CR in values, folded lines, lines without a colon, every framing header (good, conflicting,
ambiguous), Connection / Upgrade / CONNECT holds, leading empty lines, bare-LF line ends, heads over the reader's
limit, pipelined requests with bodies, all split at random points across reads. Every event, every Head field, the
reader's state after each feed, the rewritten bytes and every error must be the same. Also: a fingerprint with the
keyed state made once and copied is the HMAC-SHA256 made afresh.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deltatap.core import fingerprint as fpmod
from deltatap.net import h1
from deltatap.proxy import headers as hdrs
from tests.kernel.test_h1_native import both, cut, head_fields, reference

native = pytest.mark.skipif(h1._acc is None, reason="deltatap.net._h1 is not built or DELTATAP_NATIVE turns it off")

MANY = settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

METHODS = st.one_of(
    st.sampled_from([b"GET", b"POST", b"PUT", b"HEAD", b"CONNECT", b"OPTIONS", b"get", b"connect", b"FOO", b"X_CUSTOM",
                     b"QUERY~1", b"", b"G ET", b"GE(T", b"\x80", b"PRI"]),
    st.text("!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz", min_size=1, max_size=8).map(str.encode),
)
TARGETS = st.one_of(
    st.sampled_from([b"/", b"/v1/chat/completions", b"/a?b=c&d", b"/a?", b"/a#frag", b"http://h:1/p?q", b"https://x", b"h:443",
                     b"*", b"", b"/\x7f", b"/a\x00b", b"/\x80\xff", b"/a\tb", b"//", b"/a b"]),
    st.binary(max_size=12),
)
VERSIONS = st.sampled_from([b"HTTP/1.1", b"HTTP/1.0", b"HTTP/1.9", b"HTTP/2.0", b"HTTP/1.x", b"http/1.1", b"HTTP/1.10", b""])
NAMES = st.one_of(
    st.sampled_from([b"Host", b"host", b"HOST", b"Content-Length", b"content-length", b"CONTENT-LENGTH", b"Transfer-Encoding",
                     b"transfer-encoding", b"Connection", b"connection", b"Upgrade", b"UPGRADE", b"traceparent", b"TraceParent",
                     b"tracestate", b"Tracestate", b"X-Request-Id", b"x-request-id", b"Content-Type", b"X-Tenant", b"x-tenant",
                     b"Expect", b"Keep-Alive", b"", b"Bad Name", b"X(y)", b"\x80", b"a\x00"]),
    st.text("abcXYZ-_!~0", min_size=1, max_size=6).map(str.encode),
)
VALUES = st.one_of(
    st.sampled_from([b"", b"a", b"chunked", b"Chunked", b"gzip", b"gzip, chunked", b"chunked, gzip", b",", b" , chunked ,",
                     b"identity", b"0", b"5", b"05", b"5, 5", b"5,5,", b"5, 6", b" 5 ", b"-1", b"+5", b"1" * 18, b"1" * 19,
                     b"\x0b5\x0c", b"close", b"keep-alive", b"Keep-Alive, Upgrade", b"upgrade", b"CLOSE", b"websocket",
                     b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", b"rojo=00f067aa0ba902b7", b"r\xe9sum\xe9.pdf",
                     b"a\x00b", b"a\rb", b"\t padded \t", b"x" * 300]),
    st.binary(max_size=10),
)
SEPS = st.sampled_from([b": ", b":", b":\t", b" : ", b": \t", b"::"])
EOLS = st.sampled_from([b"\r\n", b"\r\n", b"\r\n", b"\n"])


@st.composite
def request_head(draw) -> bytes:
    """One request head, usually valid, sometimes not, ending in an empty line (or, rarely, not ending)."""
    eol = draw(EOLS)
    out = draw(st.sampled_from([b"", b"", b"", b"\r\n", b"\n", b"\r\n\n"]))  # leading empty lines
    start = draw(METHODS) + b" " + draw(TARGETS) + b" " + draw(VERSIONS)
    out += draw(st.sampled_from([start, start, start, start + b" ", b"GET /", b"", b" " + start]))
    for _ in range(draw(st.integers(0, 9))):
        kind = draw(st.integers(0, 19))
        if kind == 0:  # an obs-fold continuation
            line = draw(st.sampled_from([b" ", b"\t", b"  "])) + draw(VALUES)
        elif kind == 1:  # no colon, or whitespace before it
            line = draw(st.sampled_from([b"NoColon", b": empty name", b"Name : v", b"\x00: v"]))
        else:
            line = draw(NAMES) + draw(SEPS) + draw(VALUES)
        out += eol + line
    if draw(st.integers(0, 30)):
        out += eol + draw(st.sampled_from([eol, eol, b"\n", b"\r\n"]))
    return out


@st.composite
def request_message(draw) -> bytes:
    """A head and, perhaps, body bytes for the framing it may have (or not)."""
    head = draw(request_head())
    tail = draw(st.sampled_from([b"", b"", b"abc", b"0\r\n\r\n", b"3\r\nabc\r\n0\r\n\r\n", b"5;x=y\r\nhello\r\n0\r\nT: 1\r\n\r\n", b"hello"]))
    return head + tail


FRAMING_VALUES = st.sampled_from([b"chunked", b"CHUNKED", b"gzip", b"gzip, chunked", b"chunked, gzip", b"chunked,", b",", b"",
                                  b"0", b"3", b"03", b"3, 3", b"3,3,", b"3, 4", b" 3 ", b"\x0b3\x0c", b"-1", b"+3", b"3 3", b"1" * 18,
                                  b"9" * 18, b"1" * 19, b"close", b"Keep-Alive", b"keep-alive, Upgrade", b"UPGRADE", b"websocket", b""])
FRAMING_NAMES = st.sampled_from([b"Transfer-Encoding", b"transfer-encoding", b"TRANSFER-ENCODING", b"Content-Length", b"content-length",
                                 b"Content-length", b"Connection", b"connection", b"Upgrade", b"upgrade", b"X-Other"])


@st.composite
def framing_head(draw) -> bytes:
    """A valid request line and framing headers: every way a request's framing, hold and keep-alive are decided."""
    eol = draw(EOLS)
    out = draw(st.sampled_from([b"GET", b"POST", b"CONNECT", b"connect", b"PUT"])) + b" /x " + draw(st.sampled_from([b"HTTP/1.1", b"HTTP/1.0"]))
    for _ in range(draw(st.integers(0, 4))):
        out += eol + draw(FRAMING_NAMES) + b": " + draw(FRAMING_VALUES)
        if draw(st.integers(0, 9)) == 0:
            out += eol + b" " + draw(FRAMING_VALUES)  # folded into the value
    return out + eol + eol


def fed(stream: bytes, points: list[int], max_head: int) -> None:
    both(cut(stream, points), True, (), max_head)


@native
@MANY
@given(st.lists(request_message(), min_size=1, max_size=4), st.lists(st.integers(0, 1 << 12), max_size=10),
       st.sampled_from([h1.MAX_HEAD, h1.MAX_HEAD, 200, 40]))
def test_pipelined_generated_request_heads_split_anywhere(msgs, points, max_head):
    """The same events, Head contents, errors and reader state, read in random pieces."""
    fed(b"".join(msgs), points, max_head)


@native
@MANY
@given(st.lists(st.tuples(framing_head(), st.sampled_from([b"", b"abc", b"0\r\n\r\n", b"3\r\nabc\r\n0\r\n\r\n"])), min_size=1, max_size=3),
       st.lists(st.integers(0, 1 << 10), max_size=6))
def test_framing_headers_in_every_combination(msgs, points):
    """Transfer-Encoding / Content-Length (ambiguous, conflicting, invalid, 18 and 19 digits), Connection, Upgrade, CONNECT."""
    fed(b"".join(h + b for h, b in msgs), points, h1.MAX_HEAD)


@native
@MANY
@given(request_head(), st.sampled_from([h1.MAX_HEAD, 100]))
def test_each_head_fed_one_byte_at_a_time_and_whole(head, max_head):
    fed(head, list(range(len(head) + 1)), max_head)
    fed(head, [], max_head)


@native
@MANY
@given(st.lists(st.binary(max_size=40), min_size=1, max_size=6), st.lists(st.integers(0, 300), max_size=8))
def test_byte_soup_after_a_request_line(parts, points):
    fed(b"POST /x HTTP/1.1\r\n" + b"\r\n".join(parts) + b"\r\n\r\n", points, h1.MAX_HEAD)


@native
def test_a_response_head_goes_through_the_same_call():
    """Responses: the head found and parsed in C, the framing left to _begin (errors where they began)."""
    stream = (b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabcHTTP/1.1 200 OK\r\nContent-Length: 3, 4\r\n\r\n"
              b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
    rng = random.Random(15)
    for _ in range(300):
        both(cut(stream, [rng.randint(0, len(stream)) for _ in range(rng.randint(0, 5))]), False, [b"GET"] * 3)


@contextlib.contextmanager
def fixed_request_ids():
    saved = hdrs.new_request_id
    hdrs.new_request_id = lambda: "f" * 32
    try:
        yield
    finally:
        hdrs.new_request_id = saved


TRACE = st.dictionaries(st.sampled_from(["traceparent", "tracestate"]),
                        st.sampled_from(["00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "a=b,c=d", "", "r\xe9"]))


@native
@MANY
@given(request_head(), st.sampled_from([b"x-request-id", b"x-tenant", b"traceparent"]), TRACE,
       st.sampled_from([None, b"up.example:80", b""]), st.sampled_from([b"", b"/prefix", b"/"]))
def test_rewritten_head_bytes_are_the_definitions(raw, correlation, trace_headers, host_header, target_prefix):
    """Every head the reader accepts is rewritten to the same bytes, request id and created flag. (The reader hands
    on a head with its empty line, as far as h1's head end finds it; one without has not ended: nothing to rewrite.)"""
    raw = raw.lstrip(b"\r\n")
    end = h1._py_head_end(raw, 0)
    if end < 0:
        return
    try:
        head = h1._py_parse_head(raw[:end], True)
    except ValueError:
        return
    kw = dict(correlation_header=correlation, trace_headers=trace_headers, host_header=host_header, target_prefix=target_prefix)
    with fixed_request_ids():
        got = hdrs.rewrite_request_head(head, **kw)
        with reference():
            want = hdrs.rewrite_request_head(head, **kw)
    assert got == want


def test_rewrite_cases_named_in_the_issue():
    """Trace headers replaced wherever and however cased (their folded lines with them), the correlation header added only
    when absent, Host replaced only with --host-header, the prefix only before an origin-form target; nothing else moves."""
    raw = (b"POST http://h/x HTTP/1.1\r\nHost: a\r\nTraceParent: old\r\n  folded-old\r\nX-Tenant: a\r\nx-tenant: b\r\n"
           b"tracestate: s\r\nX-File: r\xe9sum\xe9.pdf\r\n\r\n")
    head = h1.parse_head(raw, True)
    for host in (None, b"up"):
        for prefix in (b"", b"/p"):
            kw = dict(correlation_header=b"x-request-id", trace_headers={"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"},
                      host_header=host, target_prefix=prefix)
            with fixed_request_ids():
                got, rid, created = hdrs.rewrite_request_head(head, **kw)
                with reference():
                    assert (got, rid, created) == hdrs.rewrite_request_head(head, **kw)
            assert created and rid == "f" * 32
            assert b"old" not in got and b"tracestate" not in got.lower()
            assert b"X-Tenant: a\r\nx-tenant: b\r\n" in got and b"X-File: r\xe9sum\xe9.pdf\r\n" in got
            assert got.startswith(b"POST http://h/x HTTP/1.1\r\n")  # (absolute-form: no prefix)
            assert (b"Host: a\r\n" in got) == (host is None)
            assert got.endswith(b"traceparent: 00-" + b"1" * 32 + b"-" + b"2" * 16 + b"-01\r\nx-request-id: " + b"f" * 32 + b"\r\n\r\n")
    head = h1.parse_head(b"GET /v1 HTTP/1.1\nX-Request-Id: mine\n\n", True)
    got, rid, created = hdrs.rewrite_request_head(head, correlation_header=b"x-request-id", trace_headers={"traceparent": "t"},
                                                  target_prefix=b"/p")
    assert (got, rid, created) == (b"GET /p/v1 HTTP/1.1\nX-Request-Id: mine\ntraceparent: t\n\n", "mine", False)


@native
def test_wrong_argument_types_are_type_errors_not_crashes():
    acc = h1._acc
    for args in [(b"", 0, "buf", True, 10), (b"", 0, b"", True), ("text", 0, b"", True, 10)]:
        with pytest.raises(TypeError):
            acc.feed_head(*args)
    with pytest.raises(ValueError):
        acc.feed_head(b"abc", 7, b"", True, 10)
    for args in [("raw", None, b"", []), (b"r", "h", b"", []), (b"r", None, b"", [(b"a",)]), (b"r", None, b"", [(b"a", "v")]),
                 (b"r", None, b"", ())]:
        with pytest.raises(TypeError):
            acc.rewrite_head(*args)
    with pytest.raises(TypeError):
        acc.set_head("not a class")


@native
def test_keep_alive_is_the_same_filled_in_or_computed():
    for raw in [b"GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n", b"GET / HTTP/1.1\r\nConnection: a, CLOSE\r\n\r\n",
                b"GET / HTTP/1.0\r\n\r\n", b"GET / HTTP/1.1\r\nConnection:\r\n\r\n"]:
        r = h1.Reader(True)
        fast = r.feed(raw)[0][3]
        assert fast._keep_alive is not None  # (filled in by the C call)
        assert fast.keep_alive == h1._py_parse_head(raw, True).keep_alive


# ---- the fingerprint's keyed state, made once -----------------------------------------------------------------------

@settings(max_examples=400, deadline=None)
@given(st.one_of(st.none(), st.just(""), st.text(max_size=20), st.binary(min_size=1, max_size=80)), st.lists(st.binary(max_size=300), max_size=5))
def test_fingerprints_from_the_copied_keyed_state_equal_a_fresh_hmac(key, chunks):
    want_mac = hmac.new(fpmod.resolve_key(key), digestmod=hashlib.sha256)
    for _ in range(2):  # (the second time from the cached keyed state)
        fp = fpmod.Fingerprinter(key)
        for c in chunks:
            fp.update(c)
        body = b"".join(chunks)
        want = hmac.new(fpmod.resolve_key(key), body, hashlib.sha256).hexdigest()[:32] if body else None
        assert fp.result() == want == fpmod.fingerprint(body, key)
    assert want_mac.hexdigest() == hmac.new(fpmod.resolve_key(key), digestmod=hashlib.sha256).hexdigest()  # (state untouched)


def test_the_environment_key_is_read_each_time(monkeypatch):
    monkeypatch.setenv(fpmod.ENV_KEY, "one")
    a = fpmod.fingerprint(b"body")
    monkeypatch.setenv(fpmod.ENV_KEY, "two")
    assert fpmod.fingerprint(b"body") == hmac.new(b"two", b"body", hashlib.sha256).hexdigest()[:32] != a
