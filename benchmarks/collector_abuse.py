"""The collector's RSS under oversized OTLP bodies and decompression bombs (issue 19).

    .venv/bin/python benchmarks/collector_abuse.py [--oversized 20] [--bombs 20] [--bomb-mib 1024] [--invalid 10] [--grpc-bombs 10]

Starts ``deltatap collect`` as a child process (its own garbage-collector settings, ``tune_gc``), warms it with
valid exports over OTLP/HTTP (gzip) and OTLP/gRPC, reads its RSS from /proc, then sends, one after another:

* ``--oversized`` protobuf bodies of 64 MiB + 1 MiB (the limit plus one MiB), half with a ``Content-Length``
  (refused before a byte is read), half chunked (read until the limit is crossed);
* ``--bombs`` gzip bodies that inflate to ``--bomb-mib`` MiB of zeros (level 1: 4.7 MB for 1 GiB, the
  probe's bomb), over OTLP/HTTP;
* ``--invalid`` gzip bodies that inflate to 60 MiB of zeros (under the limit, not protobuf: 400);
* ``--grpc-bombs`` gzip-compressed gRPC messages of 80 MiB (gRPC core inflates them and checks its
  max receive message length, 64 MiB);

and valid exports again. Each answer (status, time) and the RSS after each request are recorded; a
traceback in the child's log is counted. Writes benchmarks/results/collector_abuse.json.
tests/collector/test_receiver_abuse.py runs the same :func:`measure` with the same counts and asserts the
RSS growth bound.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import os
import platform
import socket
import struct
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import aiohttp  # noqa: E402
import grpc  # noqa: E402

from benchmarks.collector_throughput import build_exports  # noqa: E402
from deltatap.collector.bodies import MAX_BODY  # noqa: E402

DELTATAP = [sys.executable, "-m", "deltatap.app.cli"]
EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
MIB = 1024 * 1024
PROTOBUF = {"Content-Type": "application/x-protobuf"}


def gzip_bomb(inflated_mib: int, level: int = 1) -> bytes:
    """A gzip body that inflates to ``inflated_mib`` MiB of zeros, built in well under a second: one MiB of zeros
    deflated and ended with a full flush (byte-aligned, no back-references across it) repeated, then an empty
    final block and the trailer (CRC-32 and size mod 2**32)."""
    zeros = bytes(MIB)
    c = zlib.compressobj(level, zlib.DEFLATED, -zlib.MAX_WBITS)
    block = c.compress(zeros) + c.flush(zlib.Z_FULL_FLUSH)
    crc = 0
    for _ in range(inflated_mib):
        crc = zlib.crc32(zeros, crc)
    header = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"
    return header + block * inflated_mib + b"\x03\x00" + struct.pack("<II", crc, (inflated_mib * MIB) & 0xFFFFFFFF)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mib(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of ``pid`` in MiB: now and the peak."""
    now = peak = 0.0
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                now = int(line.split()[1]) / 1024
            elif line.startswith("VmHWM:"):
                peak = int(line.split()[1]) / 1024
    return now, peak


def reset_peak(pid: int) -> None:
    """Start VmHWM again from the current RSS (``clear_refs`` 5), so each phase has its own peak."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as fh:
            fh.write("5")
    except OSError:
        pass


async def _chunks(total: int, size: int = MIB):
    piece = bytes(size)
    sent = 0
    while sent < total:
        n = min(size, total - sent)
        yield piece if n == size else piece[:n]
        sent += n


async def _post(s: aiohttp.ClientSession, url: str, data, headers: dict) -> dict:
    t = time.monotonic()
    try:
        async with s.post(url, data=data, headers=headers) as r:
            body = await r.read()
            return {"status": r.status, "s": round(time.monotonic() - t, 3), "body": body}
    except aiohttp.ClientError as exc:  # recorded, not raised: the figure says what happened
        return {"status": None, "s": round(time.monotonic() - t, 3), "error": f"{type(exc).__name__}: {exc}"}


async def _grpc_export(endpoint: str, message: bytes, compress: bool) -> dict:
    t = time.monotonic()
    comp = grpc.Compression.Gzip if compress else grpc.Compression.NoCompression
    async with grpc.aio.insecure_channel(endpoint, compression=comp, options=[("grpc.max_send_message_length", -1)]) as ch:
        call = ch.unary_unary(EXPORT, request_serializer=lambda b: b, response_deserializer=lambda b: b)
        try:
            await call(message, timeout=60)
            code, details = "OK", ""
        except grpc.aio.AioRpcError as exc:
            code, details = exc.code().name, exc.details() or ""
    return {"status": code, "details": details, "s": round(time.monotonic() - t, 3)}


async def measure(oversized: int = 20, bombs: int = 20, bomb_mib: int = 1024, invalid: int = 10, grpc_bombs: int = 10, timeout_s: float = 240.0,
                  workdir: Path | None = None) -> dict:
    """Run the whole sequence against a fresh ``deltatap collect``; the figures, as :data:`main` writes them."""
    work = Path(workdir or tempfile.mkdtemp(prefix="deltatap-abuse-"))
    http_port, grpc_port = free_port(), free_port()
    log_path = work / "collect.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([*DELTATAP, "collect", "--otlp-grpc", f"127.0.0.1:{grpc_port}", "--otlp-http", f"127.0.0.1:{http_port}",
                                 "--metrics", "none", "--out", str(work / "out"), "--grace-s", "0.2", "--rows-format", "jsonl"],
                                stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        return await asyncio.wait_for(_sequence(proc, http_port, grpc_port, oversized, bombs, bomb_mib, invalid, grpc_bombs, log_path), timeout_s)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


async def _sequence(proc: subprocess.Popen, http_port: int, grpc_port: int, oversized: int, bombs: int, bomb_mib: int, invalid: int, grpc_bombs: int,
                    log_path: Path) -> dict:
    base = f"http://127.0.0.1:{http_port}"
    url = base + "/v1/traces"
    grpc_endpoint = f"127.0.0.1:{grpc_port}"
    valid = build_exports(200, 50, with_client=True)  # 4 exports of 50 requests, 200 spans each
    bomb = gzip_bomb(bomb_mib)
    over = MAX_BODY + MIB
    events: list[dict] = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as s:
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"deltatap collect exited with {proc.returncode}: {log_path.read_text()[-2000:]}")
            try:
                async with s.get(base + "/healthz") as r:
                    if r.status == 200:
                        break
            except aiohttp.ClientError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("deltatap collect did not answer /healthz within 30 s")
            await asyncio.sleep(0.1)

        async def valid_round(phase: str) -> list:
            out = []
            for body in valid:
                r = await _post(s, url, gzip.compress(body), {**PROTOBUF, "Content-Encoding": "gzip"})
                out.append(r["status"])
            g = await _grpc_export(grpc_endpoint, valid[0], compress=True)
            out.append(g["status"])
            events.append({"phase": phase, "statuses": out, "rss_mib": rss_mib(proc.pid)[0]})
            return out

        await valid_round("warm-up")
        await valid_round("warm-up")
        await asyncio.sleep(0.3)
        rss_before, _ = rss_mib(proc.pid)
        reset_peak(proc.pid)

        for i in range(oversized):
            chunked = i % 2 == 1
            r = await _post(s, url, _chunks(over) if chunked else bytes(over), PROTOBUF)
            events.append({"phase": "oversized-chunked" if chunked else "oversized", **_brief(r), "rss_mib": rss_mib(proc.pid)[0]})
        rss_after_oversized, peak_oversized = rss_mib(proc.pid)
        reset_peak(proc.pid)

        for _ in range(bombs):
            r = await _post(s, url, bomb, {**PROTOBUF, "Content-Encoding": "gzip"})
            events.append({"phase": "bomb", **_brief(r), "rss_mib": rss_mib(proc.pid)[0]})
        rss_after_bombs, peak_bombs = rss_mib(proc.pid)
        reset_peak(proc.pid)

        not_protobuf = gzip_bomb(60)
        for _ in range(invalid):
            r = await _post(s, url, not_protobuf, {**PROTOBUF, "Content-Encoding": "gzip"})
            events.append({"phase": "invalid", **_brief(r), "rss_mib": rss_mib(proc.pid)[0]})
        rss_after_invalid, peak_invalid = rss_mib(proc.pid)
        reset_peak(proc.pid)

        if grpc_bombs:
            big = bytes(80 * MIB)
            for _ in range(grpc_bombs):
                g = await _grpc_export(grpc_endpoint, big, compress=True)
                events.append({"phase": "grpc-bomb", **g, "rss_mib": rss_mib(proc.pid)[0]})
            del big
        peak_grpc = rss_mib(proc.pid)[1]
        after_valid = await valid_round("after")
        await asyncio.sleep(0.3)
        rss_after, _ = rss_mib(proc.pid)

    log_text = log_path.read_text(errors="replace")
    refused = [e for e in events if e["phase"] not in ("warm-up", "after")]
    return {
        "bomb_bytes": len(bomb), "bomb_inflated_mib": bomb_mib, "oversized_bytes": over, "limit_bytes": MAX_BODY,
        "oversized": oversized, "bombs": bombs, "invalid": invalid, "grpc_bombs": grpc_bombs,
        "rss_before_mib": round(rss_before, 1), "rss_after_oversized_mib": round(rss_after_oversized, 1),
        "rss_after_bombs_mib": round(rss_after_bombs, 1), "rss_after_invalid_mib": round(rss_after_invalid, 1),
        "rss_after_mib": round(rss_after, 1),
        "rss_peak_mib": {"oversized": round(peak_oversized, 1), "bombs": round(peak_bombs, 1), "invalid": round(peak_invalid, 1), "grpc_bombs": round(peak_grpc, 1)},
        "rss_growth_mib": round(rss_after - rss_before, 1),
        "statuses": sorted({f"{e['phase']}:{e['status']}" for e in refused}),
        "refusal_s_max": max((e["s"] for e in refused), default=None),
        "valid_after": after_valid,
        "tracebacks_in_log": log_text.count("Traceback"),
        "refusal_lines": sorted({line.split("refused ", 1)[1] for line in log_text.splitlines() if "refused (" in line}),
        "events": events,
    }


def _brief(r: dict) -> dict:
    out = {k: v for k, v in r.items() if k != "body"}
    if "body" in r:
        out["body_bytes"] = len(r["body"])
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--oversized", type=int, default=20, help="oversized bodies (default 20)")
    ap.add_argument("--bombs", type=int, default=20, help="gzip bombs over OTLP/HTTP (default 20)")
    ap.add_argument("--bomb-mib", type=int, default=1024, help="what each bomb inflates to, MiB (default 1024)")
    ap.add_argument("--invalid", type=int, default=10, help="gzip bodies inflating to 60 MiB that are not protobuf (default 10)")
    ap.add_argument("--grpc-bombs", type=int, default=10, help="gzip-compressed 80 MiB gRPC messages (default 10)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "collector_abuse.json"))
    args = ap.parse_args()
    load_start = os.getloadavg()
    r = asyncio.run(measure(args.oversized, args.bombs, args.bomb_mib, args.invalid, args.grpc_bombs))
    summary = {k: v for k, v in r.items() if k != "events"}
    print(json.dumps(summary, indent=2), flush=True)
    result = {
        "benchmark": "collector_abuse", "command": "benchmarks/collector_abuse.py " + " ".join(sys.argv[1:]),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        **r,
        "targets": {"rss_growth_mib": 100},
        "met": {"rss_growth": r["rss_growth_mib"] < 100 and r["tracebacks_in_log"] == 0},
        "load_average_at_start": load_start, "load_average_at_end": os.getloadavg(),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
