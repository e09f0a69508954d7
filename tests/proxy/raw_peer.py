"""Raw TCP peers for the transparency tests: no HTTP library on either side, only bytes on 127.0.0.1.

:class:`RawUpstream` records every byte each connection brings and answers with a :class:`Script` the test
gives it (wait for the request head, for N body bytes, send bytes, pause, then keep the connection, close it,
half-close it or reset it). The only thing it knows about HTTP is where a head ends (the first CRLF CRLF):
that is when a script starts. :func:`raw_exchange` is the client: it sends scripted bytes (in pieces, with
pauses, optionally ``SHUT_WR`` after) and records every byte it gets back and how the connection ended.

Both run on whatever asyncio loop calls them; nothing is left behind after :meth:`RawUpstream.close` and the
end of :func:`raw_exchange` (every socket is closed or aborted there).
"""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field

HEAD_END = b"\r\n\r\n"


# ---- the upstream's script ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Head:
    """Wait until the request head (through the first CRLF CRLF) is in."""


@dataclass(frozen=True)
class Body:
    """Wait until ``n`` bytes after the head are in; after ``wait_s`` go on anyway (``Served.short`` says so)."""

    n: int
    wait_s: float = 2.0


@dataclass(frozen=True)
class Send:
    data: bytes


@dataclass(frozen=True)
class Pause:
    s: float


@dataclass(frozen=True)
class End:
    """``keep``: wait for the next request on this connection; ``close``: FIN both ways; ``shut_wr``: FIN
    from our side, keep reading until the peer closes; ``rst``: SO_LINGER 0 and close, i.e. an RST."""

    how: str = "keep"


Step = Head | Body | Send | Pause | End
Script = Sequence[Step]


def reply(*writes: bytes, body: int = 0, end: str = "keep", pause_s: float = 0.0, wait_s: float = 2.0) -> list[Step]:
    """The common script: take the head and ``body`` bytes, send ``writes`` (``pause_s`` apart), then ``end``."""
    steps: list[Step] = [Head()]
    if body:
        steps.append(Body(body, wait_s))
    for i, w in enumerate(writes):
        if i and pause_s:
            steps.append(Pause(pause_s))
        steps.append(Send(w))
    steps.append(End(end))
    return steps


@dataclass
class Served:
    """One request the upstream answered: the bytes it had consumed when it answered (head + body it waited
    for, or what came before ``Body.wait_s`` ran out: ``short``)."""

    conn: int
    consumed: bytes = b""
    short: bool = False


@dataclass
class Conn:
    received: bytearray = field(default_factory=bytearray)
    eof: bool = False  # the peer half- or fully closed its side
    reset: bool = False  # the peer reset the connection


class RawUpstream:
    """A raw HTTP/1.1 "server" on 127.0.0.1 that answers from the script set with :meth:`expect`.

    ``history=False`` (long runs): each connection's bytes and the served list are not kept, and :meth:`expect`
    forgets the bytes before it; only :meth:`since` the last mark is there."""

    def __init__(self, history: bool = True) -> None:
        self.history = history
        self.conns: list[Conn] = []
        self.log = bytearray()  # every byte from every connection, in arrival order
        self.served: list[Served] = []
        self.unexpected = 0  # heads that came with no script armed
        self._script: Script | None = None
        self._server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self.port = 0

    async def start(self) -> RawUpstream:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, limit=1 << 22)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def expect(self, script: Script) -> int:
        """Arm ``script`` for the next request head (replacing any armed one); returns a mark for :meth:`since`."""
        self._script = list(script)
        if not self.history:
            self.log.clear()
        return len(self.log)

    def since(self, mark: int) -> bytes:
        return bytes(self.log[mark:])

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for w in list(self._writers):
            w.transport.abort()  # every read in a connection's task ends: the task returns on its own
        if self._tasks:
            _, late = await asyncio.wait(list(self._tasks), timeout=2)
            for t in late:  # one still sleeping in a script's Pause
                t.cancel()
            await asyncio.gather(*late, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    # ---- one connection ----------------------------------------------------------------------------
    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._writers.add(writer)
        conn = Conn()
        if self.history:
            self.conns.append(conn)
        index = len(self.conns) - 1
        pending = bytearray()

        async def more(timeout: float | None = None) -> bool:
            if conn.eof:
                return False
            try:
                data = await asyncio.wait_for(reader.read(1 << 16), timeout)
            except asyncio.TimeoutError:
                return True
            except ConnectionError:
                conn.reset = conn.eof = True
                return False
            if not data:
                conn.eof = True
                return False
            if self.history:
                conn.received += data
            self.log += data
            pending.extend(data)
            return True

        try:
            while True:
                while HEAD_END not in pending:
                    if not await more():
                        return
                script, self._script = self._script, None
                if script is None:
                    self.unexpected += 1
                    return
                head_len = pending.index(HEAD_END) + len(HEAD_END)
                served = Served(index)
                if self.history:
                    self.served.append(served)
                taken = head_len
                end = "keep"
                for step in script:
                    if isinstance(step, Head):
                        continue
                    if isinstance(step, Body):
                        deadline = asyncio.get_running_loop().time() + step.wait_s
                        while len(pending) < head_len + step.n:
                            left = deadline - asyncio.get_running_loop().time()
                            if left <= 0 or not await more(left):
                                served.short = len(pending) < head_len + step.n
                                break
                        taken = min(len(pending), head_len + step.n)
                    elif isinstance(step, Send):
                        writer.write(step.data)
                        await writer.drain()
                    elif isinstance(step, Pause):
                        await asyncio.sleep(step.s)
                    elif isinstance(step, End):
                        end = step.how
                served.consumed = bytes(pending[:taken])
                del pending[:taken]
                if end == "keep":
                    continue
                if end == "rst":
                    _linger0(writer)
                    writer.transport.abort()
                    return
                if end == "shut_wr":
                    if writer.can_write_eof():
                        writer.write_eof()
                    while await more():
                        pass
                return
        except ConnectionError:
            conn.reset = True
        finally:
            self._writers.discard(writer)
            if not writer.transport.is_closing():
                writer.close()
            self._tasks.discard(task)


def _linger0(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None and sock.fileno() >= 0:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


# ---- the client --------------------------------------------------------------------------------------
@dataclass
class ClientResult:
    received: bytes
    end: str  # "fin" | "rst" | "open" (neither seen when the client stopped waiting)
    # with ``late_s``: what still came after ``timeout_s`` ran out (a stall, not a loss) and how it ended then
    late: bytes = b""
    late_end: str = ""


async def raw_exchange(
    port: int,
    pieces: Sequence[bytes],
    *,
    pause_s: float = 0.0,
    shut_wr: bool = False,
    expect: int | None = None,
    settle_s: float = 0.02,
    timeout_s: float = 3.0,
    late_s: float = 0.0,
    connect_timeout_s: float = 10.0,
) -> ClientResult:
    """Connect to 127.0.0.1:``port``, send ``pieces`` (``pause_s`` apart), optionally ``SHUT_WR``, and read.

    Reading stops at FIN or RST, at ``timeout_s`` after the last piece went out, or — when ``expect`` is given —
    once ``expect`` bytes are in and nothing more came for ``settle_s`` (the connection is then ``open``). If it
    stopped at ``timeout_s``, it reads on for up to ``late_s`` into ``late`` / ``late_end``."""
    loop = asyncio.get_running_loop()
    reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port, limit=1 << 22), connect_timeout_s)

    async def read(into: bytearray, until: float, settle: bool) -> str:
        """Read into ``into`` until ``until``: "fin", "rst", "settled" or "timeout"."""
        while True:
            left = until - loop.time()
            if left <= 0:
                return "timeout"
            settled = settle and expect is not None and len(got) + len(late) >= expect
            try:
                data = await asyncio.wait_for(reader.read(1 << 16), min(left, settle_s) if settled else left)
            except asyncio.TimeoutError:
                if settled:
                    return "settled"
                continue
            except ConnectionError:
                return "rst"
            if not data:
                return "fin"
            into += data

    got, late = bytearray(), bytearray()
    try:
        try:
            for i, piece in enumerate(pieces):
                if i and pause_s:
                    await asyncio.sleep(pause_s)
                if writer.transport.is_closing():
                    break
                writer.write(piece)
                await writer.drain()
            if shut_wr and not writer.transport.is_closing():
                writer.write_eof()
        except (ConnectionError, RuntimeError):  # the peer closed or reset while we sent: read what it said
            pass
        why = await read(got, loop.time() + timeout_s, settle=True)
        end = why if why in ("fin", "rst") else "open"
        late_end = ""
        if why == "timeout" and late_s > 0:
            why = await read(late, loop.time() + late_s, settle=True)
            late_end = why if why in ("fin", "rst") else "open"
        return ClientResult(bytes(got), end, bytes(late), late_end)
    finally:
        _linger0(writer)  # whatever the ending, leave no TIME_WAIT or half-open socket behind
        writer.transport.abort()
