"""Session 24 (tail): a leak loop over deltatap.net._pktring's ring_* entry points (session 23 gave them an optional
last argument, ``top``, and ring_release the released word): each called with and without it, and with wrong types
(each must raise), ARGV[1] times in 3 rounds, the process's RSS printed before and after each round (flat: no leak).
Run it under ``PYTHONMALLOC=debug`` too. plog_head (the released word's load) runs in kstamp's read path on sockets:
the soak's flat tap RSS covers it.

    .venv/bin/python benchmarks/pktring_leak_s24_tail.py 200000
"""
import mmap
import struct
import sys

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1]))
from deltatap.net import _pktring as P

def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 // 1024

FR = 256; N = 64
ring = mmap.mmap(-1, FR * N)
mv = memoryview(ring)
hw = mmap.mmap(-1, 4096); hwv = memoryview(hw)[:16]
# fill some frames: status USER(1), snaplen at +8, sec/nsec at 16/20, net at +14, an IPv4/TCP header
pat = bytes(range(12))
for i in range(N // 2):
    o = i * FR
    struct.pack_into("<I", ring, o, 1)
    struct.pack_into("<I", ring, o + 8, 80)
    struct.pack_into("<II", ring, o + 16, 100, i)
    struct.pack_into("<H", ring, o + 14, 80)
    ip = o + 80
    ring[ip] = 0x45
    struct.pack_into(">H", ring, ip + 2, 20 + 20 + 10)
    ring[ip + 12:ip + 24] = pat
    struct.pack_into(">I", ring, ip + 20 + 4, 1000 + 10 * i)
    ring[ip + 20 + 12] = 0x50

calls = [
    lambda: P.ring_newest(mv, 0),
    lambda: P.ring_newest(mv, 0, 40),
    lambda: P.ring_reaches(mv, 0, 10**12, 16),
    lambda: P.ring_reaches(mv, 0, 10**12, 16, 40),
    lambda: P.ring_segments(mv, 0, pat, 990, 64),
    lambda: P.ring_segments(mv, 0, pat, 990, 64, 40),
    lambda: P.ring_newest_segment(mv, 0, pat, 64),
    lambda: P.ring_newest_segment(mv, 0, pat, 64, 40),
    lambda: P.ring_cuts(mv, 0, pat, 1000, 64, 200, 5, 1 << 18),
    lambda: P.ring_cuts(mv, 0, pat, 1000, 64, 200, 5, 1 << 18, 40),
    lambda: P.ring_cuts(mv, 0, pat, 1000, 64, 50, 5, 1 << 18, 40),
    lambda: P.ring_cuts(mv, 0, pat, 5000, 64, 50, 5, 1 << 18),
    lambda: P.ring_release(mv, hwv, 0),
]
bad = [
    lambda: P.ring_newest(mv, 0, "x"),
    lambda: P.ring_newest(b"", 0),
    lambda: P.ring_reaches(mv, 0, 1, 16, "x"),
    lambda: P.ring_segments(mv, 0, pat, 990, 64, "x"),
    lambda: P.ring_segments(mv, 0, b"short", 990, 64, 1),
    lambda: P.ring_newest_segment(mv, 0, pat, 64, None),
    lambda: P.ring_newest_segment(mv, 0, b"short", 64),
    lambda: P.ring_cuts(mv, 0, pat, 1000, 64, 200, 5, 1 << 18, "x"),
    lambda: P.ring_cuts(mv, 0, b"x" * 13, 1000, 64, 200, 5, 1 << 18, 1),
    lambda: P.ring_release(mv, b"\0" * 8, 0),
    lambda: P.ring_release(bytes(FR), hwv, 0),
    lambda: P.ring_release(mv, "x", 0),
]
for c in calls:
    c()
for c in bad:
    try:
        c(); raise SystemExit("no error")
    except (TypeError, ValueError, BufferError):
        pass
n = int(sys.argv[1]) if len(sys.argv) > 1 else 200000
for rnd in range(3):
    r0 = rss()
    for _ in range(n // 10):
        for c in calls:
            c()
        for c in bad:
            try:
                c()
            except (TypeError, ValueError, BufferError):
                pass
    print("round", rnd, "rss KiB", r0, "->", rss(), flush=True)
print(P.ring_segments(mv, 0, pat, 990, 64), P.ring_cuts(mv, 0, pat, 1000, 64, 200, 5, 1 << 18))
