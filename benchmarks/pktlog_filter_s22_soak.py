"""CPU per relayed event of the packet log's range filter, keyed (session 22) vs the bare range (before), in one process.

A tap's shape on loopback, all in this process so that every CPU cycle of the hop - the sends, the receivers' TCP
input that loopback runs inside them, and the packet sockets' filters and ring copies in both - is counted by
``getrusage``: an "engine" socket writes an SSE-sized event (``--size`` bytes) on one of ``--streams`` upstream
connections, the "tap" reads it and writes it on the matching downstream connection (accepted on its listening port),
the "client" reads it. ``--workers`` packet logs (one per tap worker, each its own packet socket and ring) watch the
connections as kstamp does (accepted ones by their listening port, upstream ones by the server's port), each worker
its share. Rounds alternate the two filters (``bare``: the range alone, what the log attached before; ``keyed``);
each round relays ``--events`` events round-robin over the streams. Also reported: frames each ring took per event
(the ring's own count, PACKET_STATISTICS), load-independent.

    .venv/bin/python benchmarks/pktlog_filter_s22_soak.py --out benchmarks/results/pktlog_filter_s22_soak.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import struct
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from deltatap.net import pktstamp  # noqa: E402
from deltatap.net.pktstamp import PacketLog  # noqa: E402

_PACKET_STATISTICS = 6


def _stats(log: PacketLog) -> int:
    """Frames the ring took since the last call (tp_packets; the kernel resets the counters on each read)."""
    packets, _drops = struct.unpack("=II", log._sock.getsockopt(pktstamp._SOL_PACKET, _PACKET_STATISTICS, 8))
    return packets


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--streams", type=int, default=300)
    ap.add_argument("--workers", type=int, default=2, help="packet logs (tap workers); 0: none, the hop without them")
    ap.add_argument("--events", type=int, default=20000, help="events per round")
    ap.add_argument("--rounds", type=int, default=6, help="rounds per filter, alternating")
    ap.add_argument("--size", type=int, default=110)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "pktlog_filter_s22_soak.json"))
    a = ap.parse_args()
    need = 4 * a.streams + 64
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(max(soft, need), hard), hard))
    logs = []
    for _ in range(a.workers):
        s = socket.socket(socket.AF_PACKET, socket.SOCK_DGRAM, socket.htons(pktstamp.ETH_P_ALL))
        s.setblocking(False)
        logs.append(PacketLog(s))
    engine = socket.create_server(("127.0.0.1", 0), backlog=a.streams + 16)
    listen = socket.create_server(("127.0.0.1", 0), backlog=a.streams + 16)
    eport, lport = engine.getsockname()[1], listen.getsockname()[1]
    streams = []  # (engine side, tap upstream, tap downstream, client)
    for i in range(a.streams):
        up = socket.create_connection(("127.0.0.1", eport))
        eng, _ = engine.accept()
        cli = socket.create_connection(("127.0.0.1", lport))
        down, _ = listen.accept()
        for x in (up, eng, cli, down):
            x.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if logs:  # (--workers 0: no packet socket at all, the hop's own cost)
            w = logs[i % a.workers]
            w.watch(up.getsockname()[1], eport)
            w.watch(lport, accepted=True)
        streams.append((eng, up, down, cli))
    assert all(log.span is not None and log._keyed is not None for log in logs), "not in the keyed range mode"
    keyed_prog = {id(log): log._keyed for log in logs}
    event = b"x" * a.size

    def use(mode: str) -> None:
        for log in logs:
            if mode == "bare":
                log._keying = lambda: None  # type: ignore[method-assign]
            else:
                log.__dict__.pop("_keying", None) if hasattr(log, "__dict__") else None
                try:
                    del log._keying
                except AttributeError:
                    pass
            log._attach(log.span)
            assert (log._keyed is None) == (mode == "bare")

    def one_round() -> tuple[float, float]:
        for log in logs:
            _stats(log)
        c0 = _cpu()
        n = len(streams)
        for i in range(a.events):
            eng, up, down, cli = streams[i % n]
            eng.send(event)
            got = up.recv(65536)
            down.send(got)
            cli.recv(65536)
            if i % 512 == 0:
                for log in logs:
                    log.maintain(force=True)
        cpu = _cpu() - c0
        frames = sum(_stats(log) for log in logs)  # (0 without packet logs)
        return cpu / a.events * 1e6, frames / a.events

    res = {"benchmark": "pktlog_filter_s22_soak", "streams": a.streams, "workers": a.workers, "events_per_round": a.events,
           "size": a.size, "loadavg_start": os.getloadavg(), "rounds": []}
    use("keyed")
    one_round()  # (warm-up)
    for r in range(a.rounds):
        for mode in (("bare", "keyed") if r % 2 == 0 else ("keyed", "bare")):
            use(mode)
            us, frames = one_round()
            res["rounds"].append({"mode": mode, "cpu_us_per_event": round(us, 2), "frames_per_event": round(frames, 3)})
            print(f"{mode:6s} {us:6.2f} us/event  {frames:.2f} frames/event", file=sys.stderr)
    for mode in ("bare", "keyed"):
        xs = sorted(x["cpu_us_per_event"] for x in res["rounds"] if x["mode"] == mode)
        fr = [x["frames_per_event"] for x in res["rounds"] if x["mode"] == mode]
        res[mode] = {"cpu_us_per_event_median": xs[len(xs) // 2], "cpu_us_per_event_min": xs[0], "frames_per_event": round(sum(fr) / len(fr), 3)}
    res["loadavg_end"] = os.getloadavg()
    res["keyed_filters"] = [list(map(list, v)) for v in keyed_prog.values()]
    print(json.dumps({k: res[k] for k in ("bare", "keyed")}), file=sys.stderr)
    Path(a.out).write_text(json.dumps(res, indent=2) + "\n")
    for t in streams:
        for x in t:
            x.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
