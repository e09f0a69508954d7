"""Helpers for the tap benchmarks, run in their own process: an OTLP/HTTP span sink and a TCP echo.

* ``POST /v1/traces`` on ``--port`` appends each protobuf body to ``--out`` (4-byte big-endian
  length + body) and answers 200 — what a collector costs the tap's exporter, without a collector's
  CPU on the machine. :func:`read_spans` decodes the file afterwards.
* ``--echo-port``: a TCP echo, to time one loopback round trip between two processes (what one
  extra hop in each direction costs a client, outside any proxy's own processing).
"""

from __future__ import annotations

import argparse
import asyncio
import struct
from collections.abc import Iterator
from pathlib import Path

from aiohttp import web

from deltatap.net import aio


def read_spans(path: Path) -> Iterator[dict]:
    """Every span in the sink file as ``{attribute key: value}``."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    if not path.exists():
        return
    data = path.read_bytes()
    pos = 0
    while pos + 4 <= len(data):
        (n,) = struct.unpack_from(">I", data, pos)
        req = ExportTraceServiceRequest.FromString(data[pos + 4 : pos + 4 + n])
        pos += 4 + n
        for rs in req.resource_spans:
            for ss in rs.scope_spans:
                for sp in ss.spans:
                    yield {a.key: getattr(a.value, a.value.WhichOneof("value")) for a in sp.attributes}


class _Echo(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.transport.write(data)  # type: ignore[attr-defined]


async def main(args: argparse.Namespace) -> None:
    out = open(args.out, "ab")  # noqa: SIM115 - closed with the process

    async def traces(request: web.Request) -> web.Response:
        body = await request.read()
        out.write(struct.pack(">I", len(body)) + body)
        out.flush()
        return web.Response(body=b"", content_type="application/x-protobuf")

    app = web.Application(client_max_size=1 << 30)
    app.router.add_post("/v1/traces", traces)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", args.port).start()
    if args.echo_port:
        await asyncio.get_running_loop().create_server(_Echo, "127.0.0.1", args.echo_port)
    print("ready", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--echo-port", type=int, default=0)
    aio.run(main(p.parse_args()))
