"""The OTLP receivers under abuse (issue 19): bounded inflation, 400/413/415 with one line, RSS not pinned.

The body reader is tested sans-I/O with a small limit; the HTTP receiver over a real loopback socket; the
RSS bound against a real ``deltatap collect`` process (its own GC and malloc settings) fed 20 oversized bodies,
20 gzip bombs of 1 GiB, bodies that inflate to 60 MiB and are not protobuf, and gzip gRPC messages over the
limit (benchmarks/collector_abuse.py's :func:`measure`, which also writes the figures in docs/benchmarks.md).
"""

from __future__ import annotations

import gzip
import logging
import sys
import zlib
from pathlib import Path

import aiohttp
import pytest
from google.rpc import status_pb2
from otlpfactory import default_stack, request

from deltatap.collector import CollectorOptions, PipelineOptions, start_collector
from deltatap.collector.bodies import MAX_BODY, BodyReader, Refusal, parse_coding
from deltatap.collector.memory import trimmer

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.collector_abuse import gzip_bomb, measure  # noqa: E402

LIMIT = 1000
PROTOBUF = {"Content-Type": "application/x-protobuf"}


def read_all(coding: str, body: bytes, chunk: int = 7, limit: int = LIMIT) -> bytes | Refusal:
    r = BodyReader(coding, limit)
    for i in range(0, len(body), chunk):
        refusal = r.feed(body[i:i + chunk])
        if refusal is not None:
            return refusal
    return r.finish()


def one_line(refusal) -> Refusal:
    assert isinstance(refusal, Refusal), refusal
    assert "\n" not in refusal.message and len(refusal.message) < 200
    return refusal


# --------------------------------------------------------------------------------------------- sans-I/O


def test_identity_body_up_to_the_limit_and_not_one_byte_more():
    assert read_all("", b"x" * LIMIT) == b"x" * LIMIT
    r = one_line(read_all("", b"x" * (LIMIT + 1)))
    assert r.status == 413 and "limit" in r.message
    reader = BodyReader("", LIMIT)
    assert reader.check_declared(LIMIT) is None
    assert one_line(reader.check_declared(LIMIT + 1)).status == 413


@pytest.mark.parametrize("chunk", [1, 7, 4096])
def test_gzip_inflates_incrementally_and_is_refused_as_soon_as_it_inflates_past_the_limit(chunk):
    assert read_all("gzip", gzip.compress(b"a" * LIMIT), chunk) == b"a" * LIMIT
    r = one_line(read_all("gzip", gzip.compress(b"a" * (LIMIT + 1)), chunk))
    assert r.status == 413 and "inflates (gzip)" in r.message
    # a bomb is refused after the first chunk that crosses the limit, not after inflating all of it
    bomb = gzip_bomb(64)  # 64 MiB of zeros in ~300 KB
    reader = BodyReader("gzip", LIMIT)
    fed = 0
    for i in range(0, len(bomb), chunk):
        fed += 1
        if reader.feed(bomb[i:i + chunk]) is not None:
            break
    assert fed * chunk < 64 * 1024, f"refused only after {fed * chunk} bytes"
    assert one_line(reader.finish()).status == 413


def test_gzip_members_deflate_both_framings_and_empty_bodies():
    assert read_all("gzip", gzip.compress(b"one ") + gzip.compress(b"two")) == b"one two"
    assert read_all("deflate", zlib.compress(b"zlib framed")) == b"zlib framed"
    raw = zlib.compressobj(6, zlib.DEFLATED, -zlib.MAX_WBITS)
    assert read_all("deflate", raw.compress(b"raw deflate") + raw.flush()) == b"raw deflate"
    assert read_all("gzip", b"") == b"" and read_all("", b"") == b""


@pytest.mark.parametrize(("coding", "body", "words"), [
    ("gzip", b"this is not gzip at all", "is not valid gzip"),
    ("gzip", gzip.compress(b"z" * 500, mtime=0)[:20], "ends before"),
    ("gzip", gzip.compress(b"z", mtime=0) + b"trailing junk", "is not valid gzip"),
    ("deflate", zlib.compress(b"z") + b"more", "after the end of its compressed stream"),
    ("deflate", b"\x78\x9c\xff\xff\xff\xff", "is not valid deflate"),
])
def test_a_body_its_coding_does_not_describe_is_a_400(coding, body, words):
    r = one_line(read_all(coding, body))
    assert r.status == 400 and words in r.message


def test_content_codings():
    for header, coding in (("", ""), ("identity", ""), ("GZIP", "gzip"), ("x-gzip", "gzip"), ("gzip, identity", "gzip"), ("deflate", "deflate")):
        assert parse_coding(header) == coding, header
    for header in ("br", "zstd", "compress", "gzip, gzip", "gzip, deflate"):
        r = one_line(parse_coding(header))
        assert r.status == 415 and "gzip, deflate or no Content-Encoding" in r.message


# ---------------------------------------------------------------------------------------- over HTTP


@pytest.fixture
async def running(tmp_path):
    rc = await start_collector(CollectorOptions(otlp_grpc=None, otlp_http="127.0.0.1:0", out_dir=tmp_path / "out", rows_format="jsonl",
                                                pipeline=PipelineOptions(grace_s=0.05, join_hold_s=0.05)))
    yield rc
    await rc.close()


async def test_http_refusals_are_statuses_with_one_line_and_no_traceback(running, caplog):
    caplog.set_level(logging.INFO)
    url = running.otlp_http_url + "/v1/traces"
    good = request(default_stack(rid="ok")[0]).SerializeToString()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as s:
        cases = [
            (b"not gzip", {**PROTOBUF, "Content-Encoding": "gzip"}, 400, 3, "not valid gzip"),
            (gzip.compress(good)[:30], {**PROTOBUF, "Content-Encoding": "gzip"}, 400, 3, "ends before"),
            (good, {**PROTOBUF, "Content-Encoding": "br"}, 415, 3, "not supported"),
            (good, {**PROTOBUF, "Content-Encoding": "zstd"}, 415, 3, "not supported"),
            (gzip_bomb(80), {**PROTOBUF, "Content-Encoding": "gzip"}, 413, 8, "inflates (gzip)"),
        ]
        for body, headers, status, code, words in cases:
            async with s.post(url, data=body, headers=headers) as r:
                assert r.status == status, (headers, await r.read())
                st = status_pb2.Status.FromString(await r.read())
                assert st.code == code and words in st.message and "\n" not in st.message
                if status == 415:
                    assert r.headers["Accept-Encoding"] == "gzip, deflate, identity"
        # OTLP JSON gets its refusal in JSON
        async with s.post(url, data=b"{not gzip", headers={"Content-Type": "application/json", "Content-Encoding": "gzip"}) as r:
            assert r.status == 400 and "not valid gzip" in (await r.json())["message"]

        async def chunks():  # no Content-Length: read until the limit is crossed
            piece = bytes(1024 * 1024)
            for _ in range(MAX_BODY // len(piece) + 2):
                yield piece

        async with s.post(url, data=chunks(), headers=PROTOBUF) as r:
            assert r.status == 413 and "over the 64 MiB limit" in status_pb2.Status.FromString(await r.read()).message
        # and the receiver still takes valid exports, plain, gzip and deflate
        for body, enc in ((good, None), (gzip.compress(good), "gzip"), (zlib.compress(good), "deflate")):
            async with s.post(url, data=body, headers={**PROTOBUF, **({"Content-Encoding": enc} if enc else {})}) as r:
                assert r.status == 200, await r.read()
    assert running.stats()["spans_received"] == 3 * 4
    assert running.pipeline.decode_errors["http"] == 7
    assert not [rec for rec in caplog.records if rec.levelno >= logging.ERROR or rec.exc_info], [rec.getMessage() for rec in caplog.records]
    refused = [rec.getMessage() for rec in caplog.records if "refused (" in rec.getMessage()]
    assert len(refused) == 7 and all("\n" not in m for m in refused)


# ------------------------------------------------------------------------------ RSS of deltatap collect


@pytest.mark.skipif(trimmer() is None, reason="no glibc malloc_trim or no /proc here")
def test_the_trimmer_trims_only_after_rss_grew_by_its_step():
    t = trimmer(grow_bytes=32 * 1024 * 1024)
    assert not t.check() and t.trims == 0  # nothing grew
    held = bytearray(b"\x01" * (48 * 1024 * 1024))  # touched, so resident
    assert t.check() and t.trims == 1
    assert not t.check()  # the bar is now the grown RSS
    del held
    assert not t.check() and t.trims == 1  # shrank on its own: the bar follows it down
    held = bytearray(b"\x01" * (48 * 1024 * 1024))
    assert t.check() and t.trims == 2
    del held


@pytest.mark.timeout(200)
async def test_collector_rss_stays_bounded_under_oversized_bodies_and_decompression_bombs(tmp_path):
    r = await measure(oversized=20, bombs=20, bomb_mib=1024, invalid=4, grpc_bombs=6, timeout_s=180, workdir=tmp_path)
    assert r["statuses"] == ["bomb:413", "grpc-bomb:RESOURCE_EXHAUSTED", "invalid:400", "oversized-chunked:413", "oversized:413"], r["statuses"]
    assert r["valid_after"] == [200, 200, 200, 200, "OK"]
    assert r["tracebacks_in_log"] == 0
    print({k: v for k, v in r.items() if k != "events"})
    # before issue 19: 3 oversized bodies and 3 bombs took it from 115 to 1,488 MiB
    assert r["rss_growth_mib"] < 100, r
