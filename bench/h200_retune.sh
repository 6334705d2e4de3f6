#!/usr/bin/env bash
# One device call after a kernel change: the GPU tests in $TESTS, then
# `opgen tune $TUNE_SPECS` at the bench's five shapes for the M values in
# $TUNE_MS into a copy of the shipped DB ($OUT/tuned_h200.json), then, with
# T_BENCH > 0, the full `opgen bench` with that DB. Each step under its own
# limit (s): T_TEST, T_TUNE, T_BENCH. Files in $OUT: pytest_gpu.txt,
# gpu_correctness.json, tune.txt, tuned_h200.json, bench.json, bench.md,
# speedup.png, floor.png.
set -u
OUT=${OUT:-/tmp/opgen_out}; mkdir -p "$OUT"
export OPGEN_CACHE_DIR=/tmp/opgen_cache PYTHONUNBUFFERED=1
SHAPES=8192x8192,4096x4096,28672x8192,8192x28672,14336x57344
DB="$OUT/tuned_h200.json"
python3 -m pip install --no-deps --no-build-isolation -q -e . > /tmp/opgen_install.log 2>&1 || tail -5 /tmp/opgen_install.log
[ -f "$DB" ] || cp opgen/data/tuned_h200.json "$DB"
if [ -n "${TESTS:-}" ]; then
  OPGEN_GPU_SHAPES=square OPGEN_RESULTS="$OUT/gpu_correctness.json" timeout -s INT -k 10 "${T_TEST:-120}" \
    python3 -m pytest -q -p no:cacheprovider $TESTS > "$OUT/pytest_gpu.txt" 2>&1
  tail -1 "$OUT/pytest_gpu.txt"
fi
if [ -n "${TUNE_SPECS:-}" ]; then
  timeout -s INT -k 10 "${T_TUNE:-240}" python3 -m opgen tune $TUNE_SPECS --shapes "$SHAPES" \
    --M "${TUNE_MS:-16,32,64,128,256}" --budget-ms "${BUDGET_MS:-5}" --db "$DB" > "$OUT/tune.txt" 2>&1
  echo "tune rc=$?"; grep -E "^total|^stored" "$OUT/tune.txt" | tail -3
fi
if [ "${T_BENCH:-0}" -gt 0 ]; then
  (cd "$OUT" && timeout -s INT -k 10 "$T_BENCH" python3 -m opgen.bench --db "$DB" --shapes "$SHAPES" --out "$OUT" \
    > /tmp/opgen_bench_log.txt 2>&1; echo "bench rc=$?"; tail -3 /tmp/opgen_bench_log.txt)
  grep -A40 -i "targets" "$OUT/bench.md" | head -45
fi
exit 0
