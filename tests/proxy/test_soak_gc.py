"""The tap's garbage-collector policy (proxy/cli.py ``tune_gc``): what a full collection survives is frozen out of
later ones, which is sound only because a stream's objects are freed by reference counting when it ends. Both are
checked here: SSE streams through a real tap on 127.0.0.1 with the collector off leave no object of theirs behind,
and in a process with the tap's settings a full collection's survivors are frozen (not with DELTATAP_GC_FREEZE=0)."""

from __future__ import annotations

import asyncio
import collections
import gc
import json
import os
import subprocess
import sys

import pytest

N_STREAMS = 60
SSE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


async def _sse_engine() -> tuple[asyncio.AbstractServer, int]:
    """Answers each request head with an SSE stream of three chat chunks and the end of the body."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            await reader.readexactly(2)  # the body ("{}")
            writer.write(SSE_HEAD)
            for i in range(3):
                writer.write(_chunk(b'data: {"object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"%d"}}]}\n\n' % i))
                await writer.drain()
                await asyncio.sleep(0.005)
            writer.write(_chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def _stream(port: int) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: 2\r\n"
                 b"Connection: close\r\n\r\n{}")
    data = await asyncio.wait_for(reader.read(-1), 10)
    writer.close()
    return data


def _ours() -> collections.Counter:
    """Tracked objects of deltatap's own classes, by class."""
    out: collections.Counter = collections.Counter()
    for o in gc.get_objects():
        module = type(o).__dict__.get("__module__")
        if isinstance(module, str) and module.startswith("deltatap."):
            out[type(o).__qualname__] += 1
    return out


async def test_a_finished_stream_leaves_nothing_for_the_collector(make_tap):
    server, port = await _sse_engine()
    try:
        tap = await make_tap(f"http://127.0.0.1:{port}", link="edge")
        assert (await _stream(tap.port)).endswith(b"0\r\n\r\n")  # (warm: first-use caches are not per stream)
        await asyncio.sleep(0.2)
        gc.collect()
        before = _ours()
        gc.disable()
        try:
            for start in range(0, N_STREAMS, 20):
                answers = await asyncio.gather(*(_stream(tap.port) for _ in range(20)))
                assert all(a.startswith(b"HTTP/1.1 200") and a.endswith(b"0\r\n\r\n") and a.count(b"data: ") == 4 for a in answers)
            for _ in range(100):  # (the tap ends its side of each stream a loop turn or two after the client's)
                await asyncio.sleep(0.02)
                if tap.tap.in_flight == 0:
                    break
            await asyncio.sleep(0.3)
            alive = _ours()
            gc.collect()  # (still disabled: only this collection runs) what it frees was waiting for it
            freed = alive - _ours()
        finally:
            gc.enable()
        # what one stream holds (transports, protocols, readers, observers, records) went with reference counting:
        # a full collection after the streams finds none of it (the span records are alive: queued for export)
        assert sum((alive - before).values()) >= N_STREAMS  # (the census sees the streams' objects that are still held)
        assert not freed, f"objects of finished streams that only the garbage collector freed: {dict(freed)}"
    finally:
        server.close()
        await server.wait_closed()


_CHILD = r"""
import gc, json, os, sys
from deltatap.proxy.cli import tune_gc
tune_gc()
frozen0 = gc.get_freeze_count()
keep = [[i] for i in range(50_000)]  # long-lived containers, as a tap's streams are
gc.collect()
print(json.dumps({"frozen_after_startup": frozen0, "frozen_after_full": gc.get_freeze_count(), "gen2_left": len(gc.get_objects(2))}))
"""


@pytest.mark.parametrize("freeze", ["1", "0"])
def test_a_full_collection_freezes_what_survived_it(freeze):
    env = dict(os.environ, DELTATAP_GC_FREEZE=freeze)
    out = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    if freeze == "1":
        assert r["frozen_after_startup"] > 1000  # the start-up heap (settle)
        assert r["frozen_after_full"] >= r["frozen_after_startup"] + 50_000  # and the survivors of the full collection
        assert r["gen2_left"] < 1000  # a later full collection scans only what came after
    else:
        assert r["frozen_after_startup"] == 0 and r["frozen_after_full"] == 0
        assert r["gen2_left"] >= 50_000
