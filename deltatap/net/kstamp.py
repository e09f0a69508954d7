"""Kernel receive stamps: a TCP transport whose reads are stamped by the kernel, not by Python.

A read stamped in ``data_received`` is late by however long the process waited for a CPU after
the bytes arrived; on a loaded machine that wait dominates every "arrived" point (measured in the
accuracy harness, 8 Python processes on 2 cores: a third of all reads ran more than 0.3 ms after
their bytes arrived). Linux stamps each incoming packet when its network stack takes it in
(``SO_TIMESTAMPING`` software receive stamps; on loopback, inside the sender's ``send``), and a read
carries the stamp of its last packet as ancillary data of ``recvmsg``.

:class:`KernelStampTransport` hands it to its protocol as :attr:`~KernelStampTransport.rx_mono_ns`
(read it inside ``data_received``), on this process's :func:`deltatap.clock.mono_ns` scale. The
kernel stamps ``CLOCK_REALTIME``; each stamp is moved onto the monotonic scale by its age
(``time_ns() - stamp``) read between two back-to-back ``mono_ns()`` readings, so a wall-clock step
or slew cannot leak in. A read without a stamp (bytes that arrived before stamping was switched
on) is stamped by Python, as before.

One stamp per read is not enough when the process was late: a read then holds several writes of
the peer (SSE events) and all would take the last one's stamp. So when the first waiting packet is
more than 30 µs old, the transport peeks first, finds where the packets' stamps change (a bisection of peeks of growing length, see
:meth:`KernelStampTransport._arrivals`), and hands the bytes to the protocol one arrival at a time,
each with its own stamp, as if it had read each packet the moment it came. What the kernel merged
in the socket's queue before the read (TCP coalesces a packet into the previous one once that one
is acknowledged) keeps the later stamp: never earlier than the truth, at worst as late as Python's.

Writes are stamped in Python just before the ``send`` (:attr:`~KernelStampTransport.last_write_mono_ns`); the
bytes left between that and the moment ``send`` returned (:attr:`~KernelStampTransport.last_write_bound_ns`). A send
that took over 30 µs (the process lost its CPU in it, or the peer's receive work ran in it, as on loopback) takes the
departure of the segment that carried its first byte from the packet log, bounded by the send's return
(:meth:`_restamp_write`, :meth:`_placed`). Each read carries
how much earlier its bytes may have arrived (:attr:`~KernelStampTransport.rx_bound_ns`): 0 where each piece handed
over is one segment (``tcpi_data_segs_in``) or a packet-log placement, else back to the previous arrival it could
tell apart, or to the last moment the socket's queue was seen empty. Measured against the kernel's transmit stamps in the accuracy harness
(per-write ``SO_TIMESTAMPING`` requests, read back from the error queue): p99 15-40 µs early, more
than 0.3 ms for at most 3 writes in 2,500 per process. Transmit stamps are not used because the
kernel reports them through the socket's error queue, which makes the socket poll with ``EPOLLERR``,
and libuv (so uvloop) stops watching a socket on ``EPOLLERR``.

uvloop's transports read in C and cannot hand out ancillary data, so this is a transport of its
own, on the running loop's ``add_reader``/``add_writer`` (uvloop or asyncio): plain TCP only (TLS
connections keep the loop's transports and Python's stamps).

The usual read is one C call (``deltatap/net/_pktring.c``, where built: ``read_one`` does what
:meth:`KernelStampTransport._one_segment` does up to the protocol's ``data_received``; where several segments wait,
``read_split`` what :meth:`KernelStampTransport._on_readable` does from its one-byte peek through
:meth:`KernelStampTransport._read_by_packets` up to ``cuts_received``), and so is the usual write (``send``:
:meth:`KernelStampTransport._write` into an empty buffer and :meth:`deltatap.net.conn.StampedProtocol.send`'s
bookkeeping; a partial send, an error or bytes already waiting continue in the Python), and the loop's reader
callback itself is C where built (``readable``: :meth:`KernelStampTransport._on_readable` up to the protocol's
``data_received`` - for a :class:`deltatap.net.conn.StampedProtocol` that keeps that class's ``data_received``, what it
does, ``on_data(data, rx_mono_ns, rx_bound_ns)``, without its frame - ``_peer_eof`` or the split path, with its error
handling). What these C calls read and set per read
and per write - TCP's segment count at the last read, the stream offsets, the queue-empty moment, the read's stamp and
bound, the write's stamp, bound and count - are C long longs of the transport's base class where built
(``_pktring.transport_base``, under the slots' names), and ``READ_LAG`` is the C ``ReadLag``: touched in place, not
through an int object each (those attribute writes were ~4 % of a tap's CPU in the 10k-stream soak). The Python here stays the
definition, runs with ``DELTATAP_NATIVE=0`` and is compared with the C on real loopback connections
(tests/kernel/test_kstamp_native.py, tests/kernel/test_kstamp_write.py). Either way a read makes the same system calls:
``getsockopt(TCP_INFO)`` and one ``recvmsg`` for one segment; for several, the same ``TCP_INFO`` (its counters kept for
what follows: :attr:`~KernelStampTransport._split_counts`), a one-byte peek (the first buffer's stamp), a peek of all
and a discard; a write, one ``send``.

Servers: :func:`start_server` (used by :func:`deltatap.wire.make_stamping_site`); clients:
:func:`connect` on an already-connected socket (used by :func:`deltatap.wire.make_stamping_connector`).
Set ``DELTATAP_KERNEL_STAMPS=0`` to turn kernel stamps off (the loop's own transports are used).
"""

from __future__ import annotations

import asyncio
import collections
import fcntl
import logging
import os
import socket
import struct
import sys
import termios
import threading
import time
from collections.abc import Callable
from typing import Any

from deltatap.net.pktstamp import _ANCBUF, SO_TIMESTAMPING, PacketLog, packet_log, recv_stamped, tcp_counters, tcp_notsent
from deltatap.net.pktstamp import _tcp_info
from deltatap.net.pktstamp import _acc as _pktacc

__all__ = ["KernelStampServer", "KernelStampTransport", "connect", "enabled", "stamp_source", "start_server"]

log = logging.getLogger("deltatap.net.kstamp")

_LINUX = sys.platform.startswith("linux")
# linux/net_tstamp.h: software receive stamps, reported
SOF_TIMESTAMPING_RX_SOFTWARE = 1 << 3
SOF_TIMESTAMPING_SOFTWARE = 1 << 4
RX_FLAGS = SOF_TIMESTAMPING_RX_SOFTWARE | SOF_TIMESTAMPING_SOFTWARE
_PEEK = socket.MSG_PEEK
_PEEK_NOCOPY = socket.MSG_PEEK | socket.MSG_TRUNC  # TCP: report, do not copy
_DISCARD = socket.MSG_TRUNC  # TCP: take bytes in without copying them (they were peeked)
_SPLIT_PROBES = 24  # peeks spent per read on finding where its arrivals change
_PROMPT_NS = 30_000  # a read this soon after its first packet arrived is not split (others came within it)
_READ_SIZE = 256 * 1024  # one read takes up to this much (what asyncio and uvloop read at once)
_PLACEMENT_TOL_NS = 50_000  # a packet-log placement whose last segment is further from the read's stamp is wrong
# Frames of the packet log searched back from the newest for one connection's segments (256 B each: 512 KiB at
# most, ~0.2 s of history at 10k packets/s): the whole ring (4 MiB) per late read is what saturated a tap
# carrying 10k streams; a segment further back is not placed (the read keeps its interval).
_SEARCH_FRAMES = 2048
_SLOW_SEND_NS = 30_000  # a send that took longer: its departure is looked up in the packet log
_RESTAMP_SLACK_NS = 50_000  # a logged departure this far outside the send's readings is not this write's
# Frames of the packet log looked at, back from the newest, for the segment a send just handed to the device
# (_left_by): on loopback it is logged inside the send, and only what other processors log meanwhile comes after it
_LEFT_FRAMES = 8
_MAX_AGE_NS = 60 * 10**9  # a stamp older than this (or from the future) means the wall clock stepped
_SOCKET_ERRORS = (OSError,)
_mono = time.perf_counter_ns  # deltatap.clock.mono_ns, bound here for the read path
_wall = time.time_ns


def enabled() -> bool:
    """Whether new servers and connections use kernel stamps: Linux (``SO_TIMESTAMPING``,
    ``recvmsg``) unless ``DELTATAP_KERNEL_STAMPS`` is ``0``/``off``/``false``/``no``."""
    if SO_TIMESTAMPING is None or not _ANCBUF or not hasattr(socket.socket, "recvmsg_into"):
        return False
    return os.environ.get("DELTATAP_KERNEL_STAMPS", "1").strip().lower() not in ("0", "off", "false", "no")


class ReadLag:
    """How late this process reads: its read time minus the kernel's arrival stamp of the first packet waiting,
    per stamped read, in power-of-two buckets of ns (bucket ``i`` holds lags in ``[2**(i-1), 2**i)``).
    Process-wide (every stamped transport adds to :data:`READ_LAG`); the tap exports it on ``/metrics``."""

    __slots__ = ("buckets", "count", "total_ns")

    def __init__(self) -> None:
        self.buckets = [0] * 48
        self.count = 0
        self.total_ns = 0

    def add(self, ns: int) -> None:
        if ns < 0:
            ns = 0
        self.buckets[min(ns.bit_length(), 47)] += 1
        self.count += 1
        self.total_ns += ns


READ_LAG: Any = ReadLag()  # (the C twin ``_pktring.ReadLag`` where the read path is C: see below)
# reads that held more segments than arrivals (with the packet log on): placed segment by segment from the log,
# or not (the log could not place the bytes: the read's stamps fall back to the kernel's, the later one for merged
# packets; ``out_of_reach`` counts the fallbacks whose bytes arrived before the oldest frame a search reads, not searched
# for at all). Process-wide, like READ_LAG; the tap exports both on /metrics.
MERGED_READS = {"packets": 0, "fallback": 0, "out_of_reach": 0}
# sends that took longer than _SLOW_SEND_NS: their departure placed from the packet log, or not (the write keeps the
# stamp taken before the send, with the send's duration as its bound). Process-wide; the tap exports it.
SLOW_SENDS = {"packets": 0, "bounded": 0}


def stamp_source() -> str:
    """Where this process's read stamps come from: ``packet`` (the kernel's receive stamps, and each packet's own
    arrival where the kernel merged packets: :mod:`deltatap.net.pktstamp`), ``kernel`` (receive stamps only: a
    merged read keeps the later stamp) or ``process`` (taken when the process reads)."""
    if not enabled():
        return "process"
    return "packet" if packet_log() is not None else "kernel"


_local = threading.local()


def _read_view() -> memoryview:
    """This thread's read buffer (one per thread, as uvloop keeps one per loop: every read is
    copied out before the callback returns)."""
    view = getattr(_local, "view", None)
    if view is None:
        view = _local.view = memoryview(bytearray(_READ_SIZE))
    return view


_OFFSET_EVERY_NS = 200_000_000  # the wall-minus-monotonic offset is measured again this often
_offset = [0, 0, -_OFFSET_EVERY_NS - 1]  # (offset ns, width of the reading pair it came from, measured at mono ns)


def _measure_offset(now: int) -> int:
    """``time_ns() - mono_ns()``, from the narrowest of a few back-to-back reading pairs (nothing that allocates in
    between, so no garbage collection): good to half that pair's width, a few hundred ns."""
    best_w, best_off = 1 << 62, 0
    for _ in range(5):
        a = _mono()
        w = _wall()
        b = _mono()
        if b - a < best_w:
            best_w, best_off = b - a, w - ((a + b) >> 1)
    _offset[0], _offset[1], _offset[2] = best_off, best_w, now
    return best_off


def _to_mono(k: int) -> int:
    """``mono_ns`` of the kernel stamp ``k`` (now, for 0 or an implausible stamp: the wall clock stepped).

    One offset between the two clocks serves every stamp of the process (measured again every 200 ms), so two
    stamps converted microseconds apart keep their order to the nanosecond, not to a reading pair's width each
    (converting each stamp with its own pair let the same instant differ by up to 20 µs between observers)."""
    now = _mono()
    if not k:
        return now
    off = _offset[0] if now - _offset[2] < _OFFSET_EVERY_NS else _measure_offset(now)
    t = k - off
    if t <= now + 1_000_000 and now - t <= _MAX_AGE_NS:
        return t if t <= now else now
    off = _measure_offset(now)  # (implausible: the wall clock may have stepped; measure again, once)
    t = k - off
    if t <= now + 1_000_000 and now - t <= _MAX_AGE_NS:
        return t if t <= now else now
    return now


_to_mono_ref = _to_mono  # (the reference: tests/kernel/test_kstamp_native.py compares the C twin with it)
# The C twin of the one-segment read (deltatap/net/_pktring.c ``read_one``: :meth:`KernelStampTransport._one_segment`,
# :meth:`~KernelStampTransport._hand_over_read` and :meth:`~KernelStampTransport._deliver` up to the protocol's
# ``data_received``, in one call) and of :func:`_to_mono`, sharing this module's READ_LAG and offset; None where not
# built or ``DELTATAP_NATIVE`` turns ``pktring`` off (the Python here runs, and stays the definition).
# Likewise ``read_packets``: :meth:`KernelStampTransport._read_by_packets` for a protocol with ``cuts_received``, up to
# that call.
_TCP_CLOSE = 7  # tcpi_state (include/net/tcp_states.h) of a connection a reset (or a fatal error) closed
_read_one: Callable[[Any], Any] | None = None
_read_packets: Callable[[Any, int], Any] | None = None
if _pktacc is not None and hasattr(_pktacc, "read_packets"):
    READ_LAG = _pktacc.ReadLag()  # (the same buckets, count, total_ns and add, counted in C by the read paths)
    _pktacc.read_setup(READ_LAG, MERGED_READS, _offset, _measure_offset, _READ_SIZE, _SEARCH_FRAMES, _PLACEMENT_TOL_NS,
                       _PROMPT_NS)
    _read_one, _read_packets, _to_mono = _pktacc.read_one, _pktacc.read_packets, _pktacc.to_mono  # noqa: F811
# ``read_split``: what :meth:`KernelStampTransport._on_readable` does when ``read_one`` finds several segments waiting, from
# its one-byte peek through :meth:`~KernelStampTransport._read_by_packets`, in one call (see _split_fast). ``send``: the
# usual write, :meth:`KernelStampTransport._write` into an empty buffer and :meth:`deltatap.net.conn.StampedProtocol.send`'s
# bookkeeping, in one call (anything else - a partial send, an error, bytes already waiting - continues in the Python).
_read_split: Callable[[Any], Any] | None = None
_send: Callable[[Any, Any, Any], Any] | None = None
if _read_one is not None and hasattr(_pktacc, "send"):
    _pktacc.write_setup(SLOW_SENDS, _SLOW_SEND_NS, _LEFT_FRAMES)
    _read_split, _send = _pktacc.read_split, _pktacc.send
# ``read_plain``: the read of a transport without the packet log (no CAP_NET_RAW, IPv6), :meth:`~KernelStampTransport._read_merged`
# from its peek through :meth:`~KernelStampTransport._read_late`'s prompt read and :meth:`~KernelStampTransport._deliver`, up to
# the protocol's ``data_received``, in one call (a late read goes on in _read_late). Used where ``_fast`` is set, as read_one.
_read_plain: Callable[[Any], Any] | None = None
if _read_one is not None and hasattr(_pktacc, "read_plain"):
    _read_plain = _pktacc.read_plain
# ``readable``: :meth:`KernelStampTransport._on_readable` itself in C, registered as the loop's reader callback
# (``add_reader(fd, readable, transport)``): the usual read (``read_one``), and where several segments wait what
# :meth:`~KernelStampTransport._split_fast` does (``read_split``), with their hand-over to the protocol, without a Python
# frame of the transport's; what is left it hands to the Python methods _on_readable calls (``_split_rest``,
# ``_peer_eof``; a transport whose ``_fast`` is not ``read_one`` to _on_readable whole). Without the packet log, its read
# is ``read_plain``'s (``_late_rest`` for a late read), then the TCP_CLOSE check after it. None: the loop calls
# :meth:`KernelStampTransport._on_readable`.
_readable: Callable[[Any], Any] | None = None
if _read_split is not None and hasattr(_pktacc, "readable"):  # (it calls read_one and read_split themselves)
    _readable = _pktacc.readable
# The transport's per-read and per-write counts (TCP's segment count at the last read, the stream offsets, the read's
# stamp and bound, the write's stamp, bound and count; the connection's packet-log keys and sequence anchors, _pkey,
# _tkey, _irs1 and _iss1, which the C send and split read use on every call: there a key is its 12-byte pattern, not
# a tuple of four objects) are plain slots of the class below; where the C read and write
# paths are built they are C long longs instead, kept by the class's base ``_pktring.transport_base(asyncio.Transport)``
# under the same names (``rx_mono_ns`` and ``last_write_mono_ns`` read None until set), so that the C touches them in
# place rather than through an int object each (the Python here reads and writes them the same way either way).
_STATE_SLOTS = ("_segs_in", "_split_counts", "_rx_off", "_empty_mono", "rx_mono_ns", "rx_bound_ns", "_tx_off", "writes",
                "last_write_mono_ns", "last_write_bound_ns", "_pkey", "_irs1", "_tkey", "_iss1")
_TransportBase: Any = asyncio.Transport
if _read_one is not None and _send is not None and hasattr(_pktacc, "transport_base"):
    _TransportBase = _pktacc.transport_base(asyncio.Transport)
    _STATE_SLOTS = ()


class KernelStampTransport(_TransportBase):
    """A non-TLS TCP transport whose reads carry the kernel's receive stamps (see the module doc).

    Flow control, half-close (``write_eof``/``eof_received``), ``pause_reading``/``resume_reading``
    and the ``socket``/``peername``/``sockname`` extras behave as in asyncio's socket transports.
    """

    __slots__ = (
        "_loop", "_sock", "_fd", "_protocol", "_wbuf", "_wsize", "_closing", "_paused",
        "_lost", "_eof", "_high", "_low", "_protocol_paused", "_server",
        "_plog", "_unlogged_tail",
        "lazy_placement", "unplaced_write", "_fast", "_wfast",
    ) + _STATE_SLOTS

    def __init__(
        self, loop: asyncio.AbstractEventLoop, sock: socket.socket, protocol: asyncio.Protocol, server: KernelStampServer | None = None
    ) -> None:
        extra: dict[str, Any] = {"socket": sock}
        for key, call in (("sockname", sock.getsockname), ("peername", sock.getpeername)):
            try:
                extra[key] = call()
            except OSError:
                extra[key] = None
        super().__init__(extra)
        sock.setblocking(False)
        if server is None:  # (accepted sockets inherit it from the listening socket)
            sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPING, RX_FLAGS)
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as asyncio and uvloop do
        self._loop = loop
        self._sock = sock
        self._fd = sock.fileno()
        self._protocol = protocol
        self._wbuf: collections.deque[bytes] = collections.deque()
        self._wsize = 0
        self._closing = False
        self._paused = False
        self._lost = False
        self._eof = False
        self._high = 64 * 1024
        self._low = 16 * 1024
        self._protocol_paused = False
        self._server = server
        self.rx_mono_ns: int | None = None  # kernel stamp of the read being delivered
        self.rx_bound_ns = 0  # its bytes arrived at most this much before rx_mono_ns (0: exact, one segment's own stamp)
        self._empty_mono = _mono()  # the last moment the receive queue was seen empty (nothing waiting arrived earlier)
        self.last_write_mono_ns: int | None = None  # when the latest write's bytes left (see write())
        self.last_write_bound_ns = 0  # they left at most this much after it (-1: unknown, they waited behind others)
        self.writes = 0
        self._plog: PacketLog | None = None
        self._pkey: tuple[bytes, int, bytes, int] | None = None
        self._segs_in = 0
        # The counters _one_segment read when it found several segments waiting, for the split path that follows it at
        # once (_read_merged) instead of a second TCP_INFO read after its one-byte peek: the same decision (the count
        # only grows, and it was over one already) and the same placement; a segment that came between the two readings
        # counts toward the next read instead, which may then split where it need not, but never takes a read that held
        # two segments for one (one getsockopt less per read of several segments).
        self._split_counts: tuple[int, int] | None = None
        self._rx_off = 0  # stream offset (bytes the kernel received in order, counted from 0) of the next byte to read
        self._irs1: int | None = None  # TCP sequence number of stream offset 0 (found once, see _anchor)
        self._unlogged_tail = False  # the last _packet_cuts ended with bytes the log had not seen
        self._tkey: tuple[bytes, int, bytes, int] | None = None  # (local ip, port, peer ip, port): our own segments
        self._tx_off = 0  # bytes handed to the kernel so far (the stream offset of the next byte we send)
        self._iss1: int | None = None  # TCP sequence number of our stream offset 0 (found once, see _tx_anchor)
        # True: a slow send is not placed from the packet log at once; the latest one is kept in unplaced_write for
        # place_write() (a relay places only the writes whose stamps it keeps exact: a head, a first or last token)
        self.lazy_placement = False
        # (t0, t1, stream offset after the write, queued, stream offset of its first byte)
        self.unplaced_write: tuple[int, int, int, bool, int] | None = None
        self._fast = _read_one  # the C twin of _one_segment (None: the Python reference; a test may set either)
        self._wfast = _send  # the C twin of the usual write (None: the Python reference, _write; likewise)
        if sock.family == socket.AF_INET:
            self._watch_packets(sock, extra)
        if server is not None:
            server._attach(self)

    def _watch_packets(self, sock: socket.socket, extra: dict[str, Any]) -> None:
        """Have this process's packet log (:mod:`deltatap.net.pktstamp`) keep this connection's incoming
        segments, for reads the kernel merged."""
        plog = packet_log()
        peer, local = extra.get("peername"), extra.get("sockname")
        if plog is None or not peer or not local:
            return
        for _ in range(3):  # the stream offset of the next byte to read: bytes received minus bytes waiting
            c1 = tcp_counters(sock)
            try:
                waiting = struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0"))[0]
            except OSError:
                return
            c2 = tcp_counters(sock)
            if c1 is None or c2 is None:
                return
            if c1 == c2:
                break
        else:
            return
        self._segs_in, self._rx_off = c2[0], c2[1] - waiting
        self._pkey = (socket.inet_aton(peer[0]), peer[1], socket.inet_aton(local[0]), local[1])
        self._tkey = (self._pkey[2], self._pkey[3], self._pkey[0], self._pkey[1])
        self._plog = plog
        plog.watch(local[1], (self._pkey[0], self._pkey[1]))

    def _start(self) -> None:
        """Tell the protocol, then start reading (unless it paused or closed us meanwhile)."""
        try:
            self._protocol.connection_made(self)
        except BaseException:
            self._force_close(None)
            raise
        if not self._closing and not self._paused:
            self._add_reader()

    # ---- reading -------------------------------------------------------------------------
    def _add_reader(self) -> None:
        """Have the loop call :meth:`_on_readable` (its C twin ``readable`` where built) when the socket is readable."""
        if _readable is not None:
            self._loop.add_reader(self._fd, _readable, self)
        else:
            self._loop.add_reader(self._fd, self._on_readable)

    def _on_readable(self) -> None:
        """Take in what has arrived and hand it to the protocol with its kernel stamp. When the
        first waiting packet is more than ``_PROMPT_NS`` old (the process was late), peek first,
        find where the packets' stamps change and hand the bytes over one arrival at a time, each
        with its own stamp (see :meth:`_arrivals`). Bytes handed over while a reset waited behind them:
        :meth:`_reread`."""
        if self._lost:
            return
        off = self._rx_off
        self._read_once()
        if self._rx_off != off and not self._lost:
            b = _tcp_info(self._sock, 1)
            if b is not None and b[0] == _TCP_CLOSE:
                self._reread()

    def _reread(self) -> None:
        """Read again at once: bytes were just handed over and the connection is closed by a reset (TCP_CLOSE) whose
        error still waits behind them. uvloop (libuv's uv_poll) stops watching a socket after a readiness report
        that carried POLLERR, so when the bytes and the reset came together that callback was the last one: without
        this read the protocol would never learn of the reset (a tap would pass on the bytes, not the reset, and
        hold the exchange open). asyncio's loops report it again; the extra read then finds the same."""
        if not (self._lost or self._paused or self._closing):
            self._loop.call_soon(self._reread_now)

    def _reread_now(self) -> None:
        if not (self._lost or self._paused or self._closing):
            if _readable is not None:
                _readable(self)
            else:
                self._on_readable()

    def _read_once(self) -> None:
        """:meth:`_on_readable`'s one read."""
        plog = self._plog
        if plog is not None:
            call = self._fast  # the C twin of _one_segment, in one call (see _read_one)
            if call is None:
                view = _read_view()
                if not self._one_segment(view):
                    self._read_merged(view)
                return
        elif self._fast is not None and _read_plain is not None:  # (no packet log: the C twin of _read_merged, see _read_plain)
            call = _read_plain
        else:
            self._read_merged(_read_view())
            return
        try:
            got = call(self)
        except (BlockingIOError, InterruptedError):
            return
        except _SOCKET_ERRORS as exc:
            self._fatal(exc)
            return
        if got.__class__ is bytes:
            try:
                self._protocol.data_received(got)
            except BaseException as exc:
                self._fatal(exc, "protocol.data_received() failed")
            return
        if got is None:
            return
        if got is True:
            self._peer_eof()
            return
        if plog is not None:
            self._several()  # (read_one found several segments waiting)
        else:
            self._late_rest(got)  # (read_plain left a late read to the reference)

    def _late_rest(self, got: tuple[int, int, tuple[int, int] | None, int]) -> None:
        """:meth:`_read_once` where ``read_plain`` left a late read to the reference: ``(first, lag, counts, segments)``."""
        self._read_late(_read_view(), *got)

    def _several(self) -> None:
        """:meth:`_on_readable` where ``read_one`` found several segments waiting."""
        if _read_split is not None:  # the C twin of what follows, up to cuts_received
            self._split_fast()
            return
        self._read_merged(_read_view())

    def _read_merged(self, view: memoryview) -> None:
        """:meth:`_on_readable` from its one-byte peek: the counters, the packet log's placement, else the late read."""
        counts, self._split_counts = self._split_counts, None
        r = self._recv(view[:1], _PEEK_NOCOPY)
        if r is None:
            return
        if not r[0]:  # end of stream from the peer
            self._peer_eof()
            return
        first = r[1]
        lag = _wall() - first if first else 0
        if first:
            READ_LAG.add(lag)
        plog = self._plog
        if counts is None:  # (else the counters _one_segment read just before: see _split_counts)
            counts = tcp_counters(self._sock)
        segments = counts[0] - self._segs_in if counts else -1  # data segments since the last read (-1: unknown)
        if counts:
            self._segs_in = counts[0]
        if plog is not None:
            if segments > 1:
                if self._read_by_packets(view, first):
                    MERGED_READS["packets"] += 1
                    return
                MERGED_READS["fallback"] += 1
            plog.read_due()
        self._read_late(view, first, lag, counts, segments)

    def _split_fast(self) -> None:
        """The C twin (``read_split``) of :meth:`_on_readable` from its peek through :meth:`_read_by_packets` (the
        one-byte peek, the counters ``read_one`` read, ``READ_LAG``, ``MERGED_READS``, the placement from the packet log); what it
        leaves (the log cannot place the bytes, or there is one piece) continues in the reference."""
        try:
            got = _read_split(self)  # type: ignore[misc]
        except (BlockingIOError, InterruptedError):
            return
        except _SOCKET_ERRORS as exc:
            self._fatal(exc)
            return
        if got is None:
            return
        if got is True:
            self._peer_eof()
            return
        if len(got) == 2:
            try:
                self._protocol.cuts_received(*got)  # type: ignore[attr-defined]
            except BaseException as exc:
                self._fatal(exc, "protocol.cuts_received() failed")
            return
        self._split_rest(got)

    def _split_rest(self, got: tuple[int, int, tuple[int, int] | None, int, int]) -> None:
        """:meth:`_split_fast` where ``read_split`` left the read to the reference: ``(first, lag, counts, segments,
        how)`` (how 2: its own placement first; 1 and 0: the late read)."""
        first, lag, counts, segments, how = got
        view = _read_view()
        if how == 2:  # (one piece: the reference's own placement, as _read_by_packets does for read_packets' None)
            if self._read_by_packets_ref(view, first):
                MERGED_READS["packets"] += 1
                return
            MERGED_READS["fallback"] += 1
        self._plog.read_due()  # type: ignore[union-attr]
        self._read_late(view, first, lag, counts, segments)

    def _read_late(self, view: memoryview, first: int, lag: int, counts: tuple[int, int] | None, segments: int) -> None:
        """The read after the peek, where the packet log did not place it: one read when the process was prompt (or
        the bytes unstamped), else split at the receive stamps' changes (:meth:`_arrivals`)."""
        if not first or lag < _PROMPT_NS:
            # read promptly (or unstamped): whatever else waits arrived within the same few µs
            t_read = _mono()
            r = self._recv(view, 0)
            if r is not None:
                n, k = r
                if segments == 1 and k and tcp_counters(self._sock) != counts:
                    segments = 2  # (another segment came while this was read: it may be in the read)
                self._hand_over_read(view, n, [(n, k)], segments, t_read, taken=True)
            return
        t_read = _mono()
        r = self._recv(view, _PEEK)
        if r is None:
            return
        n, last = r
        cuts = self._arrivals(n, first, last) if n > 1 and last and first != last else [(n, last or first)]
        if segments > 0 and segments <= len(cuts) and tcp_counters(self._sock) != counts:
            segments = len(cuts) + 1
        self._hand_over_read(view, n, cuts, segments, t_read)

    def _one_segment(self, view: memoryview) -> bool:
        """The packet log's fast path: when TCP counts at most one data segment since the last read, take what waits
        in one ``recvmsg`` (no peek: one segment's buffer carries its own stamp) and hand it over. Whether another
        segment came between the count and the read shows in the byte count: the bytes TCP had received and this
        side had not read, against what the read took. True when handled; False: several segments wait (the
        caller splits them)."""
        counts = tcp_counters(self._sock)
        if counts is None:
            return False
        segments = counts[0] - self._segs_in
        if segments > 1:
            self._split_counts = counts
            return False
        self._segs_in = counts[0]
        self._plog.read_due()  # type: ignore[union-attr]
        t_read = _mono()
        r = self._recv(view, 0)
        if r is None:
            return True
        n, k = r
        if not n:
            self._peer_eof()
            return True
        if k:
            READ_LAG.add(_wall() - k)
        if n != counts[1] - self._rx_off:  # (bytes came after the count: the read may hold another segment)
            segments = 2
        self._hand_over_read(view, n, [(n, k)], segments, t_read, taken=True)
        return True

    def _peer_eof(self) -> None:
        self._loop.remove_reader(self._fd)
        try:
            keep_open = self._protocol.eof_received()
        except BaseException as exc:
            self._fatal(exc, "protocol.eof_received() failed")
            return
        if not keep_open:
            self.close()

    def _hand_over_read(self, view: memoryview, n: int, cuts: list[tuple[int, int]], segments: int, t_read: int, taken: bool = False) -> None:
        """Hand over a read's ``n`` bytes in ``cuts`` (``[(end, kernel_ns), ...]``), each with how much earlier its
        bytes may have arrived than its stamp (:attr:`rx_bound_ns`): 0 where each cut is one segment
        (``segments``, counted by TCP, at most the cuts), else back to the previous cut's stamp, or for the first
        cut to the last moment this socket's queue was seen empty. ``t_read``: just before the read that took or
        peeked the bytes (when it took them all, the queue was empty then); ``taken``: the bytes are already
        taken in (a plain read), not peeked."""
        empty_since = self._empty_mono
        exact = 0 < segments <= len(cuts)
        prev = empty_since
        out: list[tuple[int, int, int]] = []
        for end, k in cuts:
            t = _to_mono(k) if k else t_read
            out.append((end, t if k else 0, 0 if exact and k else max(0, t - prev)))
            prev = t
        if taken:
            if n < len(view):
                self._empty_mono = t_read
            self._deliver(bytes(view[:n]), out[-1][1], out[-1][2])
        elif self._hand_over(view, n, out) and n < len(view):
            self._empty_mono = t_read

    def _hand_over(self, view: memoryview, n: int, cuts: list[tuple[int, int, int]]) -> bool:
        """Take in the ``n`` bytes peeked into ``view`` and hand them to the protocol one cut at a time:
        ``cuts`` is ``[(end, mono_ns, bound_ns), ...]``, each piece with its own stamp (converted once, by the caller;
        0: none, the moment it is handed over) and bound. True when all were taken in (the queue held nothing else
        when they were peeked)."""
        data = bytes(view[:n])  # (the read buffer is shared: keep the peeked bytes while handing them over)
        bulk = getattr(self._protocol, "cuts_received", None) if len(cuts) > 1 else None
        if bulk is not None:  # the protocol takes the whole read at once, with each piece's stamp
            r = self._recv(view[:n], _DISCARD)
            if r is None:
                return False
            got = r[0]
            pieces, start = [], 0
            for end, t, bound in cuts:
                end = min(end, got)
                if end > start:
                    pieces.append((start, end, t or _mono(), bound))
                start = end
            self.rx_mono_ns, self.rx_bound_ns = pieces[-1][2], pieces[-1][3]
            self._rx_off += got
            try:
                bulk(data[:got] if got < n else data, pieces)
            except BaseException as exc:
                self._fatal(exc, "protocol.cuts_received() failed")
                return False
            return got >= n
        start = 0
        for end, t, bound in cuts:
            r = self._recv(view[start:end], _DISCARD)  # take in what was peeked
            if r is None:
                return False
            end = start + r[0]
            if not self._deliver(data[start:end], t, bound) or self._closing or self._paused:
                return end >= n  # (paused: the rest stays in the socket for later, and the queue was not emptied)
            start = end
        return True

    def _read_by_packets(self, view: memoryview, first: int) -> bool:
        """More than one segment arrived since the last read: peek what waits and hand it over one segment
        at a time, each with its arrival from the packet log (what the kernel merged in the socket's queue
        is split there too). False (nothing taken in) when the log cannot place the bytes, at once when the first of
        them arrived before anything a search would read (``first``: the stamp of their first buffer, no earlier than its
        first byte's arrival)."""
        if self._fast is not None:  # the C twin, up to the protocol's cuts_received (None: this reference's own path)
            try:
                got = _read_packets(self, first)  # type: ignore[misc]
            except (BlockingIOError, InterruptedError):
                return True
            except _SOCKET_ERRORS as exc:
                self._fatal(exc)
                return True
            if got.__class__ is tuple:
                try:
                    self._protocol.cuts_received(*got)  # type: ignore[attr-defined]
                except BaseException as exc:
                    self._fatal(exc, "protocol.cuts_received() failed")
                return True
            if got is not None:
                return got
        return self._read_by_packets_ref(view, first)

    def _read_by_packets_ref(self, view: memoryview, first: int) -> bool:
        if first and not self._plog.reaches(first, _SEARCH_FRAMES):  # type: ignore[union-attr]
            MERGED_READS["out_of_reach"] += 1
            return False
        t_read = _mono()
        r = self._recv(view, _PEEK)
        if r is None:
            return True  # (nothing there after all, or the socket failed: handled)
        n, last = r
        cuts = self._checked_cuts(n, last, first)
        if cuts is None and self._irs1 is not None:
            self._irs1 = None  # the anchor may be stale (found once, when a copy of a segment was the newest): once more
            cuts = self._checked_cuts(n, last, first)
        if cuts is None:
            return False
        out = [(end, _to_mono(k) if k else 0, 0) for end, k in cuts]  # each a segment's own arrival
        if self._unlogged_tail and len(out) > 1:  # bytes past the newest logged segment: the read's own (later) stamp
            end, t, _ = out[-1]
            out[-1] = (end, t, max(0, (t or _mono()) - (out[-2][1] or _mono())))
        if self._hand_over(view, n, out) and n < len(view):
            self._empty_mono = t_read
        return True

    def _checked_cuts(self, n: int, last: int, first: int) -> list[tuple[int, int]] | None:
        """:meth:`_packet_cuts`, checked against the kernel: the segment the log places the last waiting byte in must
        carry the stamp TCP gave that byte's buffer (a merged buffer keeps its last packet's), else the placement is
        off (a stale anchor) and is not used."""
        cuts = self._packet_cuts(n, last or first)
        if cuts is not None and last and not self._unlogged_tail and abs(cuts[-1][1] - last) > _PLACEMENT_TOL_NS:
            log.debug("packet path: the log's last segment is %d ns from the read's own stamp: not placed", cuts[-1][1] - last)
            return None
        return cuts

    def _packet_cuts(self, n: int, last_ns: int) -> list[tuple[int, int]] | None:
        """``[(end, wall_ns), ...]`` splitting the ``n`` waiting bytes at the segments the packet log saw
        (``last_ns``, the read's own stamp, for bytes past the newest logged segment)."""
        plog, key = self._plog, self._pkey
        assert plog is not None and key is not None
        if self._irs1 is None:
            self._irs1 = self._anchor()
            if self._irs1 is None:
                log.debug("packet path: no anchor for %s", self._extra.get("peername"))
                return None
        base = (self._irs1 + self._rx_off) & 0xFFFFFFFF  # sequence number of the first waiting byte
        # (a segment the log missed, or the waiting bytes ending inside a segment - TCP queues whole segments, so the
        # anchor is off -, or none found: the bytes are not placed)
        cuts, self._unlogged_tail, why = plog.cuts(key, base, n, last_ns, _SEARCH_FRAMES, _READ_SIZE)
        if cuts is None:
            log.debug("%s", why)
        return cuts

    def _anchor(self) -> int | None:
        """The sequence number of stream offset 0: the log's newest segment of this connection ends at
        ``tcpi_bytes_received`` when no segment of it arrived while that was read (a packet socket gets each
        packet before TCP counts it)."""
        plog, key = self._plog, self._pkey
        assert plog is not None and key is not None
        for _ in range(4):
            newest = plog.newest_segment(key, limit=_SEARCH_FRAMES)
            counts = tcp_counters(self._sock)
            if counts is None or newest is None:
                return None
            if plog.newest_segment(key, limit=_SEARCH_FRAMES) == newest:
                return (newest[1] - counts[1]) & 0xFFFFFFFF
        return None

    def _restamp_write(self, t0: int, t1: int, queued: bool = False, start: int | None = None) -> None:
        """A ``send`` that took long (the process lost its CPU in it, or the kernel's work for the peer ran in it):
        its bytes left somewhere between the readings ``t0`` and ``t1``; or one after which TCP still held bytes
        (``queued``): they leave after ``t1``. Take its placement from the packet log (:meth:`_placed`; ``start``: the
        stream offset of its first byte, None: its last byte's only); keep ``t0`` (and the bound: ``t1 - t0``, or -1
        when queued) when it has none."""
        got = self._placed(t0, t1, self._tx_off - 1 if start is None else start, self._tx_off, queued)
        if got is not None:
            self.last_write_mono_ns, self.last_write_bound_ns = got

    def place_write(self, unplaced: tuple[int, int, int, bool, int] | None) -> tuple[int, int] | None:
        """``(t, bound)`` of a slow or queued send kept by :attr:`unplaced_write` (with :attr:`lazy_placement`): its
        placement from the packet log (:meth:`_placed`), else ``(t0, t1 - t0)`` (queued: ``(t0, -1)``, it left later by
        an unknown time, or has not left yet); None for None. Call it soon (within the packet log's reach: thousands
        of packets)."""
        if unplaced is None:
            return None
        t0, t1, end, queued, start = unplaced
        return self._placed(t0, t1, start, end, queued) or (t0, -1 if queued else t1 - t0)

    def _placed(self, t0: int, t1: int, start: int, end: int, queued: bool) -> tuple[int, int] | None:
        """A slow or held write of stream offsets ``[start, end)`` placed from the packet log: ``(t, bound)``, ``t``
        the departure of the segment that carried its first byte (the log keeps a write's outgoing copy), the bound
        reaching, for a ``queued`` write (TCP held bytes after the send), its last byte's departure — behind a slow
        reader a write leaves in pieces as the window reopens, ms apart, and which of its bytes completes a token is
        not the transport's to know (session 25's referee: placed at the last byte's, stated exact, tokens came out up
        to 233 ms late) — and, for one whose bytes all left within the send, the send's return ``t1``: the write's
        point stands for the next hop's arrival, and on loopback the peer's TCP input runs inside the send, after the
        departure (session 25: a capture saw a slow send's segment arrive 54-57 us after its departure, inside the
        send; stated exact, the point came out early). None when the log does not hold them."""
        got = self._departure(t0, t1, end, queued, start)
        first = got  # (the segment that carried the last byte carried the first too, or it is looked up)
        if got is not None and not got[1]:
            first = self._departure(t0, t1, start + 1, queued, start)
        if got is None or first is None:
            SLOW_SENDS["bounded"] += 1
            return None
        SLOW_SENDS["packets"] += 1
        last, t = got[0], min(first[0], got[0])
        return (t, last - t) if queued else (t, t1 - t)

    def _departure(self, t0: int, t1: int, end: int, queued: bool, start: int) -> tuple[int, bool] | None:
        """The departure (mono ns) of the segment that carried stream offset ``end - 1``, from the packet log: between
        the readings ``t0`` and ``t1`` give or take ``_RESTAMP_SLACK_NS`` (clamped to them), or for a ``queued`` write
        any time from ``t0`` on, and whether that segment carried stream offset ``start`` too; None when the log does
        not hold it (not sent yet, or out of reach)."""
        plog, key = self._plog, self._tkey
        assert plog is not None and key is not None
        for _ in range(2):
            if self._iss1 is None:
                self._iss1 = self._tx_anchor()
                if self._iss1 is None:
                    return None
            last = (self._iss1 + end - 1) & 0xFFFFFFFF  # sequence number of the write's last byte
            segs = plog.segments_since(key, last, limit=256)
            if segs:
                seq, send, wall = segs[0]
                if ((last - seq) & 0xFFFFFFFF) < ((send - seq) & 0xFFFFFFFF):
                    t = _to_mono(wall)
                    if t0 - _RESTAMP_SLACK_NS <= t and (queued or t <= t1 + _RESTAMP_SLACK_NS):
                        held = ((self._iss1 + start - seq) & 0xFFFFFFFF) <= ((last - seq) & 0xFFFFFFFF)
                        return (max(t, t0) if queued else min(max(t, t0), t1)), held
            self._iss1 = None  # (a stale anchor, or the segment is not out yet: once more, then keep t0)
        return None

    def _left_by(self, t1: int) -> bool:
        """Whether the packet log shows the write just sent gone by ``t1``: the newest segment of ours among the log's
        newest ``_LEFT_FRAMES`` frames carries the write's last byte (stream offset ``_tx_off - 1``, through the anchor
        ``_iss1``; the segment ends with it) and left no later than ``t1``. A send's segments are logged as they enter the device, inside the
        send on loopback; once the segment with the last byte left, TCP holds none of the write (tcpi_notsent_bytes
        0), so this is :func:`~deltatap.net.pktstamp.tcp_notsent`'s answer without a ``getsockopt``. False: the log
        cannot tell (no log or anchor, the segment not among those frames or not out by ``t1``): ask TCP."""
        plog, iss1 = self._plog, self._iss1
        if plog is None or iss1 is None:
            return False
        seg = plog.newest_segment(self._tkey, _LEFT_FRAMES)  # type: ignore[arg-type]
        if seg is None:
            return False
        _seq, end, wall = seg
        # (it ends where the write does: no byte of ours follows it; an anchor off by any amount fails this)
        return end == (iss1 + self._tx_off) & 0xFFFFFFFF and _to_mono(wall) <= t1

    def _tx_anchor(self) -> int | None:
        """The sequence number of our stream offset 0: the log's newest segment of ours ends where TCP's sent
        bytes end (``_tx_off`` minus ``tcpi_notsent_bytes``) when no segment of ours left while that was read."""
        plog, key = self._plog, self._tkey
        assert plog is not None and key is not None
        for _ in range(3):
            newest = plog.newest_segment(key, limit=256)
            notsent = tcp_notsent(self._sock)
            if newest is None or notsent is None:
                return None
            if plog.newest_segment(key, limit=256) == newest:
                return (newest[1] - (self._tx_off - notsent)) & 0xFFFFFFFF
        return None

    def _recv(self, buf: memoryview, flags: int) -> tuple[int, int] | None:
        """``recvmsg`` into ``buf`` -> (bytes, kernel receive stamp ns or 0: :func:`~deltatap.net.pktstamp.recv_stamped`);
        None when there is nothing (or the socket failed)."""
        try:
            return recv_stamped(self._sock, buf, flags)
        except (BlockingIOError, InterruptedError):
            return None
        except _SOCKET_ERRORS as exc:
            self._fatal(exc)
            return None

    def _deliver(self, data: bytes, t_mono: int, bound_ns: int = 0) -> bool:
        """Hand ``data`` to the protocol read at ``t_mono`` (0: no kernel stamp, now)."""
        self.rx_mono_ns = t_mono or _mono()
        self.rx_bound_ns = bound_ns
        self._rx_off += len(data)
        try:
            self._protocol.data_received(data)
        except BaseException as exc:
            self._fatal(exc, "protocol.data_received() failed")
            return False
        return True

    def _arrivals(self, n: int, first: int, last: int) -> list[tuple[int, int]]:
        """Split the ``n`` peeked bytes where their kernel stamps change: ``[(end, stamp_ns), ...]``.

        A read carries the stamp of its last packet only; when the process was late, one read holds
        several writes of the peer, and the earlier ones would take the later stamp (an SSE event
        stamped at the next event's arrival). Peeking ``L`` bytes reports the stamp of the packet
        that holds byte ``L - 1``, so a bisection over ``L`` finds where each arrival ends (without
        copying: ``MSG_TRUNC``). Packets the kernel merged in the socket's queue before they were
        read keep only the later stamp, and at most ``_SPLIT_PROBES`` peeks are spent per read
        (what is not split takes the last stamp): both can only make a stamp later, never earlier.
        ``first`` and ``last`` are the stamps of bytes ``0`` and ``n - 1``."""
        cuts: list[tuple[int, int]] = []
        probes = 1
        lo, k_lo = 1, first  # the packet holding byte lo - 1 arrived at k_lo
        while k_lo != last:
            a, b, k_b = lo, n, last  # stamp(a) == k_lo != stamp(b) == k_b
            while b - a > 1:
                if probes >= _SPLIT_PROBES:
                    cuts.append((n, last))
                    return cuts
                m = (a + b) >> 1
                km = self._peek_stamp(m)
                probes += 1
                if not km:
                    cuts.append((n, last))
                    return cuts
                if km == k_lo:
                    a = m
                else:
                    b, k_b = m, km
            cuts.append((a, k_lo))
            lo, k_lo = b, k_b
        cuts.append((n, last))
        return cuts

    def _peek_stamp(self, length: int) -> int:
        try:
            return recv_stamped(self._sock, _read_view()[:length], _PEEK_NOCOPY)[1]
        except OSError:
            return 0

    def pause_reading(self) -> None:
        if self._closing or self._paused:
            return
        self._paused = True
        self._loop.remove_reader(self._fd)

    def resume_reading(self) -> None:
        if self._closing or not self._paused:
            return
        self._paused = False
        self._add_reader()

    def is_reading(self) -> bool:
        return not self._paused and not self._closing

    # ---- writing -------------------------------------------------------------------------
    def write(self, data: bytes | bytearray | memoryview) -> None:
        fast = self._wfast
        if fast is None or fast(None, self, data) is None:
            self._write(data)

    def _write(self, data: bytes | bytearray | memoryview) -> None:
        """:meth:`write`'s reference (the C twin ``send`` does it all for a write into an empty buffer, in one call)."""
        if not data:  # hands nothing to the kernel: not a write to stamp
            return
        self.writes += 1
        self.unplaced_write = None
        if self._eof:
            raise RuntimeError("write() after write_eof()")
        if self._lost:
            self.last_write_mono_ns = _mono()
            return
        if not self._wbuf:
            t0 = self.last_write_mono_ns = _mono()
            try:
                n = self._sock.send(data)
            except (BlockingIOError, InterruptedError):
                n = 0
            except _SOCKET_ERRORS as exc:
                self._fatal(exc)
                return
            self._sent(data, n, t0, _mono())
            return
        # (behind bytes still waiting for the socket: they leave later, when it drains)
        self.last_write_mono_ns = _mono()
        self.last_write_bound_ns = -1
        self._buffer(data)

    def _sent(self, data: bytes | bytearray | memoryview, n: int, t0: int, t1: int) -> None:
        """``send`` took ``n`` bytes of ``data`` between the readings ``t0`` and ``t1`` (the C twin calls this for a
        partial send, or none)."""
        self._tx_off += n
        if n == len(data):
            # the bytes left between the two readings, unless TCP still holds some (tcpi_notsent_bytes: its congestion
            # window full, pacing, the peer's window shut): then they leave later, after t1 by an unknown time (-1).
            # Where the packet log already shows the write's last byte gone by t1 (_left_by), TCP holds none of it:
            # the same answer without asking TCP. The anchor that needs is found at a connection's first write.
            if self._iss1 is None and self.writes == 1 and self._plog is not None:
                self._iss1 = self._tx_anchor()
            queued = not self._left_by(t1) and bool(tcp_notsent(self._sock))
            self.last_write_bound_ns = -1 if queued else t1 - t0
            if queued or t1 - t0 > _SLOW_SEND_NS:
                if self._plog is None:
                    SLOW_SENDS["bounded"] += 1
                elif self.lazy_placement:
                    self.unplaced_write = (t0, t1, self._tx_off, queued, self._tx_off - n)
                else:
                    self._restamp_write(t0, t1, queued, self._tx_off - n)
            return
        self.last_write_bound_ns = -1  # (the rest waits for the socket: the write's last byte leaves later)
        self._loop.add_writer(self._fd, self._on_writable)
        self._buffer(memoryview(data)[n:])

    def _buffer(self, data: bytes | bytearray | memoryview) -> None:
        self._wbuf.append(bytes(data))
        self._wsize += len(data)
        self._maybe_pause_protocol()

    def writelines(self, list_of_data: Any) -> None:
        self.write(b"".join(list_of_data))

    def _on_writable(self) -> None:
        if self._lost:
            return
        buf = self._wbuf
        data = buf[0] if len(buf) == 1 else b"".join(buf)
        try:
            n = self._sock.send(data)
        except (BlockingIOError, InterruptedError):
            return
        except _SOCKET_ERRORS as exc:
            self._loop.remove_writer(self._fd)
            buf.clear()
            self._wsize = 0
            self._fatal(exc)
            return
        self._tx_off += n
        buf.clear()
        self._wsize = len(data) - n
        if self._wsize:
            buf.append(data[n:])
        self._maybe_resume_protocol()
        if self._wsize:
            return
        self._loop.remove_writer(self._fd)
        if self._closing:
            self._connection_lost(None)
        elif self._eof:
            self._shutdown_write()

    def write_eof(self) -> None:
        if self._closing or self._eof:
            return
        self._eof = True
        if not self._wbuf:
            self._shutdown_write()

    def _shutdown_write(self) -> None:
        try:
            self._sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def can_write_eof(self) -> bool:
        return True

    def get_write_buffer_size(self) -> int:
        return self._wsize

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return (self._low, self._high)

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        if high is None:
            high = 64 * 1024 if low is None else 4 * low
        if low is None:
            low = high // 4
        if not high >= low >= 0:
            raise ValueError(f"high ({high!r}) must be >= low ({low!r}) must be >= 0")
        self._high, self._low = high, low
        self._maybe_pause_protocol()

    def _maybe_pause_protocol(self) -> None:
        if self._wsize > self._high and not self._protocol_paused:
            self._protocol_paused = True
            try:
                self._protocol.pause_writing()
            except BaseException:
                log.exception("protocol.pause_writing() failed")

    def _maybe_resume_protocol(self) -> None:
        if self._protocol_paused and self._wsize <= self._low:
            self._protocol_paused = False
            try:
                self._protocol.resume_writing()
            except BaseException:
                log.exception("protocol.resume_writing() failed")

    # ---- closing -------------------------------------------------------------------------
    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        """Stop reading; close once what is buffered has been sent."""
        if self._closing:
            return
        self._closing = True
        self._loop.remove_reader(self._fd)
        if not self._wbuf:
            self._lost = True
            self._loop.call_soon(self._connection_lost, None)

    def abort(self) -> None:
        self._force_close(None)

    def _fatal(self, exc: BaseException, message: str | None = None) -> None:
        if message is not None or not isinstance(exc, OSError):
            log.error("%s", message or "fatal error on a stamped transport", exc_info=exc)
        self._force_close(exc if isinstance(exc, Exception) else None)

    def _force_close(self, exc: BaseException | None) -> None:
        if self._lost:
            return
        if self._wbuf:
            self._wbuf.clear()
            self._wsize = 0
            self._loop.remove_writer(self._fd)
        if not self._closing:
            self._closing = True
            self._loop.remove_reader(self._fd)
        self._lost = True
        self._loop.call_soon(self._connection_lost, exc)

    def _connection_lost(self, exc: BaseException | None) -> None:
        self._lost = True
        if self._plog is not None and self._pkey is not None:
            self._plog.unwatch(self._pkey[3], (self._pkey[0], self._pkey[1]))
            self._plog = None
        try:
            self._protocol.connection_lost(exc)
        finally:
            self._sock.close()
            self._protocol = None  # type: ignore[assignment]
            server, self._server = self._server, None
            if server is not None:
                server._detach(self)

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._protocol

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._protocol = protocol  # type: ignore[assignment]

    def __repr__(self) -> str:
        state = "closed" if self._lost else "closing" if self._closing else "open"
        return f"<KernelStampTransport fd={self._fd} {state} peer={self._extra.get('peername')}>"


def connect(
    loop: asyncio.AbstractEventLoop, sock: socket.socket, protocol_factory: Callable[[], asyncio.Protocol]
) -> tuple[KernelStampTransport, asyncio.Protocol]:
    """Wrap a connected TCP socket (the caller connected it) in a stamped transport."""
    protocol = protocol_factory()
    transport = KernelStampTransport(loop, sock, protocol)
    transport._start()
    return transport, protocol


class KernelStampServer(asyncio.AbstractServer):
    """Listening sockets whose accepted connections get an :class:`KernelStampTransport`."""

    def __init__(self, loop: asyncio.AbstractEventLoop, sockets: list[socket.socket], protocol_factory: Callable[[], asyncio.Protocol], backlog: int) -> None:
        self._loop = loop
        self._sockets = sockets
        self._factory = protocol_factory
        self._backlog = backlog
        self._serving = False
        self._transports: set[KernelStampTransport] = set()
        self._closed = asyncio.Event()

    @property
    def sockets(self) -> tuple[socket.socket, ...]:
        return tuple(self._sockets)

    def _attach(self, transport: KernelStampTransport) -> None:
        self._transports.add(transport)

    def _detach(self, transport: KernelStampTransport) -> None:
        self._transports.discard(transport)

    async def start_serving(self) -> None:
        if self._serving or self._closed.is_set():
            return
        self._serving = True
        for s in self._sockets:
            self._loop.add_reader(s.fileno(), self._on_accept, s)

    def _on_accept(self, lsock: socket.socket) -> None:
        for _ in range(self._backlog):
            try:
                conn, _addr = lsock.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return
            except OSError as exc:
                # out of file descriptors or buffers: stop accepting for a second instead of spinning
                log.error("accept() on %s failed (%s); accepting again in 1 s", lsock.getsockname(), exc)
                self._loop.remove_reader(lsock.fileno())
                self._loop.call_later(1.0, self._resume_accept, lsock)
                return
            try:
                protocol = self._factory()
                KernelStampTransport(self._loop, conn, protocol, self)._start()
            except Exception:
                log.exception("could not set up an accepted connection")
                conn.close()

    def _resume_accept(self, lsock: socket.socket) -> None:
        if self._serving and lsock.fileno() >= 0:
            self._loop.add_reader(lsock.fileno(), self._on_accept, lsock)

    def is_serving(self) -> bool:
        return self._serving

    def close(self) -> None:
        """Stop listening; open connections stay (their protocols close them)."""
        if self._closed.is_set():
            return
        for s in self._sockets:
            if self._serving:
                self._loop.remove_reader(s.fileno())
            s.close()
        self._serving = False
        self._closed.set()

    def close_clients(self) -> None:
        for tr in list(self._transports):
            tr.close()

    def abort_clients(self) -> None:
        for tr in list(self._transports):
            tr.abort()

    async def wait_closed(self) -> None:
        await self._closed.wait()

    async def serve_forever(self) -> None:
        await self.start_serving()
        await asyncio.Future()

    def get_loop(self) -> asyncio.AbstractEventLoop:
        return self._loop


async def start_server(
    protocol_factory: Callable[[], asyncio.Protocol],
    host: str | None,
    port: int,
    *,
    backlog: int = 128,
    reuse_address: bool | None = None,
    reuse_port: bool | None = None,
) -> KernelStampServer:
    """Listen on ``host:port`` (every address ``host`` resolves to; all interfaces for None or
    ``""``), like ``loop.create_server``, with stamped transports for accepted connections."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    seen: set[tuple[Any, ...]] = set()
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, _canon, addr in infos:
            if (family, addr) in seen:
                continue
            seen.add((family, addr))
            s = socket.socket(family, kind, proto)
            sockets.append(s)
            if reuse_address if reuse_address is not None else os.name == "posix":
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if reuse_port:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            if family == socket.AF_INET6 and hasattr(socket, "IPPROTO_IPV6"):
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                s.bind(addr)
            except OSError as exc:
                raise OSError(exc.errno, f"error while attempting to bind on address {addr!r}: {exc.strerror}") from None
            # on the listening socket: accepted sockets inherit it, so the bytes that arrive before
            # the loop gets to accept() are stamped too
            s.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPING, RX_FLAGS)
            s.listen(backlog)
            s.setblocking(False)
    except BaseException:
        for s in sockets:
            s.close()
        raise
    server = KernelStampServer(loop, sockets, protocol_factory, backlog)
    await server.start_serving()
    return server
