#!/usr/bin/env bash
# Tune shipped specs on this GPU into one DB (the pre-tuned DB we ship is
# written this way):
#   bash bench/tune_shipped.sh DB LOG "8192x8192 4096x4096" spec1 spec2 ...
# Every default M bucket; each (spec, shape) stops after T_SPEC seconds
# (default 120) so one slow run cannot eat a device call. `opgen tune` stores
# a spec's winners in one locked update at its end, so a run cut short
# stores nothing and leaves the DB as it was.
set -u
DB=$1; LOG=$2; SHAPES=$3; shift 3
for shape in $SHAPES; do
  for spec in "$@"; do
    N=${shape%x*}; K=${shape#*x}
    echo "== $spec N=$N K=$K" >> "$LOG"
    timeout "${T_SPEC:-120}" python3 -m opgen tune "$spec" --N "$N" --K "$K" --db "$DB" --quiet >> "$LOG" 2>&1 \
      || echo "!! $spec $shape exited $?" >> "$LOG"
    grep -E "^tuned|NOT tuned" "$LOG" | tail -1 | sed "s/^/$spec $shape: /"
  done
done
