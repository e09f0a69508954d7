#!/bin/bash
# benchmarks/tap_idle_s25_selfreport.py (b2b vs sleep30) off, on, off, on: the same conditions with two SCHED_IDLE spinners keeping both CPUs out of idle
cd "$(dirname "$0")/.." && OUT=${1:-/tmp/s25/selfreport} && mkdir -p "$OUT"
.venv/bin/python benchmarks/tap_idle_s25_selfreport.py --rounds 6 --block 20 --conds b2b,sleep30 --out $OUT/spin_off_1.json > $OUT/spin_off_1.log 2>&1
chrt -i 0 python3 -c 'while 1: pass' & S1=$!
chrt -i 0 python3 -c 'while 1: pass' & S2=$!
.venv/bin/python benchmarks/tap_idle_s25_selfreport.py --rounds 6 --block 20 --conds b2b,sleep30 --out $OUT/spin_on_1.json > $OUT/spin_on_1.log 2>&1
kill $S1 $S2
.venv/bin/python benchmarks/tap_idle_s25_selfreport.py --rounds 6 --block 20 --conds b2b,sleep30 --out $OUT/spin_off_2.json > $OUT/spin_off_2.log 2>&1
chrt -i 0 python3 -c 'while 1: pass' & S1=$!
chrt -i 0 python3 -c 'while 1: pass' & S2=$!
.venv/bin/python benchmarks/tap_idle_s25_selfreport.py --rounds 6 --block 20 --conds b2b,sleep30 --out $OUT/spin_on_2.json > $OUT/spin_on_2.log 2>&1
kill $S1 $S2
echo done
