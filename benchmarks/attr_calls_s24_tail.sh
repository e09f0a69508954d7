#!/bin/bash
# Session 24 (tail): the C-API attribute calls per SSE event in the tap's workers, A/B in one soak run: uprobes on
# libpython's PyObject_GetAttr, PyObject_SetAttr and _PyObject_GenericGetAttrWithDict (counts do not depend on the
# machine's load), counted with `perf stat -p` over 5 s at 10k events/s, 16 s into each tap phase.
#   benchmarks/attr_calls_s24_tail.sh OUTDIR tap,tap-base BASE_TREE
# (needs perf and root; the probes are added once: perf probe -x LIBPYTHON -a PyObject_GetAttr ...; with --tap-workers 2
# the per-event figure is a count / 50,000)
set -e
cd "$(dirname "$0")/.."
OUT=$1; PHASES=${2:-tap,tap-base}; BASE=${3:-/tmp/s24base}; mkdir -p "$OUT"
LIB=$(.venv/bin/python -c 'import sysconfig,os;print(os.path.join(sysconfig.get_config_var("LIBDIR"),sysconfig.get_config_var("INSTSONAME")))')
perf probe -l 2>/dev/null | grep -q "probe_libpython3:PyObject_GetAttr " || \
  perf probe -x "$LIB" -a PyObject_GetAttr -a PyObject_SetAttr -a _PyObject_GenericGetAttrWithDict >/dev/null 2>&1
.venv/bin/python benchmarks/soak.py --tap-workers 2 --streams 10000 --duration 25 --phases "$PHASES" --tree base="$BASE" \
  --out "$OUT/soak.json" > "$OUT/soak.log" 2>&1 &
SP=$!
seen=""; i=0
while kill -0 $SP 2>/dev/null; do
  PARENT=$(pgrep -f "deltatap.app.cli tap --link edge" | head -1 || true)
  if [ -n "$PARENT" ] && [ "$PARENT" != "$seen" ]; then
    seen=$PARENT; i=$((i+1))
    sleep 16
    KIDS=$(pgrep -P "$PARENT" | tr '\n' ',' | sed 's/,$//')
    perf stat -e probe_libpython3:PyObject_GetAttr,probe_libpython3:PyObject_SetAttr,probe_libpython3:_PyObject_GenericGetAttrWithDict \
      -p "$KIDS" -- sleep 5 > "$OUT/phase$i.txt" 2>&1 || true
  fi
  sleep 1
done
for f in "$OUT"/phase*.txt; do echo "$f"; grep probe "$f"; done
