#!/bin/sh
# Session 26 "fastlane" probe trees: scratch copies of a deltatap source tree (git HEAD of SRC) with the measurement
# prototype benchmarks/fastlane_s26_proto/lane_proto.inc compiled into proxy/_relay.c at LANE_LEVEL 1..5 (see that
# file), each built in place, for soak.py --tree NAME=DIR. Usage: fastlane_s26_trees.sh SRC OUTDIR [LEVEL ...]
# (default levels 1 5). Example (docs/benchmarks.md, Session 26 fastlane):
#   sh benchmarks/fastlane_s26_trees.sh . /tmp/s26/fastlane/probe 1 2 3 4 5
#   cd /tmp && python benchmarks/soak.py --streams 2000 --duration 20 --tap-workers 2 \
#     --phases tap-base,tap-l5,tap-l1,... --tree base=<base tree> --tree l1=/tmp/s26/fastlane/probe/l1 ...
set -e
SRC=$(cd "$1" && pwd); OUT=$2; shift 2
PY=${PYTHON:-$SRC/.venv/bin/python}; [ -x "$PY" ] || PY=/work/main/.venv/bin/python
LEVELS=${*:-1 5}
for L in $LEVELS; do
  T=$OUT/l$L; rm -rf "$T"; mkdir -p "$T"
  git -C "$SRC" archive HEAD | tar x -C "$T"
  { echo "#define LANE_LEVEL $L"; cat "$SRC/benchmarks/fastlane_s26_proto/lane_proto.inc"; } > "$T/proxy/_lane_proto.inc"
  "$PY" - "$T/proxy/_relay.c" <<'PYEOF'
import sys
p = sys.argv[1]; s = open(p).read()
a = "/* one item of _Watches.run: 0, or -1 with an exception (for _fatal) */"
b = "        if (took) return 0;\n    }\n    PyObject *up = it[0], *reader"
assert s.count(a) == 1 and s.count(b) == 1, "proxy/_relay.c changed: update the probe's two hooks"
s = s.replace(a, '#include "_lane_proto.inc"\n' + a).replace(b, b.replace("return 0;", "return lane_take(it[0], it[1]);"))
open(p, "w").write(s)
PYEOF
  (cd "$T" && "$PY" setup.py build_ext --inplace -q >build.log 2>&1) || { tail -20 "$T/build.log"; exit 1; }
  echo "$T"
done
