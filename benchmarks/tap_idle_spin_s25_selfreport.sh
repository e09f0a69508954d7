#!/bin/bash
# idle-CPU vs cold-cache: the same conditions with two SCHED_IDLE spinners keeping both CPUs out of idle
cd /work/main
.venv/bin/python benchmarks/tap_idle_s25_selfreport.py --rounds 6 --block 20 --conds b2b,sleep30 --out /tmp/s25/selfreport/spin_off_1.json > /tmp/s25/selfreport/spin_off_1.log 2>&1
chrt -i 0 python3 -c 'while 1: pass' & S1=$!
chrt -i 0 python3 -c 'while 1: pass' & S2=$!
.venv/bin/python benchmarks/tap_idle_s25_selfreport.py --rounds 6 --block 20 --conds b2b,sleep30 --out /tmp/s25/selfreport/spin_on_1.json > /tmp/s25/selfreport/spin_on_1.log 2>&1
kill $S1 $S2
.venv/bin/python benchmarks/tap_idle_s25_selfreport.py --rounds 6 --block 20 --conds b2b,sleep30 --out /tmp/s25/selfreport/spin_off_2.json > /tmp/s25/selfreport/spin_off_2.log 2>&1
chrt -i 0 python3 -c 'while 1: pass' & S1=$!
chrt -i 0 python3 -c 'while 1: pass' & S2=$!
.venv/bin/python benchmarks/tap_idle_s25_selfreport.py --rounds 6 --block 20 --conds b2b,sleep30 --out /tmp/s25/selfreport/spin_on_2.json > /tmp/s25/selfreport/spin_on_2.log 2>&1
kill $S1 $S2
echo done
