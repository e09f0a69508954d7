"""A small toxiproxy-style fault-injecting TCP proxy (asyncio), for the reliability suite.

:class:`ToxicProxy` listens on a free loopback port and forwards every accepted connection to one upstream, each
direction through a pump that applies the :class:`Toxic` configured for it. The direction names follow
toxiproxy: ``down`` is upstream → client (the response), ``up`` is client → upstream (the request).

Faults (``Toxic.kind``):

* ``latency``: every read is held ``ms`` before it is written on.
* ``bandwidth``: at most ``rate`` bytes per second (written in 10 ms slices).
* ``slicer``: every read is split into writes of ``size`` bytes, ``delay_ms`` apart.
* ``timeout``: after ``after`` bytes, stop forwarding in both directions (reads go on and are discarded, the
  connections stay open); after ``s`` seconds close both sides (FIN). ``s=0``: keep them open until :meth:`close`.
* ``reset``: after ``after`` bytes, reset both connections (``SO_LINGER 0`` then close: an RST each way).
* ``slow_close``: when the source closes, wait ``s`` seconds before passing the close on.
* ``half_open``: after ``after`` bytes the peer is gone without a FIN: nothing more is read or written in either
  direction and nothing is closed until :meth:`close` (the connections look alive to both ends).

Each connection's :class:`Link` records the bytes that crossed each way and whether a side was closed by the
toxic, so a test can see what the fault did. Nothing is left behind after :meth:`ToxicProxy.close`.
"""

from __future__ import annotations

import asyncio
import socket
import struct
from dataclasses import dataclass, field

KINDS = ("latency", "bandwidth", "slicer", "timeout", "reset", "slow_close", "half_open")


@dataclass(frozen=True)
class Toxic:
    kind: str
    direction: str = "down"  # "down": upstream -> client; "up": client -> upstream
    ms: float = 0.0  # latency
    rate: int = 0  # bandwidth, bytes per second
    size: int = 0  # slicer: bytes per write
    delay_ms: float = 0.0  # slicer: pause between writes
    after: int = 0  # timeout / reset / half_open: bytes forwarded in this direction first
    s: float = 0.0  # timeout: close after; slow_close: delay of the close

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown toxic {self.kind!r}; use one of {KINDS}")
        if self.direction not in ("up", "down"):
            raise ValueError("direction is 'up' or 'down'")


def rst(writer: asyncio.StreamWriter) -> None:
    """Close with an RST (SO_LINGER 0), as a crashed or resetting peer does."""
    sock = writer.get_extra_info("socket")
    if sock is not None and sock.fileno() >= 0:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
    writer.transport.abort()


@dataclass
class Link:
    """One proxied connection: bytes forwarded each way and what the toxic did."""

    up_bytes: int = 0
    down_bytes: int = 0
    fault_fired: bool = False
    frozen: bool = False  # timeout / half_open: nothing flows any more
    tasks: list[asyncio.Task] = field(default_factory=list)
    writers: list[asyncio.StreamWriter] = field(default_factory=list)
    done: asyncio.Event = field(default_factory=asyncio.Event)


class ToxicProxy:
    def __init__(self, upstream_host: str, upstream_port: int, toxics: list[Toxic] | tuple[Toxic, ...] = ()):
        self.upstream = (upstream_host, upstream_port)
        self.toxics = {t.direction: t for t in toxics}
        self.links: list[Link] = []
        self._server: asyncio.base_events.Server | None = None
        self._timers: set[asyncio.Task] = set()
        self.port = 0

    async def start(self) -> "ToxicProxy":
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for t in list(self._timers):
            t.cancel()
        for link in self.links:
            for t in link.tasks:
                t.cancel()
            for w in link.writers:
                w.transport.abort()
        await asyncio.gather(*(t for link in self.links for t in link.tasks), *self._timers, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    # ---- one connection ----------------------------------------------------------------------------------
    async def _accept(self, c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter) -> None:
        link = Link()
        self.links.append(link)
        try:
            u_reader, u_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            rst(c_writer)  # nothing listens upstream: the client sees its connection reset
            link.done.set()
            return
        link.writers = [c_writer, u_writer]
        ends = {"up": (c_reader, u_writer), "down": (u_reader, c_writer)}
        link.tasks = [asyncio.create_task(self._pump(link, d, *ends[d])) for d in ("up", "down")]
        await asyncio.gather(*link.tasks, return_exceptions=True)
        if not link.frozen:
            for w in link.writers:
                w.close()
        link.done.set()

    def _count(self, link: Link, direction: str, n: int) -> int:
        if direction == "up":
            link.up_bytes += n
            return link.up_bytes
        link.down_bytes += n
        return link.down_bytes

    async def _pump(self, link: Link, direction: str, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        toxic = self.toxics.get(direction)
        kind = toxic.kind if toxic else None
        try:
            while True:
                data = await src.read(65536)
                if link.frozen:
                    if kind == "half_open":
                        return  # (not reached: a frozen half-open link reads nothing)
                    if not data:
                        return
                    continue  # timeout: read and discard
                if not data:
                    if kind == "slow_close":
                        await asyncio.sleep(toxic.s)
                    if dst.can_write_eof():
                        dst.write_eof()
                    return
                if kind in ("timeout", "reset", "half_open"):
                    sent = link.down_bytes if direction == "down" else link.up_bytes
                    room = max(0, toxic.after - sent)
                    if room < len(data):
                        if room:
                            dst.write(data[:room])
                            self._count(link, direction, room)
                            await dst.drain()
                        await self._fire(link, toxic)
                        if kind == "timeout":
                            continue
                        return
                    dst.write(data)
                elif kind == "latency":
                    await asyncio.sleep(toxic.ms / 1000)
                    dst.write(data)
                elif kind == "bandwidth":
                    step = max(1, toxic.rate // 100)
                    for i in range(0, len(data), step):
                        dst.write(data[i : i + step])
                        await dst.drain()
                        await asyncio.sleep(0.01)
                elif kind == "slicer":
                    for i in range(0, len(data), toxic.size):
                        if i:
                            await asyncio.sleep(toxic.delay_ms / 1000)
                        dst.write(data[i : i + toxic.size])
                        await dst.drain()
                else:
                    dst.write(data)
                self._count(link, direction, len(data))
                await dst.drain()
        except (ConnectionError, OSError):
            # the source reset (or the destination is gone): pass a reset on, as a faithful middlebox would
            for w in link.writers:
                rst(w)

    async def _fire(self, link: Link, toxic: Toxic) -> None:
        link.fault_fired = True
        if toxic.kind == "reset":
            for w in link.writers:
                rst(w)
            for t in link.tasks:
                if t is not asyncio.current_task():
                    t.cancel()
        elif toxic.kind == "half_open":
            link.frozen = True
            for t in link.tasks:  # nothing is read or written any more; the sockets stay open
                if t is not asyncio.current_task():
                    t.cancel()
        elif toxic.kind == "timeout":
            link.frozen = True
            if toxic.s > 0:
                timer = asyncio.create_task(self._close_later(link, toxic.s))
                self._timers.add(timer)
                timer.add_done_callback(self._timers.discard)

    async def _close_later(self, link: Link, s: float) -> None:
        await asyncio.sleep(s)
        for t in link.tasks:
            t.cancel()
        for w in link.writers:
            w.close()
