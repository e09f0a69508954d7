"""``_h1.rewrite_spare`` (session 26 "cold": a relay's request head with the spare span's trace lines and request id, made
ahead, in one C call) against its Python definition, :func:`deltatap.proxy.headers.rewrite_spare` with the accelerator
unplugged, on generated heads as the C reader makes them and as the Python parser makes them: None for every head with
a ``traceparent`` (any case, any value, empty too), else the same bytes, request id and created flag; NotImplemented
(the definition runs) only where the head needs a new request id and none was made ahead, or an argument is not what
the relay passes."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deltatap.net import h1
from deltatap.proxy import headers as hdrs
from tests.kernel.test_h1_head_native import fixed_request_ids, request_head
from tests.kernel.test_h1_native import reference

native = pytest.mark.skipif(h1._acc is None, reason="deltatap.net._h1 is not built or DELTATAP_NATIVE turns it off")

TP = b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
LINES = st.sampled_from([[(b"traceparent", TP)], [], [(b"traceparent", TP), (b"tracestate", b"a=b,c=d")], [(b"traceparent", b"")]])


def _heads(raw: bytes) -> list[h1.Head]:
    """The head as the C reader hands it on (no name index) and as the Python parser makes it."""
    raw = raw.lstrip(b"\r\n")
    end = h1._py_head_end(raw, 0)
    if end < 0:
        return []
    out = [ev[3] for ev in h1.Reader(True).feed(raw[:end]) if ev[0] == h1.HEAD]
    try:
        out.append(h1._py_parse_head(raw[:end], True))
    except ValueError:
        pass
    return out


@native
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(request_head(), st.sampled_from([b"x-request-id", b"x-tenant", b"traceparent", b"tracestate"]), st.sampled_from([None, b"up:80", b""]),
       st.sampled_from([b"", b"/prefix"]), LINES, st.sampled_from(["f" * 32, None, "r\xe9"]))
def test_rewrite_spare_is_the_definition(raw, correlation, host_header, target_prefix, lines, request_id):
    for head in _heads(raw):
        args = (head, correlation, host_header, target_prefix, lines, request_id)
        with fixed_request_ids():
            got = hdrs.rewrite_spare(*args)
            with reference():
                want = hdrs.rewrite_spare(*args)
        assert got == want
        assert (want is None) == (head.get(b"traceparent") is not None)
        direct = h1._acc.rewrite_spare(*args)
        if want is not None and want[2] and request_id is None:
            assert direct is NotImplemented
        elif head._index is None:  # (a head the C reader made: one call does it all)
            assert direct == want
        if want is not None:  # (the bytes are rewrite_request_head's with the same trace lines and id)
            with fixed_request_ids():
                full = hdrs.rewrite_request_head(head, correlation_header=correlation, trace_headers={}, host_header=host_header,
                                                 target_prefix=target_prefix, lines=lines, request_id=request_id)
            assert full == want
            assert lines == [] or lines[0] == (b"traceparent", TP) or lines[0] == (b"traceparent", b"")  # (never changed)


@native
def test_rewrite_spare_cases():
    raw = b"POST /v1/x HTTP/1.1\r\nHost: h\r\nX-Request-Id: \r\nx-request-id: second\r\nX-A: r\xe9\r\n\r\n"
    head = h1.Reader(True).feed(raw)[0][3]
    lines = [(b"traceparent", TP)]
    got = h1._acc.rewrite_spare(head, b"x-request-id", None, b"", lines, "a" * 32)
    # (the first correlation header is empty: a new id is added, the empty one and the second stay as sent)
    assert got == (raw[:-2] + b"traceparent: " + TP + b"\r\nx-request-id: " + b"a" * 32 + b"\r\n\r\n", "a" * 32, True)
    for name in (b"traceparent", b"TraceParent", b"TRACEPARENT"):
        head = h1.Reader(True).feed(b"GET / HTTP/1.1\n" + name + b":\nX-Request-Id: mine\n\n")[0][3]
        assert h1._acc.rewrite_spare(head, b"x-request-id", None, b"", lines, "a" * 32) is None
    head = h1.Reader(True).feed(b"GET / HTTP/1.1\nX-Request-Id: m\xe9\n\n")[0][3]
    assert h1._acc.rewrite_spare(head, b"x-request-id", b"up", b"/p", [], None) == (
        b"GET /p/ HTTP/1.1\nX-Request-Id: m\xe9\nHost: up\n\n", "m\xe9", False)


@native
def test_rewrite_spare_wrong_arguments_are_not_crashes():
    acc = h1._acc
    head = h1.Reader(True).feed(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n")[0][3]
    good = [head, b"x-request-id", None, b"", [(b"traceparent", TP)], "a" * 32]
    with pytest.raises(TypeError):
        acc.rewrite_spare(*good[:5])
    for i, bad in [(0, "head"), (0, object()), (1, "x-request-id"), (2, "up"), (3, None), (4, [(b"a",)]), (4, [(b"a", "v")]),
                   (4, ((b"a", b"v"),)), (5, b"id")]:
        args = list(good)
        args[i] = bad
        assert acc.rewrite_spare(*args) is NotImplemented
    odd = h1.Head(b"GET / HTTP/1.1\r\n\r\n", b"GET", b"/", b"HTTP/1.1", 0, b"", [(b"a", "text")])
    assert acc.rewrite_spare(odd, *good[1:]) is NotImplemented
    odd.headers = ("not", "a list")
    assert acc.rewrite_spare(odd, *good[1:]) is NotImplemented
