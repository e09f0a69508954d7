"""How many backstop timers the deferred accounts make (``deltatap.proxy.relay._Watches._timed``: ``loop.call_at`` /
``call_later`` with it), and how many of them fire, idle or not, per request (issue 15, session 23): N concurrent
clients, PER requests each, through one in-process tap on uvloop to an in-process upstream that answers each request
FIRST ms later with 4 SSE events GAP ms apart. Counts, not times: load-independent. For another tree, put its shim on
PYTHONPATH (``benchmarks/tap_cpu_ab.py``'s ``shim``).

    .venv/bin/python benchmarks/backstop_timers_s23_selfreport.py N PER FIRST_MS GAP_MS    # e.g. 8 50 1 2
"""
import asyncio, sys, json
import uvloop
from deltatap.proxy import TapOptions
from deltatap.proxy.server import start_tap

N, PER, FIRST, GAP = (int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]))
made = {"timers": 0, "fires": 0, "idle_fires": 0}

async def main():
    loop = asyncio.get_running_loop()
    orig_at, orig_later = loop.call_at, loop.call_later
    def wrap(fn):
        def f(when, cb, *a, **k):
            if getattr(cb, "__name__", "") == "_timed":
                made["timers"] += 1
                inner = cb
                def cb2(*aa):
                    made["fires"] += 1
                    w = inner.__self__
                    if not w.accounts:
                        made["idle_fires"] += 1
                    return inner(*aa)
                cb2.__name__ = "_timed_counted"
                return fn(when, cb2, *a, **k)
            return fn(when, cb, *a, **k)
        return f
    loop.call_at, loop.call_later = wrap(orig_at), wrap(orig_later)

    async def upstream(reader, writer):
        try:
            while True:
                await reader.readuntil(b"\r\n\r\n")
                await asyncio.sleep(FIRST / 1e3)
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
                for i in range(4):
                    if i: await asyncio.sleep(GAP / 1e3)
                    ev = b'data: {"choices":[{"delta":{"content":"x"}}]}\n\n'
                    writer.write(b"%x\r\n%s\r\n" % (len(ev), ev))
                writer.write(b"0\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()
    server = await asyncio.start_server(upstream, "127.0.0.1", 0)
    from deltatap.telemetry.tracer import setup_telemetry
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    tel = setup_telemetry("tap", exporter=InMemorySpanExporter())
    tap = await start_tap(TapOptions(upstream=f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", link="fw-engine"), tel)
    async def client():
        r, w = await asyncio.open_connection("127.0.0.1", tap.port)
        for _ in range(PER):
            w.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: e\r\nContent-Length: 2\r\n\r\n{}")
            await r.readuntil(b"0\r\n\r\n")
        w.close()
    await asyncio.gather(*(client() for _ in range(N)))
    await asyncio.sleep(0.1)
    await tap.close(grace_s=1)
    server.close()
    reqs = N * PER
    print(json.dumps({"streams": N, "requests": reqs, **made, "timers_per_request": round(made["timers"] / reqs, 3),
                      "idle_fires_per_request": round(made["idle_fires"] / reqs, 3)}))
uvloop.run(main())
