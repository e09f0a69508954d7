"""A response head's framing in C (``_h1.feed_head`` given the request's method) against h1.py's Python ``_begin``.

Generated response heads — every status class (1xx, 101, 2xx, 204, 304, 4xx/5xx), answers to GET, POST, HEAD,
CONNECT and custom methods, every framing header alone and together (Transfer-Encoding chunked last or not,
Content-Length good, zero, conflicting, signed, too long, in lists), HTTP/1.0 and 1.1, keep-alive and close — each
followed by a body as its framing reads it, pipelined several to a stream and split at random points, go through a
response Reader with the accelerator and one running the Python definition: every event, Head field and piece of
reader state after each feed must be equal (tests/kernel/test_h1_native.py's ``both``).
"""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deltatap.net import h1
from tests.kernel.test_h1_native import both, cut

pytestmark = pytest.mark.skipif(h1._acc is None, reason="deltatap.net._h1 is not built or DELTATAP_NATIVE turns it off")

STATUSES = [100, 101, 103, 200, 201, 204, 206, 299, 304, 400, 404, 500, 503]
METHODS = [b"GET", b"POST", b"HEAD", b"CONNECT", b"PUT", b"get", b"X"]
FRAMING = [
    [], [b"Transfer-Encoding: chunked"], [b"Transfer-Encoding: gzip, chunked"], [b"Transfer-Encoding: chunked, gzip"],
    [b"Transfer-Encoding: gzip"], [b"transfer-encoding: Chunked"], [b"Transfer-Encoding: ,"], [b"Transfer-Encoding:"],
    [b"Content-Length: 5"], [b"Content-Length: 0"], [b"content-length: 05"], [b"Content-Length: 5, 5"],
    [b"Content-Length: 5", b"Content-Length: 5"], [b"Content-Length: 5, 6"], [b"Content-Length: -1"], [b"Content-Length: +5"],
    [b"Content-Length: " + b"1" * 19], [b"Content-Length: "], [b"Content-Length: 5", b"Transfer-Encoding: chunked"],
    [b"Transfer-Encoding: chunked", b"Content-Length: x"], [b"Content-Length: \x0b5\x0c"],
]
EXTRA = [b"Connection: close", b"Connection: keep-alive", b"Content-Type: text/event-stream", b"X-A: b"]


def body_for(framing: list[bytes], rng: random.Random) -> bytes:
    text = b" ".join(framing).lower()
    if b"chunked" in text:
        return b"5\r\nhello\r\n0\r\n\r\n"
    if b"content-length: 5" in text:
        return b"hello"
    return rng.choice([b"", b"abc"])


def response_stream(rng: random.Random) -> tuple[list[bytes], bytes]:
    methods, out = [], b""
    for _ in range(rng.randint(1, 3)):
        status = rng.choice(STATUSES)
        framing = rng.choice(FRAMING)
        lines = [rng.choice([b"HTTP/1.1", b"HTTP/1.0"]) + b" %d X" % status, *framing,
                 *rng.sample(EXTRA, rng.randint(0, 2))]
        rng.shuffle(lines[1:])
        out += b"\r\n".join(lines) + b"\r\n\r\n" + body_for(framing, rng)
        methods.append(rng.choice(METHODS))
    return methods, out


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**32), st.lists(st.integers(0, 1 << 10), max_size=6))
def test_generated_response_heads_are_framed_as_the_definition_frames_them(seed, points):
    rng = random.Random(seed)
    methods, stream = response_stream(rng)
    both(cut(stream, points), False, methods)


def test_the_usual_final_responses_named():
    """Each framing the C decides, whole and fed byte by byte; and a response with no request expected (GET)."""
    for head in (b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc", b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
                 b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
                 b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\nabc", b"HTTP/1.0 200 OK\r\n\r\nabc",
                 b"HTTP/1.1 200 OK\r\nContent-Length: 3, 4\r\n\r\nabc", b"HTTP/1.1 204 No\r\n\r\n",
                 b"HTTP/1.1 100 C\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\na"):
        for methods in ([b"GET"], [b"HEAD"], [b"CONNECT"], []):
            both([head], False, methods)
            both([head[i:i + 1] for i in range(len(head))], False, methods)


def test_feed_head_refuses_a_method_that_is_not_bytes():
    with pytest.raises(TypeError):
        h1._acc.feed_head(b"HTTP/1.1 200 OK\r\n\r\n", 0, b"", False, 1000, "GET")
    r = h1._acc.feed_head(b"HTTP/1.1 200 OK\r\n\r\n", 0, b"", False, 1000, None)  # (None: framing left to _begin)
    assert r[0] == 1 and r[5] == -1
