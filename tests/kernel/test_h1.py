"""deltatap.net.h1: the sans-I/O HTTP/1.1 framing reader.

Two kinds of test, both network-free:

* playbooks (as mitmproxy tests its layers): a script of feeds and the exact events each one must give, one
  per framing rule of the module doc, most of them replayed split at every byte;
* a differential property test: generated request and response streams (pipelined, random methods, targets,
  header casing, duplicates and obs-text, Content-Length or chunked bodies with extensions and trailers, 1xx,
  HEAD/204/304, a close-delimited last response) fed to :class:`h1.Reader` split at random points and to
  h11 and httptools (llhttp); the messages, heads, bodies and byte offsets must agree.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import h11
import httptools
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from deltatap.net import h1
from deltatap.net.h1 import BODY, END, ERROR, HEAD

# ---------------------------------------------------------------------------------------------------------------
# playbook helpers


def show(events: list[tuple]) -> list[tuple]:
    """Events as comparable tuples: a HEAD's Head object becomes its raw bytes."""
    return [(e[0], e[1], e[2], e[3].raw) if e[0] == HEAD else e for e in events]


def play(reader: h1.Reader, *feeds: bytes, eof: bool = False) -> list[list[tuple]]:
    """Feed each chunk in turn; the events of each feed (and of ``feed_eof`` when ``eof``)."""
    out = [show(reader.feed(data)) for data in feeds]
    if eof:
        out.append(show(reader.feed_eof()))
    return out


def absolute(reader: h1.Reader, pieces: list[bytes], eof: bool = False) -> list[tuple]:
    """Feed ``pieces``; every event with offsets into their concatenation, adjacent BODY ranges merged, so
    that any split of the same bytes must give the same list."""
    out: list[tuple] = []
    base = 0
    for data in pieces:
        for e in reader.feed(data):
            if e[0] == HEAD:
                end = base + e[2]
                start = base + e[1] if e[1] >= 0 else end - len(e[3].raw)
                out.append((HEAD, start, end, e[3].raw))
            elif e[0] == BODY:
                assert 0 <= e[1] < e[2] <= len(data), e
                if out and out[-1][0] == BODY and out[-1][2] == base + e[1]:
                    out[-1] = (BODY, out[-1][1], base + e[2])
                else:
                    out.append((BODY, base + e[1], base + e[2]))
            elif e[0] == END:
                out.append((END, base + e[1]))
            else:
                out.append(e)
        base += len(data)
    if eof:
        out.extend((e[0], base + e[1], *e[2:]) for e in reader.feed_eof())
    return out


def splits(data: bytes):
    """The ways a test replays ``data``: whole, cut once at every offset, and one byte per feed."""
    yield [data]
    for i in range(1, len(data)):
        yield [data[:i], data[i:]]
    yield [data[i : i + 1] for i in range(len(data))]


def assert_split_invariant(data: bytes, expected: list[tuple], request: bool = True, methods: tuple[bytes, ...] = (), eof: bool = False) -> None:
    for pieces in splits(data):
        reader = h1.Reader(request)
        for m in methods:
            reader.expect(m)
        got = absolute(reader, pieces, eof=eof)
        assert got == expected, f"split {[len(p) for p in pieces][:8]}...: {got} != {expected}"


def req(*lines: str, body: bytes = b"", eol: str = "\r\n") -> bytes:
    return (eol.join(lines) + eol + eol).encode("latin-1") + body


# ---------------------------------------------------------------------------------------------------------------
# playbooks: Content-Length


def test_content_length_body_then_the_next_request():
    first = req("POST /v1/chat/completions HTTP/1.1", "Host: engine", "Content-Length: 5", body=b"hello")
    second = req("GET /health HTTP/1.1", "Host: engine")
    h = len(first) - 5
    reader = h1.Reader(request=True)
    assert play(reader, first + second) == [
        [(HEAD, 0, h, first[:h]), (BODY, h, h + 5), (END, h + 5), (HEAD, h + 5, len(first + second), second), (END, len(first + second))]
    ]
    assert reader.messages == 2 and reader.idle and reader.head.target == b"/health"
    assert_split_invariant(first + second, absolute(h1.Reader(True), [first + second]))


@pytest.mark.parametrize("lengths", [["5, 5"], ["5", "5"], ["5 ,5", "5"]])
def test_equal_duplicate_content_lengths_frame_the_body(lengths):
    data = req("POST / HTTP/1.1", "Host: a", *(f"Content-Length: {v}" for v in lengths), body=b"hello") + req("GET / HTTP/1.1", "Host: a")
    h = data.index(b"hello")
    events = absolute(h1.Reader(True), [data])
    assert events[:3] == [(HEAD, 0, h, data[:h]), (BODY, h, h + 5), (END, h + 5)]
    assert [e[0] for e in events[3:]] == [HEAD, END]


@pytest.mark.parametrize("request_side", [True, False])
@pytest.mark.parametrize("lengths", [["5, 6"], ["5", "6"], ["abc"], ["-1"], ["+5"], [""], ["1" * 19]])
def test_conflicting_or_invalid_content_length_is_an_error_and_nothing_more(request_side, lengths):
    """The reader cannot find the message's end: one ERROR where the head began (no HEAD event first, on
    either side), then it is opaque and says nothing about the rest of the connection."""
    ok = req("GET /a HTTP/1.1", "Host: a") if request_side else req("HTTP/1.1 204 No Content")
    start = "POST / HTTP/1.1" if request_side else "HTTP/1.1 200 OK"
    bad = req(start, "Host: a", *(f"Content-Length: {v}" for v in lengths), body=b"hello")
    reader = h1.Reader(request_side)
    events = reader.feed(ok + bad)
    assert [e[0] for e in events] == [HEAD, END, ERROR]
    assert events[2][1] == len(ok)
    assert "Content-Length" in events[2][2] and reader.error == events[2][2]
    assert reader.opaque and reader.messages == 1
    assert reader.feed(b"GET / HTTP/1.1\r\n\r\n") == [] and reader.feed_eof() == []


# ---------------------------------------------------------------------------------------------------------------
# playbooks: chunked


CHUNKED = (
    b"POST /v1/completions HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"5;name=value;flag\r\nhello\r\n"
    b'A;q="a b; c"\r\n0123456789\r\n'
    b"0;last=1\r\nX-Checksum: abc\r\nX-Other:  u \r\n\r\n"
)


def test_chunked_with_extensions_and_trailers_split_at_every_byte():
    nxt = req("GET /next HTTP/1.1", "Host: a")
    data = CHUNKED + nxt
    h = CHUNKED.index(b"\r\n\r\n") + 4
    a = CHUNKED.index(b"hello")
    b = CHUNKED.index(b"0123456789")
    expected = [
        (HEAD, 0, h, CHUNKED[:h]),
        (BODY, a, a + 5),
        (BODY, b, b + 10),
        (END, len(CHUNKED)),  # the trailer section belongs to the message
        (HEAD, len(CHUNKED), len(data), nxt),
        (END, len(data)),
    ]
    assert absolute(h1.Reader(True), [data]) == expected
    assert_split_invariant(data, expected)


def test_chunked_response_sizes_in_either_case_and_transfer_coding_list():
    body = b"1a\r\n" + b"x" * 26 + b"\r\n" + b"1A\r\n" + b"y" * 26 + b"\r\n" + b"000\r\n\r\n"
    head = req("HTTP/1.1 200 OK", "transfer-encoding: gzip, Chunked")
    data = head + body
    events = absolute(h1.Reader(False), [data])
    payload = b"".join(data[e[1] : e[2]] for e in events if e[0] == BODY)
    assert payload == b"x" * 26 + b"y" * 26
    assert events[-1] == (END, len(data))
    assert_split_invariant(data, events, request=False)


@pytest.mark.parametrize(
    "framing, reason",
    [
        (b"5\r\nhelloXX", "chunk data not followed by CRLF"),
        (b"zz\r\nhello\r\n", "invalid chunk size"),
        (b"\r\nhello\r\n", "invalid chunk size"),
        (b"1234567890123456\r\n", "invalid chunk size"),
    ],
)
def test_bad_chunk_framing_is_an_error(framing, reason):
    head = req("POST / HTTP/1.1", "Host: a", "Transfer-Encoding: chunked")
    reader = h1.Reader(True)
    events = reader.feed(head + framing)
    assert events[-1][0] == ERROR and events[-1][2] == reason
    assert reader.opaque and reader.messages == 0


def some_splits(data: bytes) -> list[list[bytes]]:
    """Whole, cut once at a few offsets, and in 1000-byte pieces (for data too long to cut everywhere)."""
    out = [[data]] + [[data[:i], data[i:]] for i in (1, 7, len(data) // 2, len(data) - 3, len(data) - 1)]
    return out + [[data[i : i + 1000] for i in range(0, len(data), 1000)]]


@pytest.mark.parametrize("over", [0, 1])
def test_the_chunk_line_and_trailer_limits_do_not_depend_on_how_the_bytes_were_read(over):
    head = req("POST / HTTP/1.1", "Host: a", "Transfer-Encoding: chunked")
    ext = b"5;x=" + b"e" * (h1.MAX_CHUNK_LINE - 5 + over) + b"\r"  # the line without its LF: MAX_CHUNK_LINE + over
    long_line = head + ext + b"\nhello\r\n0\r\n\r\n"
    lines = [b"X-T%05d: %s\r\n" % (i, b"v" * 80) for i in range(h1.MAX_CHUNK_LINE // 100)]
    section = b"".join(lines)
    pad = h1.MAX_CHUNK_LINE - len(section) - 2 + over  # the whole section, final empty line included
    section += b"X-Pad: " + b"p" * (pad - 9) + b"\r\n" + b"\r\n"
    assert len(section) == h1.MAX_CHUNK_LINE + over
    long_trailers = head + b"5\r\nhello\r\n0\r\n" + section
    for data, reason in ((long_line, "chunk-size line too long"), (long_trailers, "trailer section too long")):
        for pieces in some_splits(data):
            reader = h1.Reader(True)
            kinds = [e[0] for p in pieces for e in reader.feed(p)]
            if over:
                assert kinds[-1] == ERROR and reader.error == reason, [len(p) for p in pieces]
            else:
                assert kinds == [HEAD, BODY, END], [len(p) for p in pieces]


def test_the_trailer_limit_counts_one_message_at_a_time():
    """Two chunked messages on one connection, each with a 37 kB trailer section (the second with no data
    chunk before its last-chunk): neither is over the 64 kB limit, whatever came before."""
    head = req("POST / HTTP/1.1", "Host: a", "Transfer-Encoding: chunked")
    trailers = b"".join(b"X-T%05d: %s\r\n" % (i, b"v" * 80) for i in range(400)) + b"\r\n"
    assert len(trailers) * 2 > h1.MAX_CHUNK_LINE > len(trailers)
    data = head + b"5\r\nhello\r\n0\r\n" + trailers + head + b"0\r\n" + trailers
    for pieces in some_splits(data):
        reader = h1.Reader(True)
        kinds = [e[0] for p in pieces for e in reader.feed(p)]
        assert kinds == [HEAD, BODY, END, HEAD, END] and reader.messages == 2, (reader.error, [len(p) for p in pieces])


def test_a_request_whose_transfer_coding_does_not_end_in_chunked_is_an_error():
    reader = h1.Reader(True)
    events = reader.feed(req("POST / HTTP/1.1", "Host: a", "Transfer-Encoding: chunked, gzip", body=b"abc"))
    assert events == [(ERROR, 0, "request Transfer-Encoding does not end in chunked")]


def test_a_response_whose_transfer_coding_does_not_end_in_chunked_is_read_until_the_close():
    reader = h1.Reader(False)
    head = req("HTTP/1.1 200 OK", "Transfer-Encoding: gzip", "Content-Length: 3")
    assert play(reader, head + b"\x1f\x8b\x08", b"more", eof=True) == [
        [(HEAD, 0, len(head), head), (BODY, len(head), len(head) + 3)],
        [(BODY, 0, 4)],
        [(END, 0)],
    ]


# ---------------------------------------------------------------------------------------------------------------
# playbooks: line ends, leading empty lines, obs-fold, obs-text, names as sent


def test_bare_lf_line_ends_in_heads_and_chunk_framing():
    first = req("GET / HTTP/1.1", "Host: a", "Content-Length: 2", body=b"hi", eol="\n")
    second = b"POST / HTTP/1.1\nHost: a\nTransfer-Encoding: chunked\n\n2\nok\n3;x\r\nyes\n0\nT: 1\n\n"
    data = first + second
    events = absolute(h1.Reader(True), [data])
    h2 = len(first) + second.index(b"\n\n") + 2
    assert events == [
        (HEAD, 0, len(first) - 2, first[:-2]),
        (BODY, len(first) - 2, len(first)),
        (END, len(first)),
        (HEAD, len(first), h2, second[: h2 - len(first)]),
        (BODY, data.index(b"ok"), data.index(b"ok") + 2),
        (BODY, data.index(b"yes"), data.index(b"yes") + 3),
        (END, len(data)),
    ]
    assert_split_invariant(data, events)
    head = h1.parse_head(first[:-2], request=True)
    assert head.headers == [(b"Host", b"a"), (b"Content-Length", b"2")]


def test_leading_empty_lines_before_a_request_are_skipped():
    one = req("POST / HTTP/1.1", "Host: a", "Content-Length: 1", body=b"x")
    two = req("GET / HTTP/1.1", "Host: a")
    data = b"\r\n\n" + one + b"\r\n" + two  # an old client's CRLF after a POST body
    events = absolute(h1.Reader(True), [data])
    s2 = 3 + len(one) + 2
    assert events == [
        (HEAD, 3, 3 + len(one) - 1, one[:-1]),
        (BODY, 3 + len(one) - 1, 3 + len(one)),
        (END, 3 + len(one)),
        (HEAD, s2, s2 + len(two), two),
        (END, len(data)),
    ]
    assert_split_invariant(data, events)
    reader = h1.Reader(True)
    assert reader.feed(b"\r\n\r\n") == [] and reader.idle and reader.pending_from is None


def test_obs_fold_continuation_lines_join_the_value():
    raw = req("GET / HTTP/1.1", "Host: a", "X-Long: first", "   second  ", "\tthird", "X-Empty:", " late", "Accept: */*")
    (e_head, e_end) = h1.Reader(True).feed(raw)
    assert e_end == (END, len(raw))
    assert e_head[3].headers == [(b"Host", b"a"), (b"X-Long", b"first second third"), (b"X-Empty", b"late"), (b"Accept", b"*/*")]
    reader = h1.Reader(True)
    assert reader.feed(req("GET / HTTP/1.1", " folded: before any header")) == [(ERROR, 0, "continuation line before any header")]


def test_obs_text_in_values_is_kept_as_sent_both_ways():
    value = b'attachment; filename="r\xe9sum\xe9.pdf"; x=\xff\x80'
    request = b"POST /upload HTTP/1.1\r\nHost: a\r\nContent-Disposition: " + value + b"\r\nContent-Length: 0\r\n\r\n"
    response = b"HTTP/1.1 200 \xc3\xa9t\xc3\xa9\r\nX-Name:  \xe9t\xe9\t\r\nContent-Length: 0\r\n\r\n"
    (hq, _end) = h1.Reader(True).feed(request)
    assert hq[3].get(b"content-disposition") == value and hq[3].raw == request
    (hr, _end) = h1.Reader(False).feed(response)
    assert hr[3].reason == b"\xc3\xa9t\xc3\xa9" and hr[3].headers[0] == (b"X-Name", b"\xe9t\xe9")


def test_names_keep_their_case_order_and_duplicates():
    raw = req("GET / HTTP/1.1", "X-Tenant: a", "HOST: h", "x-tenant: b", "content-TYPE: text/plain", "X-TENANT:c", "Set-Cookie: 1", "Set-Cookie: 2")
    (e_head, _end) = h1.Reader(True).feed(raw)
    head = e_head[3]
    assert head.headers == [
        (b"X-Tenant", b"a"),
        (b"HOST", b"h"),
        (b"x-tenant", b"b"),
        (b"content-TYPE", b"text/plain"),
        (b"X-TENANT", b"c"),
        (b"Set-Cookie", b"1"),
        (b"Set-Cookie", b"2"),
    ]
    assert head.values(b"x-tenant") == [b"a", b"b", b"c"] and head.get(b"host") == b"h" and head.get(b"absent") is None


@pytest.mark.parametrize("method", [b"get", b"FOO", b"X_CUSTOM", b"M-SEARCH", b"PROPFIND"])
def test_any_token_is_a_method_and_targets_stay_as_sent(method):
    target = b"http://example.com:8080/a/b?x=1&empty=&#frag"
    raw = method + b" " + target + b" HTTP/1.1\r\nHost: example.com\r\n\r\n"
    (e_head, e_end) = h1.Reader(True).feed(raw)
    assert e_head[3].method == method and e_head[3].target == target and e_end == (END, len(raw))


# ---------------------------------------------------------------------------------------------------------------
# playbooks: pipelining, bodiless responses, interim responses


def test_pipelined_requests_in_one_feed():
    a = req("GET /a HTTP/1.1", "Host: h")
    b = req("POST /b HTTP/1.1", "Host: h", "Content-Length: 3", body=b"abc")
    c = req("POST /c HTTP/1.1", "Host: h", "Transfer-Encoding: chunked", body=b"1\r\nz\r\n0\r\n\r\n")
    d = req("DELETE /d HTTP/1.1", "Host: h", "Connection: close")
    data = a + b + c + d
    reader = h1.Reader(True)
    events = show(reader.feed(data))
    o_b, o_c, o_d = len(a), len(a + b), len(a + b + c)
    zc = o_c + c.index(b"z\r\n")
    assert events == [
        (HEAD, 0, len(a), a),
        (END, len(a)),
        (HEAD, o_b, o_c - 3, b[:-3]),
        (BODY, o_c - 3, o_c),
        (END, o_c),
        (HEAD, o_c, o_c + c.index(b"\r\n\r\n") + 4, c[: c.index(b"\r\n\r\n") + 4]),
        (BODY, zc, zc + 1),
        (END, o_d),
        (HEAD, o_d, len(data), d),
        (END, len(data)),
    ]
    assert reader.messages == 4 and reader.idle and not reader.head.keep_alive


@pytest.mark.parametrize(
    "method, status_line, framing",
    [
        (b"HEAD", "HTTP/1.1 200 OK", "Content-Length: 1234"),
        (b"HEAD", "HTTP/1.1 200 OK", "Transfer-Encoding: chunked"),
        (b"GET", "HTTP/1.1 204 No Content", "Content-Length: 10"),
        (b"GET", "HTTP/1.1 204 No Content", "Transfer-Encoding: chunked"),
        (b"GET", "HTTP/1.1 304 Not Modified", "Content-Length: 5120"),
        (b"POST", "HTTP/1.1 304 Not Modified", "Transfer-Encoding: chunked"),
    ],
)
def test_head_204_304_responses_have_no_body_whatever_they_say(method, status_line, framing):
    first = req(status_line, framing, "ETag: x")
    second = req("HTTP/1.1 200 OK", "Content-Length: 2", body=b"ok")
    data = first + second
    expected = [
        (HEAD, 0, len(first), first),
        (END, len(first)),
        (HEAD, len(first), len(data) - 2, second[:-2]),
        (BODY, len(data) - 2, len(data)),
        (END, len(data)),
    ]
    assert_split_invariant(data, expected, request=False, methods=(method, b"GET"))


def test_interim_100_and_103_then_the_final_head():
    c100 = req("HTTP/1.1 100 Continue")
    e103 = req("HTTP/1.1 103 Early Hints", "Link: </style.css>; rel=preload; as=style", "Link: </app.js>; rel=preload")
    final = req("HTTP/1.1 200 OK", "Content-Length: 2", body=b"ok")
    data = c100 + e103 + final
    o = len(c100 + e103)
    expected = [
        (HEAD, 0, len(c100), c100),
        (HEAD, len(c100), o, e103),
        (HEAD, o, len(data) - 2, final[:-2]),
        (BODY, len(data) - 2, len(data)),
        (END, len(data)),
    ]
    assert_split_invariant(data, expected, request=False, methods=(b"POST",))
    reader = h1.Reader(False)
    reader.expect(b"HEAD")
    events = reader.feed(data[:o])
    assert [e[3].status for e in events] == [100, 103] and reader.messages == 0 and reader.in_message is False
    assert events[1][3].values(b"link")[1] == b"</app.js>; rel=preload"
    # the method still applies to the final head after the interim ones: a HEAD response has no body
    assert show(reader.feed(final[:-2])) == [(HEAD, 0, len(final) - 2, final[:-2]), (END, len(final) - 2)]
    assert reader.head.status == 200 and reader.messages == 1


# ---------------------------------------------------------------------------------------------------------------
# playbooks: protocol switches


UPGRADE = req("GET /ws HTTP/1.1", "Host: a", "Upgrade: websocket", "Connection: keep-alive, Upgrade", "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==")
SWITCHED = req("HTTP/1.1 101 Switching Protocols", "Upgrade: websocket", "Connection: Upgrade")


def test_101_makes_both_ways_opaque_and_the_request_reader_returns_what_it_held():
    frame = b"\x81\x85\x37\xfa\x21\x3d\x7f\x9f\x4d\x51\x58"  # a masked client frame sent before the answer
    client = h1.Reader(True)
    assert play(client, UPGRADE + frame, b"GET / HTTP/1.1\r\n") == [
        [(HEAD, 0, len(UPGRADE), UPGRADE), (END, len(UPGRADE))],
        [],
    ]
    assert client.held and not client.opaque and client.pending_from == 0
    server = h1.Reader(False)
    server.expect(b"GET")
    assert play(server, SWITCHED + b"\x81\x02hi", b"\x88\x00") == [
        [(HEAD, 0, len(SWITCHED), SWITCHED), (END, len(SWITCHED)), (BODY, len(SWITCHED), len(SWITCHED) + 4)],
        [(BODY, 0, 2)],
    ]
    assert server.opaque and server.head.status == 101 and server.messages == 1
    held, events = client.switch(True)
    assert held == frame + b"GET / HTTP/1.1\r\n" and events == [(BODY, 0, len(held))]
    assert client.opaque and not client.held
    assert client.feed(b"\x88\x80") == [(BODY, 0, 2)] and client.feed_eof() == []


def test_held_bytes_offset_when_they_follow_the_request_in_the_same_feed():
    client = h1.Reader(True)
    events = client.feed(UPGRADE + b"abc")
    assert [e[0] for e in events] == [HEAD, END] and client.held and client.pending_from == len(UPGRADE)
    assert client.switch(True) == (b"abc", [(BODY, 0, 3)])


def test_a_refused_upgrade_reparses_the_held_bytes_as_the_next_request():
    nxt = req("POST /next HTTP/1.1", "Host: a", "Content-Length: 2", body=b"ok")
    client = h1.Reader(True)
    assert [e[0] for e in client.feed(UPGRADE + nxt[:10])] == [HEAD, END]
    assert client.feed(nxt[10:]) == [] and client.held
    server = h1.Reader(False)
    server.expect(b"GET")
    refused = req("HTTP/1.1 426 Upgrade Required", "Content-Length: 0")
    assert show(server.feed(refused)) == [(HEAD, 0, len(refused), refused), (END, len(refused))]
    held, events = client.switch(False)
    assert held == nxt
    assert show(events) == [(HEAD, 0, len(nxt) - 2, nxt[:-2]), (BODY, len(nxt) - 2, len(nxt)), (END, len(nxt))]
    assert not client.held and not client.opaque and client.idle and client.messages == 2
    assert [e[0] for e in client.feed(req("GET / HTTP/1.1", "Host: a"))] == [HEAD, END]


def test_connect_then_200_is_a_tunnel_and_407_is_not():
    connect = req("CONNECT api.example.com:443 HTTP/1.1", "Host: api.example.com:443")
    hello = b"\x16\x03\x01\x00\x05hello"
    client = h1.Reader(True)
    assert play(client, connect + hello) == [[(HEAD, 0, len(connect), connect), (END, len(connect))]]
    assert client.held and client.head.method == b"CONNECT"
    server = h1.Reader(False)
    server.expect(b"CONNECT")
    ok = req("HTTP/1.1 200 Connection Established")
    assert play(server, ok + b"\x16\x03\x03") == [[(HEAD, 0, len(ok), ok), (END, len(ok)), (BODY, len(ok), len(ok) + 3)]]
    assert server.opaque and not server.close_delimited
    assert client.switch(True) == (hello, [(BODY, 0, len(hello))]) and client.opaque

    client, server = h1.Reader(True), h1.Reader(False)
    client.feed(connect + b"GET")
    server.expect(b"CONNECT")
    denied = req("HTTP/1.1 407 Proxy Authentication Required", "Content-Length: 4", body=b"auth")
    assert [e[0] for e in server.feed(denied)] == [HEAD, BODY, END] and not server.opaque and server.idle
    assert client.switch(False) == (b"GET", []) and client.pending_from == 0 and client.in_message


# ---------------------------------------------------------------------------------------------------------------
# playbooks: the end of the connection


@pytest.mark.parametrize("status_line, extra", [("HTTP/1.1 200 OK", "Content-Type: text/event-stream"), ("HTTP/1.0 200 OK", "Server: old")])
def test_a_close_delimited_response_ends_at_feed_eof(status_line, extra):
    head = req(status_line, extra)
    reader = h1.Reader(False)
    assert play(reader, head + b"data: a\n\n", b"data: b\n\n", eof=True) == [
        [(HEAD, 0, len(head), head), (BODY, len(head), len(head) + 9)],
        [(BODY, 0, 9)],
        [(END, 0)],
    ]
    assert reader.messages == 1 and not reader.close_delimited


@pytest.mark.parametrize(
    "request_side, data",
    [
        (True, req("POST / HTTP/1.1", "Host: a", "Content-Length: 10", body=b"abc")),
        (True, req("POST / HTTP/1.1", "Host: a", "Transfer-Encoding: chunked", body=b"5\r\nab")),
        (True, req("POST / HTTP/1.1", "Host: a", "Transfer-Encoding: chunked", body=b"0\r\nX-T: 1\r\n")),
        (True, b"GET / HTTP/1.1\r\nHost: a\r\n"),
        (False, req("HTTP/1.1 200 OK", "Content-Length: 10", body=b"abc")),
        (False, req("HTTP/1.1 200 OK", "Transfer-Encoding: chunked", body=b"5\r\nhello\r")),
    ],
)
def test_eof_inside_a_message_is_an_error(request_side, data):
    reader = h1.Reader(request_side)
    reader.feed(data)
    assert reader.in_message
    assert reader.feed_eof() == [(ERROR, 0, "the connection closed before the message ended")]


def test_eof_between_messages_is_quiet():
    reader = h1.Reader(True)
    reader.feed(req("GET / HTTP/1.1", "Host: a") + b"\r\n")
    assert reader.feed_eof() == [] and reader.messages == 1


# ---------------------------------------------------------------------------------------------------------------
# playbooks: limits, pending heads, errors at the right offset


def test_a_head_over_max_head_is_an_error():
    big = req("GET / HTTP/1.1", "Host: a", "X-Big: " + "v" * 100)
    prior = req("GET /ok HTTP/1.1", "Host: a")
    reader = h1.Reader(True, max_head=64)
    assert play(reader, prior + big) == [[(HEAD, 0, len(prior), prior), (END, len(prior)), (ERROR, len(prior), "the head is larger than the reader's limit")]]
    # growing over the limit across feeds, without its end yet
    reader = h1.Reader(True, max_head=64)
    assert play(reader, big[:40], big[40:80]) == [[], [(ERROR, 0, "the head is larger than the reader's limit")]]
    # a head of exactly max_head bytes is fine
    exact = req("GET / HTTP/1.1", "X: " + "v" * (64 - len(req("GET / HTTP/1.1", "X: "))))
    assert len(exact) == 64
    assert [e[0] for e in h1.Reader(True, max_head=64).feed(exact)] == [HEAD, END]
    assert [e[0] for e in h1.Reader(True, max_head=63).feed(exact)] == [ERROR]


def test_pending_from_marks_a_head_split_across_feeds():
    a = req("GET /a HTTP/1.1", "Host: a")
    b = req("POST /b HTTP/1.1", "Host: a", "Content-Length: 1", body=b"x")
    reader = h1.Reader(True)
    assert play(reader, a + b[:9]) == [[(HEAD, 0, len(a), a), (END, len(a))]]
    assert reader.pending_from == len(a) and reader.in_message
    assert reader.feed(b[9:20]) == [] and reader.pending_from == 0
    hb = len(b) - 1
    assert play(reader, b[20:]) == [[(HEAD, -1, hb - 20, b[:-1]), (BODY, hb - 20, hb - 19), (END, hb - 19)]]
    assert reader.pending_from is None
    # leading empty lines are not part of the pending head
    reader = h1.Reader(True)
    assert reader.feed(b"\r\nGET /c HT") == [] and reader.pending_from == 2


@pytest.mark.parametrize(
    "bad, reason",
    [
        (b"GE T / HTTP/1.1\r\nHost: a\r\n\r\n", "request line is not METHOD SP TARGET SP VERSION"),
        (b"GET /  HTTP/1.1\r\nHost: a\r\n\r\n", "request line is not METHOD SP TARGET SP VERSION"),
        (b"GET / HTTP/1.1 x\r\nHost: a\r\n\r\n", "request line is not METHOD SP TARGET SP VERSION"),
        (b"GE(T / HTTP/1.1\r\nHost: a\r\n\r\n", "invalid method"),
        (b"G\xc9T / HTTP/1.1\r\nHost: a\r\n\r\n", "invalid method"),
        (b"GET /a\x7fb HTTP/1.1\r\nHost: a\r\n\r\n", "invalid request target"),
        (b"GET / HTTP/1.10\r\nHost: a\r\n\r\n", "invalid HTTP version"),
        (b"GET / HTTX/1.1\r\nHost: a\r\n\r\n", "invalid HTTP version"),
        (b"GET / HTTP/1.1\r\nHost : a\r\n\r\n", "invalid header name"),
        (b"GET / HTTP/1.1\r\nX(y): a\r\n\r\n", "invalid header name"),
        (b"GET / HTTP/1.1\r\nno colon here\r\n\r\n", "header line without a name and colon"),
        (b"GET / HTTP/1.1\r\n: empty name\r\n\r\n", "header line without a name and colon"),
        (b"GET / HTTP/1.1\r\nX: a\rb\r\n\r\n", "invalid byte in a header value"),
        (b"GET / HTTP/1.1\r\nX: a\0b\r\n\r\n", "invalid byte in a header value"),
    ],
)
def test_an_invalid_request_head_is_an_error_where_it_began(bad, reason):
    ok = req("POST /ok HTTP/1.1", "Host: a", "Content-Length: 2", body=b"ok")
    reader = h1.Reader(True)
    events = reader.feed(ok + bad)
    assert events[-1] == (ERROR, len(ok), reason) and [e[0] for e in events[:-1]] == [HEAD, BODY, END]
    assert reader.opaque and reader.error == reason and reader.pending_from is None
    assert reader.feed(ok) == []
    # begun in an earlier feed: the error is at 0 of the feed that completes the head
    reader = h1.Reader(True)
    reader.feed(ok + bad[:5])
    assert reader.feed(bad[5:]) == [(ERROR, 0, reason)]


@pytest.mark.parametrize(
    "bad, reason",
    [
        (b"HTTP/1.1 20 OK\r\n\r\n", "invalid status line"),
        (b"HTTP/1.1 2000 OK\r\n\r\n", "invalid status line"),
        (b"HTTP/1.1 abc OK\r\n\r\n", "invalid status line"),
        (b"HTTQ/1.1 200 OK\r\n\r\n", "invalid status line"),
        (b"HTTP/1.1 099 Low\r\n\r\n", "invalid status code"),
        (b"HTTP/1.1 200 OK\r\nbad header\r\n\r\n", "header line without a name and colon"),
    ],
)
def test_an_invalid_response_head_is_an_error(bad, reason):
    ok = req("HTTP/1.1 200 OK", "Content-Length: 0")
    reader = h1.Reader(False)
    assert reader.feed(ok + bad)[-1] == (ERROR, len(ok), reason) and reader.opaque


def test_keep_alive_follows_the_version_and_connection_tokens():
    def head(*lines):
        return h1.parse_head(req(*lines), request=True)

    assert head("GET / HTTP/1.1", "Host: a").keep_alive
    assert not head("GET / HTTP/1.1", "Connection: Keep-Alive, CLOSE").keep_alive
    assert not head("GET / HTTP/1.0", "Host: a").keep_alive
    assert head("GET / HTTP/1.0", "Connection: keep-alive").keep_alive


# ---------------------------------------------------------------------------------------------------------------
# differential property test against h11 and httptools (llhttp)

TCHAR = "!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
# names whose meaning changes the framing or the connection: generated only where the test means them
FRAMING_NAMES = {b"content-length", b"transfer-encoding", b"connection", b"upgrade", b"host", b"expect", b"keep-alive", b"proxy-connection", b"te", b"trailer"}
NAMES = [b"Accept", b"User-Agent", b"X-Tenant", b"Content-Type", b"ETag", b"Cache-Control", b"Authorization", b"X-Request-Id", b"Set-Cookie", b"Link"]
LLHTTP_METHODS = [b"GET", b"POST", b"PUT", b"DELETE", b"PATCH", b"OPTIONS", b"HEAD"]
CUSTOM_METHODS = [b"get", b"FOO", b"X_CUSTOM", b"Post", b"QUERY~1"]
VALUE_BYTES = bytes(range(0x21, 0x7F)) + bytes(range(0x80, 0x100))  # VCHAR and obs-text
TARGET_CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._~!$&'()*+,;=:@/%"
OWS = [b"", b" ", b"  ", b"\t", b" \t "]


@dataclass
class Msg:
    """One generated message and what every reader must make of it."""

    method: bytes = b""
    target: bytes = b""
    status: int = 0
    reason: bytes = b""
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)  # names as sent, values without OWS
    head: bytes = b""
    framing: bytes = b""  # everything after the head: chunk lines, payload, trailers
    payload: bytes = b""
    trailers: list[tuple[bytes, bytes]] = field(default_factory=list)
    interims: list[Msg] = field(default_factory=list)  # 1xx heads before this final one
    lead: bytes = b""  # empty lines before a request


@st.composite
def recased(draw, name: bytes) -> bytes:
    mode = draw(st.sampled_from(["as", "lower", "upper", "flip"]))
    if mode == "lower":
        return name.lower()
    if mode == "upper":
        return name.upper()
    if mode == "as":
        return name
    flips = draw(st.lists(st.booleans(), min_size=len(name), max_size=len(name)))
    return bytes(c ^ 0x20 if f and 0x41 <= (c | 0x20) - 0x20 <= 0x5A else c for c, f in zip(name, flips))


@st.composite
def header_value(draw, fold_eol: bytes | None = None) -> tuple[bytes, bytes]:
    """(value as sent with optional surrounding OWS, value as every reader must give it). With ``fold_eol``
    some values are folded over continuation lines (obs-fold), which every reader joins with one space."""
    words = draw(st.lists(st.binary(min_size=1, max_size=10).map(lambda b: bytes(VALUE_BYTES[x % len(VALUE_BYTES)] for x in b)), max_size=4))
    folded = fold_eol is not None and len(words) > 1 and draw(st.integers(0, 2)) == 0
    raw = value = b""
    for i, w in enumerate(words):
        if folded:
            raw += (fold_eol + draw(st.sampled_from([b" ", b"\t", b"   "])) if i else b"") + w
            value += (b" " if i else b"") + w
        else:
            raw += (draw(st.sampled_from([b" ", b"\t", b"  "])) if i else b"") + w
            value = raw
    return draw(st.sampled_from(OWS)) + raw + draw(st.sampled_from(OWS)), value


@st.composite
def field_lines(draw, required: list[tuple[bytes, bytes]], fold_eol: bytes | None = None) -> list[tuple[bytes, bytes, bytes]]:
    """(name, raw value, value): random names (some repeated in another case) with ``required`` ones placed
    at random positions."""
    lines: list[tuple[bytes, bytes, bytes]] = []
    for _ in range(draw(st.integers(0, 5))):
        if lines and draw(st.integers(0, 3)) == 0:  # a duplicate, perhaps cased differently
            name = draw(recased(draw(st.sampled_from(lines))[0]))
        else:
            names = st.one_of(st.sampled_from(NAMES), st.text(TCHAR, min_size=1, max_size=12).map(str.encode))
            name = draw(names.filter(lambda n: n.lower() not in FRAMING_NAMES))
            name = draw(recased(name))
        raw, value = draw(header_value(fold_eol))
        lines.append((name, raw, value))
    for name, value in required:
        lines.insert(draw(st.integers(0, len(lines))), (draw(recased(name)), draw(st.sampled_from(OWS)) + value, value))
    return lines


def build_head(start: bytes, lines: list[tuple[bytes, bytes, bytes]], eol: bytes = b"\r\n") -> tuple[bytes, list[tuple[bytes, bytes]]]:
    return start + eol + b"".join(n + b":" + raw + eol for n, raw, _ in lines) + eol, [(n, v) for n, _, v in lines]


@st.composite
def chunked_body(draw, payload: bytes) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    cuts = sorted(set(draw(st.lists(st.integers(1, max(1, len(payload) - 1)), max_size=5)))) if len(payload) > 1 else []
    bounds = [0, *cuts, len(payload)]
    ext = st.sampled_from([b"", b";ext", b";name=value", b';q="a quoted; value"', b";a=1;b;c=2"])
    out = b""
    for a, b in zip(bounds, bounds[1:]):
        if b > a:
            size = format(b - a, draw(st.sampled_from(["x", "X"]))).encode()
            out += b"0" * draw(st.integers(0, 2)) + size + draw(ext) + b"\r\n" + payload[a:b] + b"\r\n"
    out += b"0" + draw(ext) + b"\r\n"
    trailers = []
    for _ in range(draw(st.integers(0, 2))):
        name = draw(st.sampled_from([b"X-Checksum", b"Server-Timing", b"x-usage"]))
        raw, value = draw(header_value())
        out += name + b":" + raw + b"\r\n"
        trailers.append((name, value))
    return out + b"\r\n", trailers


@st.composite
def request_stream(draw) -> tuple[list[Msg], dict[str, bool]]:
    msgs: list[Msg] = []
    accepts = {"h11": True, "httptools": True}
    quirks = draw(st.booleans())  # half the streams may use what llhttp refuses: custom methods, bare LF, obs-fold
    for _ in range(draw(st.integers(1, 4))):
        m = Msg()
        m.method = draw(st.sampled_from(CUSTOM_METHODS) if quirks and draw(st.integers(0, 2)) == 0 else st.sampled_from(LLHTTP_METHODS))
        if m.method not in LLHTTP_METHODS:
            accepts["httptools"] = False  # llhttp knows a fixed list of methods
        path = b"/" + draw(st.text(TARGET_CHARS, max_size=30)).encode()
        m.target = draw(st.sampled_from([path, b"http://example.com:8080" + path]))
        body = draw(st.sampled_from(["none", "length", "length", "chunked", "chunked"]))
        m.payload = b"" if body == "none" else draw(st.binary(max_size=300))
        required = [(b"Host", b"example.com")]  # h11 insists on Host in HTTP/1.1
        if body == "length":
            required.append((b"Content-Length", str(len(m.payload)).encode()))
        elif body == "chunked":
            required.append((b"Transfer-Encoding", draw(recased(b"chunked"))))
            m.framing, m.trailers = draw(chunked_body(m.payload))
        if body != "chunked":
            m.framing = m.payload
        eol = b"\n" if quirks and draw(st.integers(0, 3)) == 0 else b"\r\n"  # bare LF line ends in the head
        fold = quirks and draw(st.integers(0, 2)) == 0
        if eol != b"\r\n" or fold:
            accepts["httptools"] = False  # llhttp (strict) refuses bare LF and obs-fold; h11 takes both
        lines = draw(field_lines(required, fold_eol=eol if fold else None))
        m.head, m.headers = build_head(m.method + b" " + m.target + b" HTTP/1.1", lines, eol)
        if msgs and draw(st.integers(0, 19)) == 0:
            m.lead = draw(st.sampled_from([b"\r\n", b"\n", b"\r\n\r\n"]))  # empty lines before a request line
            accepts["h11"] = False  # h11 refuses them
        msgs.append(m)
    return msgs, accepts


@st.composite
def response_stream(draw) -> tuple[list[bytes], list[Msg], dict[str, bool]]:
    methods = draw(st.lists(st.sampled_from([b"GET", b"POST", b"HEAD", b"PUT", b"DELETE"]), min_size=1, max_size=4))
    accepts = {"h11": True, "httptools": b"HEAD" not in methods}  # llhttp cannot be told a response is to HEAD
    msgs: list[Msg] = []
    reasons = st.sampled_from([b"OK", b"", None, b"Some Reason", b"r\xe9ponse"])
    for i, method in enumerate(methods):
        m = Msg()  # (a response head has no method: the reader is told it with expect)
        for status in draw(st.lists(st.sampled_from([100, 103]), max_size=2)):
            lines = draw(field_lines([])) if status == 103 else []
            head, headers = build_head(b"HTTP/1.1 %d Interim" % status, lines)
            m.interims.append(Msg(status=status, reason=b"Interim", head=head, headers=headers))
        m.status = draw(st.sampled_from([200, 200, 201, 204, 304, 404, 500]))
        reason = draw(reasons)
        m.reason = reason or b""
        start = b"HTTP/1.1 %d" % m.status + (b"" if reason is None else b" " + reason)
        bodyless = method == b"HEAD" or m.status in (204, 304)
        last = i == len(methods) - 1
        if bodyless:
            framing = draw(st.sampled_from(["none", "length"] + (["chunked"] if method == b"HEAD" else [])))
            m.payload = b""
            announced = draw(st.binary(min_size=1, max_size=300))  # what a GET would have got
        else:
            framing = draw(st.sampled_from(["length", "chunked"] + (["close"] if last else [])))
            m.payload = announced = draw(st.binary(max_size=400))
        required = []
        if framing == "length":
            required.append((b"Content-Length", str(len(announced)).encode()))
        elif framing == "chunked":
            required.append((b"Transfer-Encoding", draw(recased(b"chunked"))))
        if framing == "chunked" and not bodyless:
            m.framing, m.trailers = draw(chunked_body(m.payload))
        else:
            m.framing = m.payload
        m.head, m.headers = build_head(start, draw(field_lines(required)))
        m.lead = b"close" if framing == "close" else b""
        msgs.append(m)
    return methods, msgs, accepts


def wire(msgs: list[Msg], request: bool) -> bytes:
    return b"".join((m.lead if request else b"") + b"".join(i.head for i in m.interims) + m.head + m.framing for m in msgs)


@dataclass
class Seen:
    """What one reader made of one message."""

    method: bytes = b""
    target: bytes = b""
    status: int = 0
    reason: bytes = b""
    headers: list = field(default_factory=list)
    body: bytes = b""
    trailers: list | None = None  # h1 does not parse trailers (they are framing to a relay)
    interims: list = field(default_factory=list)  # (status, headers)
    complete: bool = True


def expected(msgs: list[Msg]) -> list[Seen]:
    return [
        Seen(m.method, m.target if m.target else b"", m.status, m.reason, m.headers, m.payload, m.trailers, [(i.status, i.headers) for i in m.interims])
        for m in msgs
    ]


def run_h1(stream: bytes, pieces: list[bytes], request: bool, methods: list[bytes], msgs: list[Msg]) -> list[Seen]:
    """Feed ``pieces`` to a Reader, check every offset against the generated layout, return what it saw."""
    reader = h1.Reader(request)
    for m in methods:
        reader.expect(m)
    heads: list[tuple[int, int, h1.Head]] = []
    bodies: list[tuple[int, int]] = []
    ends: list[int] = []
    base, pending = 0, None
    for data in pieces:
        for e in reader.feed(data):
            assert e[0] != ERROR, e
            if e[0] == HEAD:
                end = base + e[2]
                if e[1] >= 0:
                    assert pending is None, "a head that began in an earlier feed must say so (start -1)"
                    start = base + e[1]
                else:
                    start = end - len(e[3].raw)
                    assert pending == start, "the head began where pending_from said it did"
                pending = None
                assert stream[start:end] == e[3].raw
                heads.append((start, end, e[3]))
            elif e[0] == BODY:
                assert 0 <= e[1] < e[2] <= len(data)
                bodies.append((base + e[1], base + e[2]))
            else:
                ends.append(base + e[1])
        if reader.pending_from is not None:
            if pending is None:
                pending = base + reader.pending_from
            else:
                assert reader.pending_from == 0
        base += len(data)
    if reader.close_delimited:
        assert reader.feed_eof() == [(END, 0)]
        ends.append(len(stream))
    assert reader.idle and reader.messages == len(msgs) == len(ends)

    # the offsets reassemble the stream: each message is its lead, its heads as sent, then its framing and
    # payload up to its END; the BODY ranges inside it are exactly its payload
    out: list[Seen] = []
    pos = 0
    hi = 0
    for m, end in zip(msgs, ends):
        pos += len(m.lead) if request else 0
        seen = Seen()
        for generated in [*m.interims, m]:
            start, head_end, head = heads[hi]
            hi += 1
            assert (start, head.raw) == (pos, generated.head)
            pos = head_end
            if generated is not m:
                seen.interims.append((head.status, head.headers))
        assert stream[pos:end] == m.framing
        seen.body = b"".join(stream[a:b] for a, b in bodies if pos <= a < b <= end)
        assert sum(b - a for a, b in bodies if pos <= a < end) == len(seen.body)
        pos = end
        seen.method, seen.target, seen.status, seen.reason, seen.headers = head.method, head.target, head.status, head.reason, head.headers
        out.append(seen)
    assert pos == len(stream) and hi == len(heads) and sum(b - a for a, b in bodies) == sum(len(m.payload) for m in msgs)
    return out


def run_h11_requests(stream: bytes) -> list[Seen]:
    conn = h11.Connection(h11.SERVER)
    conn.receive_data(stream)
    out: list[Seen] = []
    while (ev := conn.next_event()) is not h11.NEED_DATA:
        if isinstance(ev, h11.Request):
            out.append(Seen(ev.method, ev.target, headers=list(ev.headers.raw_items())))
        elif isinstance(ev, h11.Data):
            out[-1].body += ev.data
        elif isinstance(ev, h11.EndOfMessage):
            out[-1].trailers = list(ev.headers.raw_items())
            conn.send(h11.Response(status_code=204, headers=[]))
            conn.send(h11.EndOfMessage())
            conn.start_next_cycle()
        else:
            raise AssertionError(ev)
    return out


def run_h11_responses(stream: bytes, methods: list[bytes]) -> list[Seen]:
    conn = h11.Connection(h11.CLIENT)
    conn.receive_data(stream)
    out: list[Seen] = []
    for i, method in enumerate(methods):
        if i:
            conn.start_next_cycle()
        conn.send(h11.Request(method=method, target=b"/", headers=[(b"Host", b"example.com")]))
        conn.send(h11.EndOfMessage())
        seen = Seen()
        while True:
            ev = conn.next_event()
            if ev is h11.NEED_DATA:
                assert i == len(methods) - 1, "h11 wants more data before the last response"
                conn.receive_data(b"")  # the close that ends a close-delimited body
            elif isinstance(ev, h11.InformationalResponse):
                seen.interims.append((ev.status_code, list(ev.headers.raw_items())))
            elif isinstance(ev, h11.Response):
                seen.status, seen.reason, seen.headers = ev.status_code, ev.reason, list(ev.headers.raw_items())
            elif isinstance(ev, h11.Data):
                seen.body += ev.data
            elif isinstance(ev, h11.EndOfMessage):
                seen.trailers = list(ev.headers.raw_items())
                break
            else:
                raise AssertionError(ev)
        out.append(seen)
    return out


class _HttptoolsSink:
    def __init__(self, request: bool) -> None:
        self.parser = (httptools.HttpRequestParser if request else httptools.HttpResponseParser)(self)
        self.request = request
        self.out: list[Seen] = []
        self.cur: Seen | None = None

    def on_message_begin(self) -> None:
        self.cur = Seen(trailers=[], complete=False)
        self.in_head = True

    def on_url(self, url: bytes) -> None:
        self.cur.target += url

    def on_status(self, reason: bytes) -> None:
        self.cur.reason += reason

    def on_header(self, name: bytes, value: bytes) -> None:
        # llhttp keeps a value's trailing whitespace; the field value itself excludes it (RFC 9110 5.5)
        (self.cur.headers if self.in_head else self.cur.trailers).append((name, value.rstrip(b" \t")))

    def on_headers_complete(self) -> None:
        self.in_head = False
        if self.request:
            self.cur.method = self.parser.get_method()
        else:
            self.cur.status = self.parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        self.cur.body += body

    def on_message_complete(self) -> None:
        self.cur.complete = True
        self.out.append(self.cur)
        self.cur = None


def run_httptools(stream: bytes, request: bool) -> list[Seen]:
    sink = _HttptoolsSink(request)
    sink.parser.feed_data(stream)
    seen = sink.out + ([sink.cur] if sink.cur is not None else [])  # a close-delimited body: llhttp has no EOF here
    if request:
        return seen
    out: list[Seen] = []
    interims: list = []
    for s in seen:  # llhttp gives each 1xx as a message of its own
        if 100 <= s.status < 200:
            interims.append((s.status, s.headers))
        else:
            s.interims, interims = interims, []
            out.append(s)
    return out


def for_h11(seen: list[Seen]) -> list[Seen]:
    """h11 lower-cases the value of Transfer-Encoding (names keep their case in ``raw_items``)."""

    def norm(headers):
        return [(n, v.lower() if n.lower() == b"transfer-encoding" else v) for n, v in headers]

    return [Seen(s.method, s.target, s.status, s.reason, norm(s.headers), s.body, s.trailers, [(st_, norm(h)) for st_, h in s.interims]) for s in seen]


def without_trailers(seen: list[Seen]) -> list[Seen]:
    return [Seen(s.method, s.target, s.status, s.reason, s.headers, s.body, None, s.interims) for s in seen]


def cut(stream: bytes, offsets: list[int]) -> list[bytes]:
    bounds = [0, *sorted(set(o for o in offsets if 0 < o < len(stream))), len(stream)]
    return [stream[a:b] for a, b in zip(bounds, bounds[1:])]


PROPERTY = settings(max_examples=200, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def check_all(data, stream: bytes, request: bool, methods: list[bytes], msgs: list[Msg], accepts: dict[str, bool]) -> None:
    want = expected(msgs)
    n = len(stream)
    splits_ = [[stream], [stream[i : i + 1] for i in range(n)]]
    for _ in range(3):
        splits_.append(cut(stream, data.draw(st.lists(st.integers(1, max(1, n - 1)), max_size=12))))
    for pieces in splits_:
        got = run_h1(stream, pieces, request, methods, msgs)
        assert got == without_trailers(want)  # names in the case sent, values without OWS, bodies, statuses
    if accepts["h11"]:
        event("h11 compared")
        ref = run_h11_requests(stream) if request else run_h11_responses(stream, methods)
        assert without_trailers(ref) == without_trailers(for_h11(got))
        assert [s.trailers for s in ref] == [s.trailers for s in for_h11(want)]
    if accepts["httptools"]:
        event("httptools compared")
        ref = run_httptools(stream, request)
        if not request and msgs[-1].lead == b"close":
            assert not ref[-1].complete  # llhttp has no EOF to end it on
            ref[-1].complete = True
        assert all(s.complete for s in ref)
        ref_cmp = [Seen(s.method, s.target, s.status, s.reason, s.headers, s.body, None, s.interims) for s in ref]
        if not request:  # httptools does not give a response's method; the reason is what h1 gave
            ref_cmp = [Seen(g.method, b"", s.status, s.reason, s.headers, s.body, None, s.interims) for g, s in zip(got, ref_cmp)]
        assert ref_cmp == got
        assert [s.trailers for s in ref] == [s.trailers for s in want]


@PROPERTY
@given(st.data(), request_stream())
def test_requests_agree_with_h11_and_httptools_however_split(data, generated):
    msgs, accepts = generated
    check_all(data, wire(msgs, request=True), True, [], msgs, accepts)


@PROPERTY
@given(st.data(), response_stream())
def test_responses_agree_with_h11_and_httptools_however_split(data, generated):
    methods, msgs, accepts = generated
    check_all(data, wire(msgs, request=False), False, methods, msgs, accepts)


def test_an_http2_preface_is_not_framed_as_http1():
    """h2c prior knowledge: ``PRI * HTTP/2.0`` is not an HTTP/1.x head (a relay that added headers to it would break
    the preface); the reader says so at its first byte and the relay passes the connection on unparsed."""
    r = h1.Reader(True)
    ev = r.feed(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x12\x04\x00")
    assert [e[:2] for e in ev] == [(ERROR, 0)] and r.opaque
    w = h1.Reader(False)
    assert w.feed(b"HTTP/2 200 OK\r\n\r\n")[0][0] == ERROR


def test_a_request_with_both_content_length_and_chunked_is_not_framed():
    """RFC 9112 6.3 lets chunked win, but a server that reads the length would find another boundary (request
    smuggling): such a connection is passed on unparsed and never pooled."""
    raw = b"POST / HTTP/1.1\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /x HTTP/1.1\r\n\r\n"
    r = h1.Reader(True)
    ev = r.feed(raw)
    assert [e[:2] for e in ev] == [(ERROR, 0)] and "both" in ev[0][2] and r.opaque
