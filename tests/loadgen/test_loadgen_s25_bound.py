"""Session 25 ("bound"): the load generator's own request write (T_submit, ``client.send``) when its bytes cannot all
leave at once (a 2 MB prompt to a server that reads it only 0.15 s later): the stamp is taken as the write began, and
its bound says how much later the last byte may have left - up to the response head's arrival - never 0; the
interval holds the truth (the last byte left after the server began to read)."""

from __future__ import annotations

import asyncio

from deltatap.core.clock import mono_ns
from deltatap.core.vocab import ClientEvent, Outcome, format_stamp_bounds
from deltatap.loadgen.client import execute, make_session
from deltatap.loadgen.records import RequestRecord
from test_loadgen_h1client import RawServer, target, write_sse


async def test_a_large_prompt_the_server_reads_late_states_its_bound():
    began: list[int] = []

    async def handler(r, w, conn):
        head = await asyncio.wait_for(r.readuntil(b"\r\n\r\n"), 10)
        await asyncio.sleep(0.15)  # the server reads nothing yet: the client's bytes wait in its socket
        began.append(mono_ns())
        length = int(head.lower().split(b"content-length:", 1)[1].split(b"\r\n", 1)[0])
        await asyncio.wait_for(r.readexactly(length), 10)
        await write_sse(w)

    async with RawServer(handler) as srv:
        t = target(f"http://127.0.0.1:{srv.port}")
        pool = make_session(t)
        try:
            rec = RequestRecord(index=0, request_id="r0", trace_id="1" * 32, span_id="2" * 16)
            await execute(pool, t, rec, t.body(None, [], "x" * 2_000_000, 3), t.request_headers(rec, f"00-{'1' * 32}-{'2' * 16}-01"))
        finally:
            await pool.close()
    assert rec.status == Outcome.OK
    b = rec.stamp_bounds[ClientEvent.SEND][1]
    assert b > 0 and rec.written_mono_ns + b >= began[0], (b, (began[0] - rec.written_mono_ns) / 1e6)
    assert "client.send=0/" in format_stamp_bounds(rec.stamp_bounds)  # stated on the client span
