"""One packet log for all of a tap's workers (deltatap.net.pktstamp.shared_packet_log): a ring opened before the fork
and read by every process, its head in shared memory, frames handed back by one claim each (C: a compare-and-swap on
the head word; the Python reference: under the log's lock), a filter attached once on the tap's ends.

Real loopback connections (two forked processes on one shared log) where a packet socket can be opened (CAP_NET_RAW),
generated rings for the hand-back (C against the reference, and the race of a stale head made deterministic)."""

from __future__ import annotations

import importlib
import json
import os
import random
import select
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from deltatap.net import kstamp, pktstamp
from deltatap.net.pktstamp import _FRAME, PacketLog
from tests.kernel.test_pktring import _ring

try:
    acc = importlib.import_module("deltatap.net._pktring")
except ImportError:
    acc = None

pytestmark = pytest.mark.timeout(60)
_LO = socket.inet_aton("127.0.0.1")
_U32 = struct.Struct("=I")
needs_raw = pytest.mark.skipif(pktstamp.packet_log() is None, reason="per-packet stamps need CAP_NET_RAW (a packet socket)")
_IMPLS = [pytest.param(True, id="c", marks=pytest.mark.skipif(acc is None, reason="_pktring not built")), pytest.param(False, id="python")]


def _fill(ring: bytearray, frames: range, frame_count: int, stamp: int) -> None:
    """The kernel's part: frames ``frames`` (numbers, not slots) filled with a packet stamped ``stamp + frame``."""
    for f in frames:
        at = (f % frame_count) * _FRAME
        assert _U32.unpack_from(ring, at)[0] == 0, f"the kernel fills only frames handed back (frame {f})"
        struct.pack_into("=IIIHHII", ring, at, 1, 60, 60, 66, 66, (stamp + f) // 10**9, (stamp + f) % 10**9)


def _status(ring: bytearray, frame_count: int) -> list[int]:
    return [_U32.unpack_from(ring, i * _FRAME)[0] for i in range(frame_count)]


@pytest.mark.parametrize("c_impl", _IMPLS)
def test_a_stale_head_never_zeroes_a_frame_the_kernel_filled_again(c_impl: bool) -> None:
    """Two processes' logs on one ring and head: B hands frames back, the kernel fills some of them again, then A hands
    back with the end it computed before B did (its view stale). A's claim finds the head past its end: nothing zeroed.
    The per-process head of before (A's own word, still at 0) would have zeroed the refilled frames: shown first."""
    frames = 64
    for shared in (False, True):
        ring = bytearray(frames * _FRAME)
        _fill(ring, range(0, frames), frames, 10**18)
        b = PacketLog.over(ring, acc if c_impl else None)
        a = PacketLog.over(ring, acc if c_impl else None, share=b if shared else None)
        stale_newest = a._newest()
        assert stale_newest == frames
        b.maintain(force=True)  # hands back [0, 32)
        assert b._head == frames // 2 and _status(ring, frames)[: frames // 2] == [0] * (frames // 2)
        _fill(ring, range(frames, frames + 10), frames, 2 * 10**18)  # the kernel fills slots 0..9 again
        before = bytes(ring)
        a._newest_from = lambda head, top, n=stale_newest: n  # type: ignore[method-assign]  # (its view of the ring: stale)
        a.maintain(force=True)
        refilled = _status(ring, frames)[:10]
        if not shared:  # the protocol of before: the refilled frames lost
            assert refilled == [0] * 10
            continue
        assert bytes(ring) == before and refilled == [1] * 10
        assert a._head == b._head == frames // 2


@pytest.mark.parametrize("seed", range(6))
def test_c_and_python_hand_back_leave_the_same_ring_and_head(seed: int) -> None:
    """The C hand-back (compare-and-swap) and the reference's (under the lock) from two logs sharing a head, turns
    interleaved with the kernel filling frames, over generated rings: the same ring and head after every turn."""
    if acc is None:
        pytest.skip("_pktring not built")
    rng = random.Random(seed)
    ring, head, _keys, _segs = _ring(seed, 64, False)
    rings = [ring, bytearray(ring)]
    logs = []
    for r, impl in zip(rings, (None, acc)):
        first = PacketLog.over(r, impl)
        first._head = head
        logs.append((first, PacketLog.over(r, impl, share=first)))
    newest = logs[0][0]._newest()
    assert logs[1][0]._newest() == newest
    for turn in range(20):
        who = rng.randrange(2)
        grow = rng.randrange(0, 40)
        free = head_now = logs[0][0]._head
        room = head_now + 64 - newest  # frames the kernel may fill: those handed back
        grow = min(grow, room)
        for r in rings:
            _fill(r, range(newest, newest + grow), 64, 10**15 + turn)
        newest += grow
        for pair in logs:
            pair[who].maintain(force=True)
        assert logs[0][0]._head == logs[1][0]._head >= free
        assert rings[0] == rings[1], f"turn {turn}"
        assert logs[0][0]._newest() == newest


# how far back a worker's searches look: the frames a hand-back leaves (pktstamp._KEEP_FRAMES). Between its first write
# and its third (~4 ms) the other worker's churn may put a few thousand frames in the shared ring: with 2048 the first
# segment was out of reach in ~1 of 10 runs on a loaded host (the starting tree's as well), and the test failed.
_REACH = pktstamp._KEEP_FRAMES


def _worker(log: PacketLog, listen: socket.socket, churn: int, out: int) -> None:
    """A forked worker's connection on the shared log: churn (enough segments that the ring's older half is handed
    back, by both processes, while the other searches), then three writes read at once on each side, split from the
    log at the right segments."""
    doc: dict = {}
    try:
        c = socket.create_connection(listen.getsockname(), timeout=5)
        s, _ = listen.accept()
        for x in (c, s):
            x.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        cport, lport = c.getsockname()[1], listen.getsockname()[1]
        for i in range(churn):
            c.sendall(b"x" * 8)
            if i % 64 == 63:
                _drain(s, 64 * 8)
                log.maintain(force=True)
        _drain(s, (churn % 64) * 8)
        placed = []
        for tx, rx, key in ((c, s, (_LO, cport, _LO, lport)), (s, c, (_LO, lport, _LO, cport))):
            tx.sendall(b"A" * 10)
            _wait_waiting(rx, 10)
            first = None
            for _ in range(200):  # (the arrival's frame is written in the sender's send; seen at once)
                first = log.newest_segment(key, limit=_REACH)
                if first is not None and (first[1] - first[0]) & 0xFFFFFFFF == 10:
                    break
            time.sleep(0.002)
            tx.sendall(b"B" * 10)
            time.sleep(0.002)
            tx.sendall(b"C" * 10)
            _wait_waiting(rx, 30)
            log.maintain(force=True)
            cuts, tail, why = log.cuts(key, first[0], 30, 0, _REACH, 1 << 18)
            segs = log.segments_since(key, first[0], _REACH)
            placed.append({"cuts": cuts, "tail": tail, "why": why, "segs": segs, "first": first})
            _drain(rx, 30)
        doc = {"placed": placed, "head": log._head}
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        doc = {"error": repr(exc)}
    os.write(out, json.dumps(doc).encode())


def _drain(s: socket.socket, n: int) -> None:
    while n > 0:
        n -= len(s.recv(n))


def _wait_waiting(s: socket.socket, n: int) -> None:
    import fcntl
    import termios

    deadline = time.monotonic() + 5
    while struct.unpack("i", fcntl.ioctl(s.fileno(), termios.FIONREAD, b"\0\0\0\0"))[0] < n:
        assert time.monotonic() < deadline, "bytes did not arrive"
        select.select([s], [], [], 0.01)


@needs_raw
@pytest.mark.parametrize("c_impl", _IMPLS)
def test_two_forked_processes_on_one_log_each_split_their_own_merged_reads(c_impl: bool) -> None:
    """The log opened once, as a tap's parent opens it, its filter on both listen ports (local ends) and both listen
    addresses (remote ends: the connecting side's segments, as a tap's upstream side); two forked processes each make a
    connection, churn past half the ring (both hand frames back meanwhile), then find their own three writes at the
    right packets in both directions."""
    listens = [socket.create_server(("127.0.0.1", 0)) for _ in range(2)]
    ports = tuple(sorted(x.getsockname()[1] for x in listens))
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_DGRAM, socket.htons(pktstamp.ETH_P_ALL))
    log = PacketLog(sock, True)
    log.keep_ends(list(ports), [(_LO, p) for p in ports])
    if not c_impl:
        log._acc = None
    pids, reads = [], []
    try:
        for listen in listens:
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:  # pragma: no cover - the child
                os.close(r)
                code = 0
                try:
                    _worker(log, listen, 4500, w)
                finally:
                    os._exit(code)
            os.close(w)
            pids.append(pid)
            reads.append(r)
        docs = []
        for r in reads:
            chunks = []
            while chunk := os.read(r, 1 << 16):
                chunks.append(chunk)
            os.close(r)
            docs.append(json.loads(b"".join(chunks)))
    finally:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL) if os.waitpid(pid, os.WNOHANG) == (0, 0) else None
            except ChildProcessError:
                pass
        for pid in pids:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
        for x in listens:
            x.close()
    for doc in docs:
        assert "error" not in doc, doc
        for p in doc["placed"]:
            assert p["why"] is None, p
            (e1, t1), (e2, t2), (e3, t3) = p["cuts"]
            assert (e1, e2, e3) == (10, 20, 30) and not p["tail"]
            assert abs(t1 - p["first"][2]) < 1_000_000 and t1 < t2 < t3 and t3 - t1 >= 3_000_000, p
            # each segment logged: the arrival (and, on loopback, the departure copy of the same packet)
            assert sorted({(s[0], s[1]) for s in p["segs"]}) == sorted({(p["first"][0] + 10 * i, p["first"][0] + 10 * (i + 1)) for i in range(3)})
    assert log._head > 0  # frames were handed back (by whichever process claimed them)
    newest = log._newest()
    st = [_U32.unpack_from(log._mv, (f % log._frames) * _FRAME)[0] & 1 for f in range(log._head, newest)]
    assert all(st), "every frame between the shared head and the newest is still the user's"
    del log


def _packet_inodes() -> set[str]:
    lines = Path("/proc/net/packet").read_text().splitlines()[1:]
    return {ln.split()[-1] for ln in lines if ln.split()}


def _fd_inodes(pid: int) -> set[str]:
    out = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            out.add(link[8:-1])
    return out


def _children(pid: int) -> list[int]:
    kids = []
    for task in os.listdir(f"/proc/{pid}/task"):
        kids += [int(x) for x in Path(f"/proc/{pid}/task/{task}/children").read_text().split()]
    return kids


@needs_raw
@pytest.mark.skipif(not kstamp.enabled(), reason="without kernel stamps the tap opens no packet socket (DELTATAP_KERNEL_STAMPS=0)")
async def test_a_two_worker_tap_has_one_packet_socket_and_stamps_from_it(tmp_path) -> None:
    """``deltatap tap --workers 2``: one packet socket across the parent and both workers (the parent's, inherited),
    and the spans still say ``deltatap.stamp.source=packet``, with every point of a stream."""
    import asyncio

    import aiohttp

    from tests.conftest import free_port
    from tests.proxy.tap_helpers import start_upstream

    upstream = await start_upstream()
    port = free_port()
    spans = tmp_path / "spans.jsonl"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "deltatap.app.cli", "tap", "--link", "edge", "--listen", f"127.0.0.1:{port}", "--admin", "127.0.0.1:0",
        "--upstream", upstream.url, "--otlp", f"file:{spans}", "--workers", "2", "--grace-s", "2",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    try:
        line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
        assert "2 workers" in line, line
        async with aiohttp.ClientSession() as s:
            for _ in range(4):
                async with s.post(f"http://127.0.0.1:{port}/v1/chat/completions?first_ms=1&gap_ms=2&n=4", json={"model": "m"}) as r:
                    body = await r.read()
                    assert body.endswith(b"data: [DONE]\n\n")
        packets = _packet_inodes()
        procs = [proc.pid, *_children(proc.pid)]
        assert len(procs) == 3
        held = [_fd_inodes(p) & packets for p in procs]
        assert all(len(h) == 1 for h in held) and len(set.union(*held)) == 1, held
    finally:
        proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.wait(), 30)
        await upstream.runner.cleanup()
    docs = [json.loads(x) for x in spans.read_text().splitlines() if x.strip()]
    got = []
    for doc in docs:
        for rs in doc["resourceSpans"]:
            attrs = {a["key"]: a["value"].get("stringValue") for a in rs["resource"]["attributes"]}
            for ss in rs["scopeSpans"]:
                for sp in ss["spans"]:
                    got.append((attrs.get("deltatap.stamp.source"), {e["name"] for e in sp["events"]}))
    assert len(got) == 4
    assert all(src == "packet" and "first_token.received" in names for src, names in got), got


def test_kept_ends_attach_no_filter_per_connection_and_other_ends_are_watched_by_port() -> None:
    """``keep_ends``: a connection to a kept end (a local listen port, or the upstream's address and port) is not
    listed; one to another end is, as before; past ``_MAX_ENDS`` of a kind the rest are watched by port; the filter
    built with the ends keeps them (its program grows by their tests) and still drops everything without them."""
    log = PacketLog.over(bytearray(4 * _FRAME))
    up = (socket.inet_aton("127.0.0.2"), 8000)
    log.keep_ends([8080], [up])
    log.watch(8080, (_LO, 50000))  # a client's connection
    log.watch(41000, up)  # an upstream connection
    assert log._ports == {}
    log.watch(42000, (_LO, 9000))  # to an end not kept
    assert log._ports == {42000: 1}
    log.unwatch(41000, up)
    log.unwatch(8080, (_LO, 50000))
    log.unwatch(42000, (_LO, 9000))
    assert log._ports == {}
    log.keep_ends(list(range(1, 20)), [(_LO, p) for p in range(1, 20)])  # (too many: not taken)
    assert log._static == ((8080,), (up,))
    plain, kept = pktstamp._filter([42000]), pktstamp._filter([42000], None, log._static)
    assert len(kept) == len(plain) + 2 * (2 + 4) * 8  # each side: a port load and test, 4 instructions per remote end
    assert pktstamp._filter([], None, ((), ())) == pktstamp._filter([])  # (no ends, no ports: drop all)


@pytest.mark.parametrize("c_impl", _IMPLS)
def test_a_frame_handed_back_under_a_search_is_not_there(c_impl: bool) -> None:
    """Three segments of a connection logged; another process of a shared log hands the middle one's frame back (its
    status word zeroed) after this one found the newest frame: the search does not take it for a segment, nor a frame
    the kernel filled again with another connection's packet; the read's bytes then cannot be placed (a gap), rather
    than placed at a wrong packet."""
    from tests.kernel.test_pktring import _frame

    frames = 8
    key = (_LO, 40000, _LO, 8080)
    rng = random.Random(3)
    base = 1000
    for what in ("zeroed", "refilled"):
        ring = bytearray(frames * _FRAME)
        for i in range(3):
            _frame(ring, i * _FRAME, rng, key, base + 10 * i, 10, (5 + i) * 10**9, False)
        log = PacketLog.over(ring, acc if c_impl else None)
        assert log.segments_since(key, base) == [(base + 10 * i, base + 10 * (i + 1), (5 + i) * 10**9) for i in range(3)]
        if what == "zeroed":
            struct.pack_into("=I", ring, _FRAME, 0)
        else:  # (handed back, then the kernel's next packet in the slot: another connection's)
            _frame(ring, _FRAME, rng, (_LO, 40001, _LO, 8080), base + 10, 10, 9 * 10**9, False)
        log._newest_from = lambda head, top: 3  # type: ignore[method-assign]  # (found before the hand-back)
        if c_impl:  # (the C search finds the newest itself: the head stays where it was, frame 1 is not handed back)
            log._head = 0
        segs = log.segments_since(key, base)
        assert segs == [(base, base + 10, 5 * 10**9), (base + 20, base + 30, 7 * 10**9)], (what, segs)
        cuts, _tail, why = log.cuts(key, base, 30, 0, 16, 1 << 18)
        assert cuts is None and "start 10 bytes in" in why


def _claimed_not_zeroed(c_impl: bool, fixed: bool):
    """A ring of 16 frames, frames 0..14 filled (15 the kernel's): a connection's waiting bytes in three segments, the
    first (the one holding the first waiting byte, 10 bytes from ``base``) in frame 1, the others in frames 8 and 12,
    other connections' packets around them. A hand-back of another process of the shared log has claimed [0, 2) (the
    head at 2) and not zeroed those frames yet: slots 0 and 1 still hold their packets, marked the user's, physically
    frames 16 and 17 of the window [2, 18). ``fixed``: the released word at 0, as the claim leaves it; else the
    released word moved with the head (the starting protocol's window, [head, head + frames), read the same way)."""
    from tests.kernel.test_pktring import _frame

    frames, base = 16, 1000
    key, other = (_LO, 40000, _LO, 8080), (_LO, 40001, _LO, 8080)
    rng = random.Random(7)
    ring = bytearray(frames * _FRAME)
    mine = {1: (base, 5), 8: (base + 10, 8), 12: (base + 20, 12)}  # frame -> (seq, stamp in s)
    for f in range(15):
        seq, sec = mine.get(f, (50_000 + 10 * f, 0))
        _frame(ring, f * _FRAME, rng, key if f in mine else other, seq, 10, (sec or f) * 10**9, False)
    first = PacketLog.over(ring, acc if c_impl else None)
    log = PacketLog.over(ring, acc if c_impl else None, share=first)
    assert log._newest() == 15 and log.segments_since(key, base) == [(base + 10 * i, base + 10 * (i + 1), s * 10**9) for i, s in enumerate((5, 8, 12))]
    if c_impl:  # (the C claim is ring_release's compare-and-swap, the zeroing in the same call: the swap made by hand)
        struct.pack_into("=q", first._hwv, 0, 2)
    else:
        assert first._claim(2) == 0 and first._claim(2) is None
    if not fixed:
        struct.pack_into("=q", first._hwv, 8, 2)
    return log, key, base


@pytest.mark.parametrize("c_impl", _IMPLS)
def test_a_search_between_a_claim_and_its_zeroing_reads_no_lap_old_frame(c_impl: bool) -> None:
    """The hand-back's window (the head moved, the claimed frames not zeroed yet) made deterministic. The starting
    protocol's search (its window [head, head + frames)) lands on the claimed slots, still the user's, and takes frame
    17 (physically frame 1) for the newest: its newest-first search meets the segment holding the first waiting byte
    there and, until session 25, stopped, never seeing frames 8 and 12: the read was placed as that segment, then an
    unlogged tail stamped at the read's own stamp (bytes 10..20, which arrived at 8 s, stamped at 99 s, the merged stamp
    the log exists to undo); it still takes that lap-old frame for the newest segment (an anchor 20 bytes off).
    With the released word the window ends at 16: the newest is 15, the claimed frame not read, and the read cannot be
    placed (its first segment handed back: a gap), as once the zeroing is done. The C search and the Python alike."""
    for fixed in (False, True):
        log, key, base = _claimed_not_zeroed(c_impl, fixed)
        cuts, tail, why = log.cuts(key, base, 30, 99 * 10**9, 16, 1 << 18)
        if not fixed:
            assert log._newest() == 18
            # (its segment holding the first waiting byte sits past the others in the ring: since session 25 the search
            # keeps going past such a segment, for an earlier copy, so these bytes now come out unplaceable, a gap)
            assert cuts is None and "start 10 bytes in" in why
            assert log.newest_segment(key) == (base, base + 10, 5 * 10**9)  # (an anchor taken from it: 20 bytes off)
            continue
        assert log._window() == (2, 16) and log._newest() == 15
        assert log.segments_since(key, base) == [(base + 10, base + 20, 8 * 10**9), (base + 20, base + 30, 12 * 10**9)]
        assert cuts is None and "start 10 bytes in" in why
        assert log.newest_segment(key) == (base + 20, base + 30, 12 * 10**9)
        assert log.reaches(12 * 10**9, 4) and not log.reaches(2 * 10**9, 4) and log.reaches(2 * 10**9)


@pytest.mark.parametrize("c_impl", _IMPLS)
def test_no_hand_back_is_claimed_while_another_is_under_way(c_impl: bool) -> None:
    """While a hand-back is claimed and not released (the released word behind the head), another process's hand-back
    claims nothing and zeroes nothing (two under way at once could publish the released word out of order); once the
    first publishes, the next claims from its end, and the released word follows it: a log of one process's words equal
    after each hand-back, as before."""
    frames = 64
    ring = bytearray(frames * _FRAME)
    _fill(ring, range(0, 60), frames, 10**18)
    a = PacketLog.over(ring, acc if c_impl else None)
    b = PacketLog.over(ring, acc if c_impl else None, share=a)
    struct.pack_into("=q", a._hwv, 0, 8)  # (a claim of [0, 8) under way: the head moved, the released word at 0)
    before = bytes(ring)
    b.maintain(force=True)  # (would claim [8, 28))
    assert bytes(ring) == before and a._window() == (8, frames)
    for f in range(8):  # (the first hand-back done: zeroed, released)
        struct.pack_into("=I", ring, f * _FRAME, 0)
    struct.pack_into("=q", a._hwv, 8, 8)
    b.maintain(force=True)
    assert a._window() == (28, 28 + frames) and _status(ring, frames)[:28] == [0] * 28 and _status(ring, frames)[28:60] == [1] * 32
    one = PacketLog.over(bytearray(ring), acc if c_impl else None)
    one._head = 28
    _fill(one._ring, range(60, 80), frames, 2 * 10**18)
    one.maintain(force=True)
    assert one._window() == (48, 48 + frames) and one._newest() == 80
