#!/usr/bin/env bash
# One device call for the decoded-weight TMA GEMM: GPU checks case by case
# (each pytest under its own $T_CASE s limit, so a hang names its case), then
# bench/sweep.py at N = K = 8192 ($T_SPEC s per entry of $SWEEPS,
# "SPEC:M,M:FAMILY", family tma or wgmma: the latter includes tma) and each
# (spec, M)'s best. Files in $OUT: tests.txt,
# c_<case>.json, sweep.jsonl, sweep.txt.
set -u
OUT=${OUT:-/tmp/opgen_out}; mkdir -p "$OUT"
export OPGEN_CACHE_DIR=/tmp/opgen_cache PYTHONUNBUFFERED=1 OPGEN_GPU_SHAPES=square
python3 -m pip install --no-deps --no-build-isolation -q -e . > /dev/null 2>&1
K=tests/runtime/test_kernels_gpu.py
CASES=${CASES:-"test_tma_matches_reference[w4a16_sym_g128-70-264-1152] test_tma_matches_reference[w4a16_sym_g128-300-1032-2176] test_tma_matches_reference[gptq_v2_w4a16_g128-70-264-1152] test_every_candidate[70-w4a16_sym_g128]"}
SWEEPS=${SWEEPS:-"w4a16_sym_g128:64:wgmma w4a16_sym_g128:256:tma"}
t() { for n in "$@"; do
 s=$(date +%s); OPGEN_RESULTS="$OUT/c_${n//[^A-Za-z0-9_-]/_}.json" timeout -s INT -k 5 "${T_CASE:-70}" \
   python3 -m pytest -q -x -p no:cacheprovider "$K::$n" > /tmp/t.txt 2>&1; rc=$?
 echo "$n rc=$rc $(( $(date +%s)-s ))s $(tail -1 /tmp/t.txt)"; grep -E "Error|assert|FAIL" /tmp/t.txt | head -3
done 2>&1 | tee -a "$OUT/tests.txt"; }
t $CASES
for e in $SWEEPS; do IFS=: read -r spec ms fam <<< "$e"
 s=$(date +%s); timeout "${T_SPEC:-150}" python3 bench/sweep.py "$spec" --N 8192 --K 8192 --M "$ms" --only "${fam:-tma}" \
   --budget-ms 3 --out "$OUT/sweep.jsonl" > /tmp/s.txt 2>&1; echo "sweep $e rc=$? $(( $(date +%s)-s ))s"; cat /tmp/s.txt >> "$OUT/sweep.txt"
done
python3 - "$OUT/sweep.jsonl" <<'PY'
import json, sys
best = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    k = (r["spec"], r["M"])
    if r["ok"] and r["us"] and (k not in best or r["us"] < best[k][0]):
        best[k] = (r["us"], r["config"])
for (spec, M), (us, cfg) in sorted(best.items()):
    print(f"{spec:22s} M={M:<5d} {us:8.2f} {cfg}")
PY
[ -n "${CASES2:-}" ] && t $CASES2
exit 0
