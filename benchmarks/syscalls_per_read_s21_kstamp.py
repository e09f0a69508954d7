"""System calls per read of the stamped transport's C reader callback, for a source tree: 50 one-segment reads, then
N reads of BURST events each (benchmarks/tap_cpu_handler.py's loopback pair and sender), to run under ``strace -c``
(needs CAP_NET_RAW for the packet log, and the tree's built extensions):

    strace -f -c -e trace=getsockopt,recvmsg -o OUT .venv/bin/python benchmarks/syscalls_per_read_s21_kstamp.py TREE BURST N
"""
import sys
sys.path.insert(0, sys.argv[1])
sys.path.insert(0, sys.argv[1] + "/benchmarks")
import tap_cpu_handler as h
from deltatap.net import kstamp
burst, n = int(sys.argv[2]), int(sys.argv[3])
c, s, tr, p = h._pair()
h.one_round(kstamp._readable, c, s, tr, 50, 1)
h.one_round(kstamp._readable, c, s, tr, n, burst)
print(kstamp.__file__, "reads", p.reads, "cuts", p.cuts, file=sys.stderr)
