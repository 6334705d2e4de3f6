#!/usr/bin/env bash
# One device call that checks new kernel paths and maps their configs, before
# a full tuning run: the GPU tests named in $TESTS (default: the row/tensor-
# core GEMV, predecode, the shipped specs at square shapes, the ops and the
# tuner's second-process load), then bench/sweep.py over $SWEEPS entries
# "SPEC:M,M:FAMILY" at N = K = 8192. Files in $OUT: gpu_correctness.json,
# pytest_gpu.txt, sweep.jsonl, sweep.txt.
set -u
OUT=${OUT:-/tmp/opgen_out}; mkdir -p "$OUT"
export OPGEN_CACHE_DIR=/tmp/opgen_cache PYTHONUNBUFFERED=1
python3 -m pip install --no-deps --no-build-isolation -q -e . > /tmp/opgen_install.log 2>&1 || tail -5 /tmp/opgen_install.log
K=tests/runtime/test_kernels_gpu.py
TESTS=${TESTS:-"$K::test_every_row_gemv $K::test_predecode_matches_reference $K::test_spec_matches_reference tests/runtime/test_op_gpu.py tests/runtime/test_tuner_gpu.py"}
OPGEN_GPU_SHAPES=square OPGEN_RESULTS="$OUT/gpu_correctness.json" timeout -s INT -k 15 "${T_TEST:-240}" \
  python3 -m pytest -q -p no:cacheprovider $TESTS > "$OUT/pytest_gpu.txt" 2>&1
grep -E "passed|failed|FAILED|Error" "$OUT/pytest_gpu.txt" | tail -8
end=$(( $(date +%s) + ${T_SWEEP:-240} ))
for entry in ${SWEEPS:-}; do
  IFS=: read -r spec ms only <<< "$entry"
  left=$(( end - $(date +%s) )); [ "$left" -gt 5 ] || { echo "sweep budget spent before $entry"; break; }
  timeout "$left" python3 bench/sweep.py "$spec" --N 8192 --K 8192 --M "$ms" ${only:+--only $only} \
    --budget-ms "${BUDGET_MS:-2}" --out "$OUT/sweep.jsonl" >> "$OUT/sweep.txt" 2>&1 || echo "!! $entry exited $?" >> "$OUT/sweep.txt"
done
python3 - "$OUT/sweep.jsonl" <<'PY' 2>/dev/null
import json, sys
best = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    k = (r["spec"], r["M"])
    if r["ok"] and r["us"] and (k not in best or r["us"] < best[k]["us"]):
        best[k] = r
    if r["heuristic"]:
        best.setdefault(("heur",) + k, r)
for (s, M), r in sorted((k, v) for k, v in best.items() if k[0] != "heur"):
    h = best.get(("heur", s, M))
    print(f"{s:22s} M={M:<5d} best {r['us']:8.2f} {r['config']:36s} heuristic {h['us'] if h and h['us'] else float('nan'):8.2f} {h['config'] if h else ''}")
PY
