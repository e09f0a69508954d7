"""Per-packet arrival stamps the kernel never merges: a packet socket on this process's own connections.

Why: a TCP socket's receive stamp belongs to the *last* packet of what it holds. When a process reads late
(its loop was busy with other streams; measured in a tap at 20 req/s: read lag p50 0.3-0.5 ms, 4 % over
2 ms), the next packet of the peer arrives before the read, TCP coalesces it into the waiting one
(``tcp_try_coalesce`` keeps the later ``tstamp``), and no peek can recover the earlier arrival: a first
token read that way is stamped at the *next* token's arrival, late by a whole inter-token gap (issue 14).

What: one ``AF_PACKET`` socket per process (needs ``CAP_NET_RAW``), ``SOCK_DGRAM``, all protocols, with a classic
BPF filter that accepts only IPv4 TCP segments carrying data toward the local ports of this process's stamped
connections (:meth:`PacketLog.watch`; any packet type but outgoing: arrivals) or from them (outgoing: this process's
own departures, which slow sends take their stamp from), 128 bytes of each (the headers). The kernel writes them with their
stamps into a ``TPACKET_V2`` ring mapped into the process: nothing is copied, read or parsed per packet on
the relay's path. Only when a read holds more segments than arrivals it could tell apart
(``tcpi_data_segs_in``, one ``getsockopt`` per read) are the newest frames read, backwards, until the
connection's segments before the waiting bytes; every 20 ms of reads the older half of the ring is handed
back to the kernel (one status word per frame). The ring's stamp is the packet's own (``skb->tstamp``), the
stamp a packet capture (tcpdump) takes: for an arrival within 1-2 µs of the TCP socket's stamp of the same packet;
for a departure, when the packet entered the device (on loopback a few µs before the peer's arrival stamp).

A tap of several workers (``deltatap tap --workers N``) shares one log (:func:`shared_packet_log`): the parent opens
it before the fork, with a filter attached once on the tap's ends (its listen port, the upstream's addresses and
port), and the workers inherit the socket and its ring: each packet is logged once, not once per worker, and no
connection attaches a filter. The ring's head lives in a shared word, with a second one, the released word: the end
of the last range handed back whose frames are all zeroed. A hand-back claims its range by a compare-and-swap on the
head, when no other is under way, zeroes it, then publishes the released word; a search reads no frame at or past
``released + frames`` (there, until the zeroing is done, lie the claimed frames' lap-old packets), and takes a frame
handed back under it for not there (:meth:`PacketLog.maintain`, :meth:`PacketLog._window`,
:meth:`PacketLog._segment_at`).

A segment's TCP sequence number maps to the connection's stream offset through one anchor per connection,
found once: ``tcpi_bytes_received`` read between two looks at the ring that saw no new segment of the
connection (a packet socket gets each arriving packet before TCP counts it, in the same softirq).

Falls back (returns ``None`` from :func:`packet_log`) without ``CAP_NET_RAW``, off Linux, or with
``DELTATAP_PACKET_STAMPS=0``; IPv6 connections are not watched. Then a merged read keeps the later stamp.

The per-read work here (the ring's search, ``getsockopt(TCP_INFO)``, the stamped ``recvmsg`` of
:func:`recv_stamped`) has a C twin, ``deltatap/net/_pktring.c``, used where it is built (:mod:`deltatap.core.native`;
``DELTATAP_NATIVE=0`` runs the Python here, which stays the definition: tests/kernel/test_pktring.py compares the two).
The same module also holds :mod:`deltatap.net.kstamp`'s whole read in one call (``read_one``, ``read_packets``).
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import mmap
import os
import socket
import struct
import sys
import time
from typing import Any

from deltatap.core import native

__all__ = ["PacketLog", "packet_log", "recv_stamped", "shared_packet_log", "tcp_counters", "tcp_notsent"]

log = logging.getLogger("deltatap.net.pktstamp")

_LINUX = sys.platform.startswith("linux")
ETH_P_IP = 0x0800
SO_ATTACH_FILTER = 26
_SNAP = 128  # bytes kept of each packet: IPv4 header (<= 60) + TCP header (<= 60)
_MAX_LISTED_PORTS = 120  # more watched ports than this: the filter takes the range between the lowest and highest
_MAX_ENDS = 8  # local ports, and remote ends, a log keeps from the start at most (PacketLog.keep_ends); more: by port
# the ring: 4 KiB blocks of 16 frames of 256 bytes (tpacket2_hdr, sockaddr_ll, then the 128 bytes kept)
_BLOCK, _FRAME = 4096, 256
_PER_BLOCK = _BLOCK // _FRAME
_BLOCKS = 1024
_FRAMES = _BLOCKS * _PER_BLOCK  # 16384 frames, 4 MiB
_KEEP_FRAMES = _FRAMES // 2  # what maintain() leaves for reads to look back into
_MAINTAIN_EVERY_NS = 20_000_000
_SOL_PACKET, _PACKET_RX_RING, _PACKET_VERSION, _PACKET_TIMESTAMP = 263, 5, 10, 17
_TPACKET_V2 = 1
_TP_STATUS_USER = 1
_SOFTWARE = 1 << 4  # SOF_TIMESTAMPING_SOFTWARE: the ring's stamp is the packet's skb->tstamp
_TP2 = struct.Struct("=IIIHHII")  # tpacket2_hdr: status, len, snaplen, mac, net, sec, nsec
_U32 = struct.Struct("=I")
_I64 = struct.Struct("=q")  # the head word, and the released word after it (PacketLog._hw)
_PORTS = struct.Struct("!HH")
_IPV4 = struct.Struct("!BBHHHBBH4s4s")
_TCP = struct.Struct("!HHIIB")
_FPROG = struct.Struct("@HL")
_INSN = struct.Struct("=HBBI")
_TCP_INFO_LEN = 160
_BYTES_RECEIVED_AT = 128  # struct tcp_info: tcpi_bytes_received (u64), Linux >= 4.1
_NOTSENT_AT = 144  # struct tcp_info: tcpi_notsent_bytes (u32), Linux >= 4.6
_DATA_SEGS_IN_AT = 152  # struct tcp_info: tcpi_data_segs_in (u32), Linux >= 4.6
SO_TIMESTAMPING = getattr(socket, "SO_TIMESTAMPING", 37 if _LINUX else None)
_TIMESPEC = struct.Struct("@qq")
_ANCBUF = socket.CMSG_SPACE(3 * _TIMESPEC.size) if hasattr(socket, "CMSG_SPACE") else 0  # scm_timestamping
_DONTWAIT = getattr(socket, "MSG_DONTWAIT", 0)

_acc = native.load("deltatap.net._pktring", __name__)
if _acc is not None and _acc.FRAME != _FRAME:  # (built from another layout: the reference runs)
    _acc = None

ETH_P_ALL = 0x0003
_PACKET_OUTGOING = 4  # sll_pkttype of a packet this host sends
# classic BPF: ancillary loads (SKF_AD_OFF + SKF_AD_PROTOCOL / SKF_AD_PKTTYPE)
_AD_PROTOCOL, _AD_PKTTYPE = (-0x1000 + 0) & 0xFFFFFFFF, (-0x1000 + 4) & 0xFFFFFFFF
# classic BPF opcodes
_LDB_ABS, _LDH_ABS, _LDW_ABS, _LDH_IND, _LDXB_MSH = 0x30, 0x28, 0x20, 0x48, 0xB1
_JEQ, _JGE, _JGT, _JSET, _RET, _JA = 0x15, 0x35, 0x25, 0x45, 0x06, 0x05
_ST, _LDX_MEM, _LDB_IND, _RSH_K, _AND_K, _ADD_X, _JGT_X = 0x02, 0x61, 0x50, 0x74, 0x54, 0x0C, 0x2D


def _tcp_info(sock: socket.socket, need: int) -> bytes | None:
    """``struct tcp_info`` of a TCP socket, if the kernel's holds at least ``need`` bytes."""
    try:
        b = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_LEN)
    except OSError:
        return None
    return b if len(b) >= need else None


def _tcp_counters(sock: socket.socket) -> tuple[int, int] | None:
    """``(tcpi_data_segs_in, tcpi_bytes_received)`` of a TCP socket; None if the kernel does not say."""
    b = _tcp_info(sock, _DATA_SEGS_IN_AT + 4)
    if b is None:
        return None
    return struct.unpack_from("=I", b, _DATA_SEGS_IN_AT)[0], struct.unpack_from("=Q", b, _BYTES_RECEIVED_AT)[0]


def _tcp_notsent(sock: socket.socket) -> int | None:
    """``tcpi_notsent_bytes`` of a TCP socket: bytes written to it that TCP has not sent yet; None if unknown."""
    b = _tcp_info(sock, _NOTSENT_AT + 4)
    return None if b is None else struct.unpack_from("=I", b, _NOTSENT_AT)[0]


def kernel_ns(ancdata: list[tuple[int, int, bytes]]) -> int:
    """The software receive stamp (``CLOCK_REALTIME`` ns) in a read's ``ancdata``; 0 if none."""
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPING and len(data) >= _TIMESPEC.size:
            sec, nsec = _TIMESPEC.unpack_from(data)
            return sec * 1_000_000_000 + nsec
    return 0


def _recv_stamped(sock: socket.socket, buf: memoryview, flags: int) -> tuple[int, int]:
    """``recvmsg`` into ``buf`` (never waiting: ``MSG_DONTWAIT``) -> ``(bytes read, kernel receive stamp ns or 0)``;
    raises what ``recvmsg_into`` raises (``BlockingIOError`` when nothing waits)."""
    n, anc, _flags, _addr = sock.recvmsg_into((buf,), _ANCBUF, flags | _DONTWAIT)
    return n, kernel_ns(anc)


# the C twins where built (same arguments, same results)
tcp_counters = _acc.tcp_counters if _acc is not None else _tcp_counters
tcp_notsent = _acc.tcp_notsent if _acc is not None else _tcp_notsent
recv_stamped = _acc.recv if _acc is not None else _recv_stamped


def _port_tests(ports: list[int], span: tuple[int, int] | None, keep: str, drop: str) -> list[tuple[int, str | None, str | None, int]]:
    """A = a port: jump to ``keep`` when it is one of ``ports`` (``span`` given: between its lowest and highest), fall
    through to the instruction after these (``drop`` placed there) otherwise."""
    if span is None:
        return [(_JEQ, keep, None, p) for p in ports]
    return [(_JGE, None, drop, span[0]), (_JGT, drop, keep, span[1])]


def _end_tests(static: tuple[tuple[int, ...], tuple[tuple[bytes, int], ...]] | None, side: str, keep: str) -> list[tuple[int, str | None, str | None, int]]:
    """X = the IP header's length: jump to ``keep`` when the packet belongs to one of the ends ``static`` names,
    ``(local ports, remote (address, port)s)``: on the received side (``side`` "rx") toward a local port or from a
    remote end, on the sent side ("tx") from a local port or toward a remote end; fall through otherwise."""
    if static is None:
        return []
    local, remote = static
    own, other, other_addr = (2, 0, 12) if side == "rx" else (0, 2, 16)  # (tcp port offsets, IP address offset)
    prog: list[tuple[int, str | None, str | None, int]] = []
    if local:
        prog.append((_LDH_IND, None, None, own))
        prog += [(_JEQ, keep, None, p) for p in local]
    for i, (addr, port) in enumerate(remote):
        nxt = f"{side}_end_{i}"
        prog += [
            (_LDH_IND, None, None, other),
            (_JEQ, None, nxt, port),
            (_LDW_ABS, None, None, other_addr),
            (_JEQ, keep, nxt, int.from_bytes(addr, "big")),
            ("label", nxt, None, 0),
        ]
    return prog


def _filter(ports: list[int], span: tuple[int, int] | None = None,
            static: tuple[tuple[int, ...], tuple[tuple[bytes, int], ...]] | None = None) -> bytes:
    """Classic BPF over a cooked packet: IPv4, TCP, not a fragment, carrying data (pure acknowledgements are half
    of what flows on a connection), and either received (any packet type but outgoing) toward a port in ``ports``
    or sent (outgoing) from one -> keep ``_SNAP`` bytes; anything else -> drop. On loopback each packet shows twice
    (outgoing, then received): the received copy is the arrival, the outgoing copy the departure. More than
    ``_MAX_LISTED_PORTS`` ports (or ``span`` given: ``(lowest, highest)``): every port in their range. ``static``
    (a log of known ends, :func:`shared_packet_log`): ``(local ports, remote (IPv4 address, port)s)``, kept as well:
    received toward a local port or from a remote end, sent from a local port or toward a remote end."""
    if span is None and len(ports) > _MAX_LISTED_PORTS:
        span = (min(ports), max(ports))
    if not ports and span is None and not (static and (static[0] or static[1])):
        return _INSN.pack(_RET, 0, 0, 0)
    # (code, jump-if-true label, jump-if-false label, k); None: the next instruction
    prog: list[tuple[int, str | None, str | None, int]] = [
        (_LDH_ABS, None, None, _AD_PROTOCOL),  # A = the packet's ethertype
        (_JEQ, None, "drop", ETH_P_IP),
        (_LDB_ABS, None, None, 9),  # A = protocol
        (_JEQ, None, "drop", 6),
        (_LDH_ABS, None, None, 6),  # A = flags + fragment offset
        (_JSET, "drop", None, 0x1FFF),
        (_LDXB_MSH, None, None, 0),  # X = 4 * (ip[0] & 0xf): the IP header's length
        (_LDB_IND, None, None, 12),  # A = tcp data offset byte
        (_RSH_K, None, None, 2),
        (_AND_K, None, None, 0x3C),  # A = the TCP header's length
        (_ADD_X, None, None, 0),  # A = both headers' length
        (_ST, None, None, 0),
        (_LDH_ABS, None, None, 2),  # A = IP total length
        (_LDX_MEM, None, None, 0),
        (_JGT_X, None, "drop", 0),  # no data beyond the headers: drop
        (_LDXB_MSH, None, None, 0),
        (_LDB_ABS, None, None, _AD_PKTTYPE),
        (_JEQ, "tx", "rx", _PACKET_OUTGOING),
        ("label", "drop", None, 0),
        (_RET, None, None, 0),
        ("label", "tx", None, 0),
        (_JA, "tx_ports", None, 0),
        ("label", "rx", None, 0),
        *_end_tests(static, "rx", "keep_rx"),
        (_LDH_IND, None, None, 2),  # A = tcp destination port
        *_port_tests(ports, span, "keep_rx", "drop_rx"),
        ("label", "drop_rx", None, 0),
        (_RET, None, None, 0),
        ("label", "keep_rx", None, 0),
        (_RET, None, None, _SNAP),
        ("label", "tx_ports", None, 0),
        *_end_tests(static, "tx", "keep_tx"),
        (_LDH_IND, None, None, 0),  # A = tcp source port
        *_port_tests(ports, span, "keep_tx", "drop_tx"),
        ("label", "drop_tx", None, 0),
        (_RET, None, None, 0),
        ("label", "keep_tx", None, 0),
        (_RET, None, None, _SNAP),
    ]
    at: dict[str, int] = {}
    code: list[tuple[int, str | None, str | None, int]] = []
    for ins in prog:
        if ins[0] == "label":
            at[ins[1]] = len(code)  # type: ignore[index]
        else:
            code.append(ins)
    out = []
    for i, (op, jt, jf, k) in enumerate(code):
        if op == _JA:  # an unconditional jump: 32-bit offset in k
            out.append(_INSN.pack(op, 0, 0, at[jt] - i - 1))  # type: ignore[index]
            continue
        t = at[jt] - i - 1 if jt else 0
        f = at[jf] - i - 1 if jf else 0
        if not (0 <= t <= 255 and 0 <= f <= 255):
            raise ValueError("packet filter: a conditional jump too far")
        out.append(_INSN.pack(op, t, f, k))
    return b"".join(out)


class PacketLog:
    """The process's packet socket, read through a ``TPACKET_V2`` ring mapped into memory (see the module doc).

    The kernel writes each accepted packet's headers and its stamp into the next frame of the ring; nothing is
    copied or parsed per packet on the relay's path. :meth:`segments_since` reads the newest frames backwards,
    only when a read needs them; :meth:`maintain` hands old frames back to the kernel (one status word each)."""

    def __init__(self, sock: socket.socket, shared: bool = False) -> None:
        self._sock = sock
        self._ports: dict[int, int] = {}  # local port -> number of watched connections
        self._span: tuple[int, int] | None = None  # the port range the attached filter keeps (None: listed ports)
        self._span_ports = 0  # how many ports were watched when that range was last computed from all of them
        # the ends whose connections the filter keeps whether watched or not (keep_ends): (local ports, remote
        # (IPv4 address, port)s); None: none
        self._static: tuple[tuple[int, ...], tuple[tuple[bytes, int], ...]] | None = None
        self._shared_head(shared)  # (shared: for processes forked after this, see shared_packet_log)
        sock.setsockopt(_SOL_PACKET, _PACKET_VERSION, _TPACKET_V2)
        sock.setsockopt(_SOL_PACKET, _PACKET_TIMESTAMP, _SOFTWARE)  # skb->tstamp: the TCP socket's own stamp
        sock.setsockopt(_SOL_PACKET, _PACKET_RX_RING, struct.pack("=IIII", _BLOCK, _BLOCKS, _FRAME, _FRAMES))
        self._ring = mmap.mmap(sock.fileno(), _BLOCK * _BLOCKS, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self._mv = memoryview(self._ring)
        self._frames = _FRAMES
        self._last_maintain = 0
        self._idle_state()
        self._acc = _acc
        self._attach()

    @classmethod
    def over(cls, ring: bytearray, accelerator: Any = None, share: PacketLog | None = None,
             static: tuple[tuple[int, ...], tuple[tuple[bytes, int], ...]] | None = None) -> PacketLog:
        """A packet log reading ``ring`` (frames laid out as the kernel's, e.g. built by a test; its length a multiple
        of the frame size) instead of a packet socket's, with the C twin ``accelerator`` (``deltatap.net._pktring``)
        or the Python reference (None). Watching ports attaches no filter (the ports and their range are kept).
        ``share``: another log over the same ring whose head (and lock) this one shares, as a worker shares its
        parent's (:func:`shared_packet_log`); ``static``: the ends a shared log's filter keeps."""
        self = cls.__new__(cls)
        self._sock = None  # type: ignore[assignment]
        self._ports = {}
        self._span, self._span_ports = None, 0
        self._static = static
        self._ring = ring  # type: ignore[assignment]
        self._mv = memoryview(ring)
        self._frames = len(self._mv) // _FRAME
        if share is not None:
            self._hw, self._hwv, self._lock = share._hw, share._hwv, share._lock
        else:
            self._shared_head(False)
        self._last_maintain = 0
        self._idle_state()
        self._acc = accelerator
        return self

    def _shared_head(self, shared: bool) -> None:
        """The head (the oldest frame not handed back, a frame number not reduced modulo the ring's frames) lives in
        an 8-byte word, and the released word (the end of the last hand-back whose frames are all zeroed: at most the
        head, equal to it when no hand-back is under way) in the 8 bytes after it, ``_hw``: for a log the workers of a
        tap share (opened before the fork), in an anonymous shared page, so that every process reads and hands back
        from the same head; else in the process's own memory. The C hand-back claims a range with a compare-and-swap on
        the head (``_pktring.ring_release``); the Python reference, which cannot, takes ``_lock`` (a
        ``multiprocessing`` lock made before the fork; None for a log of one process) around its reads and write of the
        words. (A run mixes neither: ``DELTATAP_NATIVE`` is the same in every worker.) See :meth:`maintain`."""
        if shared:
            import multiprocessing

            self._hw: Any = mmap.mmap(-1, mmap.PAGESIZE, mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)
            self._lock: Any = multiprocessing.get_context("fork").Lock()
        else:
            self._hw, self._lock = bytearray(16), None
        self._hwv = memoryview(self._hw)[:16]

    @property
    def _head(self) -> int:
        """The oldest frame not handed back (see :meth:`_shared_head`). Set (a log's start, a test's ring): the
        released word with it (every frame before it handed back and zeroed)."""
        return _I64.unpack_from(self._hwv)[0]

    @_head.setter
    def _head(self, frame: int) -> None:
        _I64.pack_into(self._hwv, 8, frame)
        _I64.pack_into(self._hwv, 0, frame)

    def _window(self) -> tuple[int, int]:
        """``(head, top)``: the frames a search may read, ``[head, top)``; ``top`` is the released word (read first: it
        never passes the head) plus the ring's frames. Past it lie, physically, the frames of a hand-back claimed but
        not all zeroed yet, still marked the user's with packets a lap old: read there, they would stand for the newest
        frames (see :meth:`maintain`). In a log of one process the released word is the head: ``head + frames``."""
        top = _I64.unpack_from(self._hwv, 8)[0] + self._frames
        return _I64.unpack_from(self._hwv)[0], top

    def _attach(self, span: tuple[int, int] | None = None) -> None:
        """(Re)attach the filter for the watched ports: listed one by one up to ``_MAX_LISTED_PORTS``, else their range
        (``span``, when the caller knows it: widened by one port, not recomputed over thousands)."""
        ports = self._ports
        if len(ports) > _MAX_LISTED_PORTS:
            widened = span is not None
            span = span or (min(ports), max(ports))
            prog = _filter([], span, self._static)
            self._span, self._span_ports = span, max(len(ports), self._span_ports) if widened else len(ports)
        else:
            prog = _filter(sorted(ports), None, self._static)
            self._span, self._span_ports = None, 0
        if self._sock is None:
            return
        buf = ctypes.create_string_buffer(prog, len(prog))
        fprog = _FPROG.pack(len(prog) // _INSN.size, ctypes.addressof(buf))
        self._sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, fprog)

    def _kept(self, local_port: int, peer: tuple[bytes, int] | None) -> bool:
        """Whether the filter attached at the start keeps a connection on ``local_port`` with ``peer`` (its IPv4
        address, 4 bytes, and port): one of a shared log's ends (:func:`shared_packet_log`)."""
        static = self._static
        return static is not None and (local_port in static[0] or (peer is not None and peer in static[1]))

    def watch(self, local_port: int, peer: tuple[bytes, int] | None = None) -> None:
        """One more connection on ``local_port`` (to ``peer``: address, 4 bytes, and port): its segments are kept. One
        of the ends the filter kept from the start (:meth:`_kept`) changes nothing. With the range in force, a port
        inside it changes nothing (no new filter), one outside widens it: no pass over every watched port per connection
        (at 10,000 connections that pass, per connect and per close, was a quarter of a tap's CPU while streams opened)."""
        if self._static is not None and self._kept(local_port, peer):
            return
        n = self._ports.get(local_port, 0)
        self._ports[local_port] = n + 1
        if n:
            return
        span = self._span
        if span is not None and len(self._ports) > _MAX_LISTED_PORTS:
            if span[0] <= local_port <= span[1]:
                return
            self._attach((min(span[0], local_port), max(span[1], local_port)))
            return
        self._attach()

    def unwatch(self, local_port: int, peer: tuple[bytes, int] | None = None) -> None:
        """One connection on ``local_port`` (to ``peer``, as :meth:`watch` was told) closed: stop watching the port when
        it was the last. With the range in force the filter is left as it is (it still keeps every watched port, and a
        few unwatched ones at its ends) until the watched ports are half what they were when it was last computed: then
        it is computed again."""
        if self._static is not None and self._kept(local_port, peer):
            return
        n = self._ports.get(local_port, 0)
        if n <= 1:
            self._ports.pop(local_port, None)
            if n == 1:
                left = len(self._ports)
                if self._span is not None and left > _MAX_LISTED_PORTS and 2 * left > self._span_ports:
                    return
                try:
                    self._attach()
                except OSError:
                    pass
        else:
            self._ports[local_port] = n - 1

    def keep_ends(self, local_ports: list[int], remote: list[tuple[bytes, int]]) -> None:
        """Keep the connections with these ends from now on by the filter's ends (see :func:`shared_packet_log`), not
        by their local ports: one filter attached now (none if they are kept already), none per connection. Up to
        ``_MAX_ENDS`` of each kind (a process starting many taps, as a test run does: the rest are watched by port)."""
        local, ends = self._static or ((), ())
        new_local = tuple(sorted(set(local) | set(local_ports)))
        new_ends = tuple(sorted(set(ends) | set(remote)))
        if len(new_local) > _MAX_ENDS:
            new_local = local
        if len(new_ends) > _MAX_ENDS:
            new_ends = ends
        if (new_local, new_ends) == (local, ends):
            return
        self._static = (new_local, new_ends)
        self._attach(self._span)

    @property
    def span(self) -> tuple[int, int] | None:
        """The range of local ports the attached filter keeps (None: it lists the watched ports one by one)."""
        return self._span

    # ---- the ring ------------------------------------------------------------------------
    # Each method below that reads the ring per read has a C twin (deltatap/net/_pktring.c, self._acc): the Python
    # after the dispatch is the reference it must match (tests/kernel/test_pktring.py).
    def _at(self, frame: int) -> int:
        return (frame % self._frames) * _FRAME  # (a block holds _PER_BLOCK frames exactly: the frames are contiguous)

    def _filled(self, frame: int) -> bool:
        return bool(_U32.unpack_from(self._mv, self._at(frame))[0] & _TP_STATUS_USER)

    def _newest(self) -> int:
        """One past the newest frame the kernel has filled: frames ``[head, end)`` are ours, the rest its own."""
        return self._newest_from(*self._window())

    def _newest_from(self, head: int, top: int) -> int:
        """:meth:`_newest` in the window ``[head, top)`` (read once by the caller: :meth:`_window`)."""
        if self._acc is not None:
            return self._acc.ring_newest(self._mv, head, top)
        lo, hi = head, min(head + self._frames, top)  # filled(lo - 1 ...) / not filled(hi) invariant
        if hi <= lo or not self._filled(lo):
            return lo
        while hi - lo > 1:
            mid = (lo + hi) >> 1
            if self._filled(mid):
                lo = mid
            else:
                hi = mid
        return hi

    def _claim(self, end: int) -> int | None:
        """The claim of a hand-back (:meth:`maintain`'s first step): the head moved to ``end`` when no hand-back is
        under way (the released word equals the head) and the head is before ``end`` -> the frame it was at (the range
        ``[head, end)`` is this process's to zero); None: nothing claimed. Under the log's lock (C: a compare-and-swap,
        ``_pktring.ring_release``)."""
        lock = self._lock
        if lock is not None:
            lock.acquire()
        try:
            hv = self._hwv
            released = _I64.unpack_from(hv, 8)[0]
            head = _I64.unpack_from(hv)[0]
            if released != head or head >= end:
                return None
            _I64.pack_into(hv, 0, end)  # (claimed: the frames below it are no longer searched)
            return head
        finally:
            if lock is not None:
                lock.release()

    def _idle_state(self) -> None:
        """No hand-back timer armed: the next read arms one (:meth:`due`)."""
        self._tick: tuple[Any, Any] | None = None  # (loop, TimerHandle) of the armed hand-back
        self._due_ns = 0  # reads call due() once the monotonic clock reaches this
        self._tick_end = -1  # the hand-back's end at the last tick (how many frames came since: busy or not)

    def read_due(self) -> None:
        """What a read does for the hand-back (the reference's; the C reads check ``_due_ns`` themselves): :meth:`due`
        once ``_due_ns`` has passed, else nothing."""
        if time.perf_counter_ns() >= self._due_ns:
            self.due()

    def due(self) -> None:
        """A read found ``_due_ns`` passed. The hand-back runs off the reads' path, on a loop timer every 20 ms while
        frames come (:meth:`_on_tick`): not before a read's recv, where after an idle it cost the request ~40 µs. Here:
        with no timer armed on the running loop (idle, or its loop closed), arm one; with one armed there but late (a
        busy loop) or no running loop, hand back now, as reads did. (A ring's free half lasts 8192 packets: at the longest
        ~60 ms between hand-backs, 130,000 packets a second.)"""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        tick = self._tick
        if loop is None or (tick is not None and tick[0] is loop):
            self.maintain()
            self._due_ns = self._last_maintain + 2 * _MAINTAIN_EVERY_NS
            return
        self._arm(loop)

    def _arm(self, loop: Any) -> None:
        self._tick = (loop, loop.call_later(_MAINTAIN_EVERY_NS / 1e9, self._on_tick))
        self._due_ns = time.perf_counter_ns() + 2 * _MAINTAIN_EVERY_NS  # (a tick later than this: reads step in)

    def _on_tick(self) -> None:
        """The timer's hand-back; armed again while at least ``frames // 16`` frames came since the previous tick (busy),
        else left for a read 20 ms on to arm (few packets: one wake-up per ~40 ms of traffic, not one per 20 ms)."""
        loop = self._tick[0] if self._tick is not None else None
        end = self.maintain(force=True)
        busy = end is not None and end - self._tick_end >= self._frames // 16
        self._tick_end = end if end is not None else self._tick_end
        if loop is not None and busy and not loop.is_closed():
            self._arm(loop)
            return
        self._tick, self._due_ns = None, self._last_maintain + _MAINTAIN_EVERY_NS

    def maintain(self, force: bool = False) -> int | None:
        """Hand back all but the newest ``_KEEP_FRAMES`` frames (every 20 ms at most, unless ``force``), in three
        steps: the claim (:meth:`_claim`: the head moves from ``head`` to ``end`` only if no other process of a shared
        log moved it meanwhile and no hand-back is under way), the zeroing of ``[head, end)``'s status words, by the
        process that claimed them only, once, and the released word set to ``end``. A process whose view of the head is
        stale never zeroes a frame the kernel has since filled again (it finds the head past its ``end``, or another
        hand-back under way, and hands back nothing this time). Between the claim and the released word a search's
        window (:meth:`_window`) ends at the old released word + frames: the slots being zeroed, which hold the claimed
        frames' lap-old packets still marked the user's, lie past it and are not read; as the kernel fills only zeroed
        slots, every frame in ``[head, released + frames)`` is the kernel's (zero) or a packet newer than the head's.
        A process that dies between the claim and the released word leaves every later hand-back refused: the ring
        fills, the kernel drops what does not fit, and reads fall back to their own stamps (none placed wrong).
        Returns the hand-back's end (None: not due)."""
        now = time.perf_counter_ns()
        if not force and now - self._last_maintain < _MAINTAIN_EVERY_NS:
            return None
        self._last_maintain = now
        end = self._newest() - self._frames // 2  # (_KEEP_FRAMES of the packet socket's ring)
        if self._acc is not None:
            self._acc.ring_release(self._mv, self._hwv, end)
            return end
        head = self._claim(end)
        if head is None:
            return end
        mv, at, zero = self._mv, self._at, _U32.pack_into
        while head < end:
            zero(mv, at(head), 0)
            head += 1
        _I64.pack_into(self._hwv, 8, end)  # (released: every frame before end zeroed)
        return end

    def reaches(self, wall_ns: int, limit: int = _FRAMES) -> bool:
        """Whether a search ``limit`` frames back from the newest would reach a packet that arrived at ``wall_ns``: the
        oldest frame it reads came no later. A read whose bytes arrived before that cannot be placed, and searching
        for them would read the whole window in vain (the later a read, the more such searches cost: at 10,000 streams
        that spiral is what saturated a tap)."""
        head, top = self._window()
        if self._acc is not None:
            return self._acc.ring_reaches(self._mv, head, wall_ns, limit, top)
        newest = self._newest_from(head, top)
        oldest = max(head, newest - limit)
        if newest <= oldest:
            return False
        status, _len, _snap, _mac, _net, sec, nsec = _TP2.unpack_from(self._mv, self._at(oldest))
        if not status & _TP_STATUS_USER:
            return False  # (handed back under the search by another process of a shared log: not there)
        return sec * 1_000_000_000 + nsec <= wall_ns

    def _matches(self, key: tuple[bytes, int, bytes, int], limit: int):
        """Frames holding a segment toward ``key``, newest first: ``(frame offset, IP header offset)``.

        Found by ``mmap.rfind`` (C) of the 12 bytes an IPv4 header without options and its TCP header carry
        contiguously (source and destination address, source and destination port), each hit checked
        against its frame's own layout: the ring is read at C speed, not frame by frame in Python."""
        pattern = _pattern(key)
        head, top = self._window()
        newest = self._newest_from(head, top)
        oldest = max(head, newest - limit)
        if newest <= oldest:
            return
        ring, hdr, frame_size = self._ring, _TP2, _FRAME
        hi, lo = newest % self._frames, oldest % self._frames
        spans = [(lo, hi)] if lo < hi else [(0, hi), (lo, self._frames)]  # newest part first
        for first, last in spans:
            end = last * frame_size
            start = first * frame_size
            while end > start:
                at = ring.rfind(pattern, start, end)
                if at < 0:
                    break
                off = at - at % frame_size
                net = hdr.unpack_from(self._mv, off)[4]
                if at == off + net + 12:
                    yield off, off + net
                    end = off
                else:
                    end = at + len(pattern) - 1  # (the bytes matched elsewhere in a frame: look before them)

    def _segment_at(self, off: int, ip: int) -> tuple[int, int, int] | None:
        """``(seq, end_seq, wall_ns)`` of the TCP segment in the frame at ``off`` (its IP header at ``ip``);
        None when it carries no data, or when the frame is not the user's (its status word lacks ``TP_STATUS_USER``)
        before or after its fields are read, or its stamp changed meanwhile: in a log shared by a tap's workers another
        process may hand the frame back, and the kernel fill it again, while this one reads it (not there, then)."""
        mv = self._mv
        status, _len, snap, _mac, _net, sec, nsec = _TP2.unpack_from(mv, off)
        if not status & _TP_STATUS_USER or snap < 40:
            return None
        vihl, _tos, total, _id, _frag, _ttl, _proto, _ck, _src, _dst = _IPV4.unpack_from(mv, ip)
        ihl = (vihl & 0xF) * 4
        if ip + ihl + _TCP.size > len(mv):
            return None  # (headers running past the ring's end: not a segment the kernel wrote)
        _sport, _dport, seq, _ack, doff = _TCP.unpack_from(mv, ip + ihl)
        payload = total - ihl - (doff >> 4) * 4
        if payload <= 0:
            return None
        again = _TP2.unpack_from(mv, off)
        if again[0] != status or again[5:] != (sec, nsec):
            return None  # (handed back, or filled again, under the read)
        return seq, (seq + payload) & 0xFFFFFFFF, sec * 1_000_000_000 + nsec

    def segments_since(self, key: tuple[bytes, int, bytes, int], base_seq: int, limit: int = _FRAMES) -> list[tuple[int, int, int]]:
        """``[(seq, end_seq, wall_ns), ...]``, oldest first: the segments toward connection ``key`` (its
        (source ip, source port, local ip, local port)) that hold sequence number ``base_seq`` or bytes after it,
        searched newest first in the ring. The search stops at a segment that ends at or before ``base_seq`` (the
        bytes before: everything older is older still) or ``limit`` frames back — not at the newest segment holding
        ``base_seq``: that may be a retransmission (a tail-loss probe, an RTO) of a copy that arrived earlier, and the
        bytes were there at the first copy's arrival, so every copy is kept, the first one first."""
        if self._acc is not None:
            head, top = self._window()
            return self._acc.ring_segments(self._mv, head, _pattern(key), base_seq, limit, top)
        out = []
        for off, ip in self._matches(key, limit):
            seg = self._segment_at(off, ip)
            if seg is None:
                continue
            seq, end, _wall = seg
            rel_end = (end - base_seq) & 0xFFFFFFFF
            if rel_end == 0 or rel_end > 0x7FFFFFFF:
                break  # ends before the waiting bytes: everything older is older still
            out.append(seg)  # (one holding the first waiting byte too: an older copy of it may follow)
        out.reverse()
        return out

    def newest_segment(self, key: tuple[bytes, int, bytes, int], limit: int = _FRAMES) -> tuple[int, int, int] | None:
        """The newest ``(seq, end_seq, wall_ns)`` toward ``key`` still in the ring (data segments only)."""
        if self._acc is not None:
            head, top = self._window()
            return self._acc.ring_newest_segment(self._mv, head, _pattern(key), limit, top)
        for off, ip in self._matches(key, limit):
            seg = self._segment_at(off, ip)
            if seg is not None:
                return seg
        return None

    def cuts(
        self, key: tuple[bytes, int, bytes, int], base: int, n: int, last_ns: int, limit: int, read_size: int
    ) -> tuple[list[tuple[int, int]] | None, bool, str | None]:
        """The ``n`` bytes waiting on connection ``key`` from sequence number ``base`` on, split at the segments the log
        saw: ``([(end, wall_ns), ...], unlogged_tail, None)`` (``unlogged_tail``: the last cut holds bytes past the
        newest logged segment, stamped ``last_ns``, the read's own stamp), or ``(None, False, why)`` when the log cannot
        place them (a segment missed, a segment ending past the waiting bytes while ``n`` is under ``read_size``, the
        read's buffer: an anchor off, or none found). ``limit``: frames searched back (:meth:`segments_since`)."""
        if self._acc is not None:
            head, top = self._window()
            return self._acc.ring_cuts(self._mv, head, _pattern(key), base, limit, n, last_ns, read_size, top)
        segs = self.segments_since(key, base, limit)
        cuts: list[tuple[int, int]] = []
        pos = 0
        for seq, end, wall in segs:
            rel_end = (end - base) & 0xFFFFFFFF
            if rel_end <= pos:
                continue  # a copy of bytes already placed (a retransmission)
            rel_start = (seq - base) & 0xFFFFFFFF
            if pos < rel_start <= 0x7FFFFFFF:  # a segment the log missed: cannot place the bytes
                return None, False, f"packet path: {n} waiting bytes, the log's segments start {rel_start - pos} bytes in ({len(segs)} found)"
            if rel_end >= n:
                if rel_end > n and n < read_size:  # the waiting bytes end inside a segment: TCP queues whole segments
                    return None, False, f"packet path: the log's segment ends {rel_end - n} bytes past the waiting bytes"
                cuts.append((n, wall))
                return cuts, False, None
            cuts.append((rel_end, wall))
            pos = rel_end
        if not cuts:
            return None, False, f"packet path: {n} waiting bytes, no segment of them in the log"
        cuts.append((n, last_ns))  # (bytes the log has not seen yet)
        return cuts, True, None


def _pattern(key: tuple[bytes, int, bytes, int]) -> bytes:
    """The 12 bytes an IPv4 header without options and its TCP header carry contiguously for connection ``key``:
    source and destination address, source and destination port."""
    return key[0] + key[2] + _PORTS.pack(key[1], key[3])


_log: PacketLog | None = None
_tried = False


def packet_log() -> PacketLog | None:
    """This process's packet log, opened on first use (or inherited: :func:`shared_packet_log`); None where it cannot
    be (see the module doc)."""
    global _tried
    if not _LINUX or os.environ.get("DELTATAP_PACKET_STAMPS", "1").strip().lower() in ("0", "off", "false", "no"):
        return None
    if _tried:
        return _log
    _tried = True
    return _open(False)


def shared_packet_log(local_ports: list[int], remote: list[tuple[bytes, int]]) -> PacketLog | None:
    """Open this process's packet log for processes it is about to fork (``deltatap tap --workers N``: called in the
    parent, before the fork), with a filter attached once that keeps the segments of every connection with these ends:
    ``local_ports`` (the tap's listen port: its clients' connections) and ``remote``, ``(IPv4 address, 4 bytes, port)``
    ends (the upstream's resolved addresses). The workers inherit the socket and its mapping, the same kernel ring: each
    packet is logged once for all of them, not once per worker, and a connection to one of those ends attaches no
    filter (:meth:`PacketLog.watch`); one to another end adds its port as a single-process log does. The head lives in
    shared memory (:meth:`PacketLog._shared_head`). None where the log cannot be opened (see :func:`packet_log`)."""
    global _tried
    if not _LINUX or os.environ.get("DELTATAP_PACKET_STAMPS", "1").strip().lower() in ("0", "off", "false", "no"):
        return None
    _tried = True
    plog = _open(True)
    if plog is not None:
        plog.keep_ends(local_ports, remote)
    return plog


def _open(shared: bool) -> PacketLog | None:
    global _log
    try:
        sock = socket.socket(socket.AF_PACKET, socket.SOCK_DGRAM, socket.htons(ETH_P_ALL))
    except (OSError, AttributeError) as exc:
        log.info("per-packet stamps off (%s): a read the kernel merged keeps its later stamp", getattr(exc, "strerror", None) or exc)
        return None
    try:
        sock.setblocking(False)
        _log = PacketLog(sock, shared)
    except OSError as exc:
        sock.close()
        log.info("per-packet stamps off (%s)", exc.strerror or exc)
        return None
    return _log
