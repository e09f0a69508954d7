"""Per-packet arrival stamps the kernel never merges: a packet socket on this process's own connections.

Why: a TCP socket's receive stamp belongs to the *last* packet of what it holds. When a process reads late
(its loop was busy with other streams; measured in a tap at 20 req/s: read lag p50 0.3-0.5 ms, 4 % over
2 ms), the next packet of the peer arrives before the read, TCP coalesces it into the waiting one
(``tcp_try_coalesce`` keeps the later ``tstamp``), and no peek can recover the earlier arrival: a first
token read that way is stamped at the *next* token's arrival, late by a whole inter-token gap (issue 14).

What: one ``AF_PACKET`` socket per process (needs ``CAP_NET_RAW``), ``SOCK_DGRAM`` for IPv4, with a classic
BPF filter that accepts only TCP segments toward the local ports of this process's stamped connections
(:meth:`PacketLog.watch`), 128 bytes of each (the headers), with the kernel's ``SO_TIMESTAMPNS`` stamp: the
same ``skb->tstamp`` the TCP socket reports, taken once per packet when the network stack takes it in, so
the two agree exactly for a packet that was not merged. The packets are read in batches, off the relay's
per-byte path: only when a read turns out to hold more segments than arrivals it could tell apart
(``tcpi_data_segs_in``), and every 20 ms of reads otherwise so the socket's buffer never fills.

A segment's TCP sequence number maps to the connection's stream offset through one anchor per connection,
found once: ``tcpi_bytes_received`` read between two drains that saw no new segment of the connection (a
packet socket of ``ETH_P_IP`` gets each packet before TCP does, in the same softirq, so every byte TCP
counts is already in the log).

Falls back (returns ``None`` from :func:`packet_log`) without ``CAP_NET_RAW``, off Linux, or with
``DELTATAP_PACKET_STAMPS=0``; IPv6 connections are not watched. Then a merged read keeps the later stamp.
"""

from __future__ import annotations

import collections
import ctypes
import logging
import os
import socket
import struct
import sys
import time

__all__ = ["PacketLog", "packet_log", "tcp_counters"]

log = logging.getLogger("deltatap.net.pktstamp")

_LINUX = sys.platform.startswith("linux")
ETH_P_IP = 0x0800
SO_ATTACH_FILTER = 26
SO_TIMESTAMPING = getattr(socket, "SO_TIMESTAMPING", 37)
_RX_FLAGS = (1 << 3) | (1 << 4)  # SOF_TIMESTAMPING_RX_SOFTWARE | SOF_TIMESTAMPING_SOFTWARE, as deltatap.net.kstamp
_SNAP = 128  # bytes kept of each packet: IPv4 header (<= 60) + TCP header (<= 60)
_RCVBUF = 4 << 20
_MAX_LISTED_PORTS = 120  # more watched ports than this: the filter takes the range between the lowest and highest
_KEEP = 512  # segments kept per connection
_DRAIN_EVERY_NS = 20_000_000
_TIMESPEC = struct.Struct("@qq")
_ANC = socket.CMSG_SPACE(3 * _TIMESPEC.size) if hasattr(socket, "CMSG_SPACE") else 0
_IPV4 = struct.Struct("!BBHHHBBH4s4s")
_TCP = struct.Struct("!HHIIB")
_FPROG = struct.Struct("@HL")
_INSN = struct.Struct("=HBBI")
_TCP_INFO_LEN = 160
_BYTES_RECEIVED_AT = 128  # struct tcp_info: tcpi_bytes_received (u64), Linux >= 4.1
_DATA_SEGS_IN_AT = 152  # struct tcp_info: tcpi_data_segs_in (u32), Linux >= 4.6

# classic BPF opcodes
_LDB_ABS, _LDH_ABS, _LDH_IND, _LDXB_MSH = 0x30, 0x28, 0x48, 0xB1
_JEQ, _JGE, _JGT, _JSET, _RET = 0x15, 0x35, 0x25, 0x45, 0x06
_ST, _LDX_MEM, _LDB_IND, _RSH_K, _AND_K, _ADD_X, _JGT_X = 0x02, 0x61, 0x50, 0x74, 0x54, 0x0C, 0x2D


def tcp_counters(sock: socket.socket) -> tuple[int, int] | None:
    """``(tcpi_data_segs_in, tcpi_bytes_received)`` of a TCP socket; None if the kernel does not say."""
    try:
        b = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_LEN)
    except OSError:
        return None
    if len(b) < _DATA_SEGS_IN_AT + 4:
        return None
    return struct.unpack_from("=I", b, _DATA_SEGS_IN_AT)[0], struct.unpack_from("=Q", b, _BYTES_RECEIVED_AT)[0]


def _filter(ports: list[int]) -> bytes:
    """Classic BPF over a cooked IPv4 packet: TCP, not a fragment, carrying data (pure acknowledgements are
    half of what flows toward a server's port), destination port in ``ports`` (or, for many ports, between
    the lowest and the highest) -> keep ``_SNAP`` bytes; anything else -> drop."""
    if not ports:
        return _INSN.pack(_RET, 0, 0, 0)
    # (code, jump-if-true label, jump-if-false label, k); None: the next instruction
    prog: list[tuple[int, str | None, str | None, int]] = [
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
        (_LDH_IND, None, None, 2),  # A = tcp destination port
    ]
    if len(ports) <= _MAX_LISTED_PORTS:
        prog += [(_JEQ, "keep", None, p) for p in ports]
        tail = ["drop", "keep"]  # the last failed test falls through to drop
    else:
        prog += [(_JGE, None, "drop", min(ports)), (_JGT, "drop", None, max(ports))]
        tail = ["keep", "drop"]
    at = {label: len(prog) + i for i, label in enumerate(tail)}
    out = []
    for i, (code, jt, jf, k) in enumerate(prog):
        out.append(_INSN.pack(code, at[jt] - i - 1 if jt else 0, at[jf] - i - 1 if jf else 0, k))
    for label in tail:
        out.append(_INSN.pack(_RET, 0, 0, _SNAP if label == "keep" else 0))
    return b"".join(out)


class PacketLog:
    """The process's packet socket and the segments it saw, per connection (see the module doc)."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._ports: dict[int, int] = {}  # local port -> number of watched connections
        self._segs: dict[tuple[bytes, int, bytes, int], collections.deque] = {}  # (src ip, sport, dst ip, dport) -> (seq, end, wall_ns)
        self._buf = memoryview(bytearray(_SNAP))
        self._last_drain = 0
        self.packets = 0
        self.drains = 0
        self._attach()

    def _attach(self) -> None:
        prog = _filter(sorted(self._ports))
        buf = ctypes.create_string_buffer(prog, len(prog))
        fprog = _FPROG.pack(len(prog) // _INSN.size, ctypes.addressof(buf))
        self._sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, fprog)

    def watch(self, local_port: int) -> None:
        n = self._ports.get(local_port, 0)
        self._ports[local_port] = n + 1
        if n == 0:
            self._attach()

    def unwatch(self, key: tuple[bytes, int, bytes, int]) -> None:
        """Forget a connection (``key`` as for :meth:`segments`) and stop watching its local port when it was the last."""
        self._segs.pop(key, None)
        port = key[3]
        n = self._ports.get(port, 0)
        if n <= 1:
            self._ports.pop(port, None)
            if n == 1:
                try:
                    self._attach()
                except OSError:
                    pass
        else:
            self._ports[port] = n - 1

    def drain(self) -> int:
        """Read every packet waiting; returns how many were TCP data segments."""
        sock, buf, recv = self._sock, self._buf, self._sock.recvmsg_into
        segs = self._segs
        n = 0
        while True:
            try:
                got, anc, _flags, _addr = recv((buf,), _ANC, socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                break
            if got < 40:
                continue
            vihl, _tos, total, _id, _frag, _ttl, _proto, _ck, src, dst = _IPV4.unpack_from(buf, 0)
            ihl = (vihl & 0xF) * 4
            sport, dport, seq, _ack, off = _TCP.unpack_from(buf, ihl)
            payload = total - ihl - (off >> 4) * 4
            if payload <= 0:
                continue
            wall = 0
            for level, kind, data in anc:
                if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPING:
                    sec, nsec = _TIMESPEC.unpack_from(data)
                    wall = sec * 1_000_000_000 + nsec
            key = (src, sport, dst, dport)
            q = segs.get(key)
            if q is None:
                q = segs[key] = collections.deque(maxlen=_KEEP)
            q.append((seq, (seq + payload) & 0xFFFFFFFF, wall))
            n += 1
        self.packets += n
        self.drains += 1
        self._last_drain = time.perf_counter_ns()
        # (connections that closed without unwatch: their ports are no longer watched by anyone)
        if len(segs) > 4 * (len(self._ports) + 16):
            for k in [k for k in segs if k[3] not in self._ports]:
                del segs[k]
        return n

    def maybe_drain(self) -> None:
        if time.perf_counter_ns() - self._last_drain > _DRAIN_EVERY_NS:
            self.drain()

    def segments(self, key: tuple[bytes, int, bytes, int]) -> collections.deque | None:
        """``(seq, end_seq, wall_ns)`` of the data segments seen toward one connection, oldest first."""
        return self._segs.get(key)


_log: PacketLog | None = None
_tried = False


def packet_log() -> PacketLog | None:
    """This process's packet log, opened on first use; None where it cannot be (see the module doc)."""
    global _log, _tried
    if not _LINUX or os.environ.get("DELTATAP_PACKET_STAMPS", "1").strip().lower() in ("0", "off", "false", "no"):
        return None
    if _tried:
        return _log
    _tried = True
    try:
        sock = socket.socket(socket.AF_PACKET, socket.SOCK_DGRAM, socket.htons(ETH_P_IP))
    except (OSError, AttributeError) as exc:
        log.info("per-packet stamps off (%s): a read the kernel merged keeps its later stamp", getattr(exc, "strerror", None) or exc)
        return None
    try:
        sock.setblocking(False)
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPING, _RX_FLAGS)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _RCVBUF)
        _log = PacketLog(sock)
    except OSError as exc:
        sock.close()
        log.info("per-packet stamps off (%s)", exc.strerror or exc)
        return None
    return _log
