#!/usr/bin/env bash
# Tune every shipped matmul spec at the benchmark's shapes and token counts
# (opgen/bench/plan.py: DEFAULT_SHAPES x DEFAULT_MS) on this GPU, in one
# process: one compile pool for every kernel, one CUDA context. The pre-tuned
# DB we ship (opgen/data/tuned_h200.json) is written this way, on an H200:
#   bash bench/tune_shipped.sh DB LOG          (then: cp DB opgen/data/tuned_h200.json)
# It runs
#   opgen tune --all --shapes 8192x8192 --M 1,16,32,64,128,256,1024,4096 --budget-ms 10 --db DB
#   opgen tune --all --shapes 4096x4096,28672x8192,8192x28672,14336x57344 ... (same options)
# Each (spec, shape) is stored as soon as it is done (one locked update), so a
# run stopped at T_TUNE seconds (default 290, both passes; SIGINT) keeps every pair it
# finished and still prints its tables. BUDGET_MS: the final pass's device
# time per config (below 100 us a kernel gets 100 samples either way).
# SPECS (default --all) and MS (default: the bench's) narrow a re-tune after
# a kernel change, e.g. SPECS="fp16 w8a8_int8" MS=64,256,4096.
set -u
DB=${1:?usage: tune_shipped.sh DB LOG}; LOG=${2:?usage: tune_shipped.sh DB LOG}
read -r SHAPES BENCH_MS < <(python3 -c "from opgen.bench.plan import DEFAULT_SHAPES as S, DEFAULT_MS as M
print(','.join(f'{n}x{k}' for n, k in S), ','.join(map(str, M)))")
MS=${MS:-$BENCH_MS}
# The targets' shape first (every spec), then the others: a run cut short
# keeps the pairs that matter most. The second pass finds its kernels in the
# cubin cache (they do not depend on N and K).
FIRST=8192x8192
REST=$(echo "$SHAPES" | tr ',' '\n' | grep -vx "$FIRST" | paste -sd, -)
end=$(( $(date +%s) + ${T_TUNE:-290} ))
: > "$LOG"
rc=0
for shapes in "$FIRST" "$REST"; do
  left=$(( end - $(date +%s) )); [ "$left" -gt 5 ] || { echo "T_TUNE spent before $shapes" | tee -a "$LOG"; rc=124; break; }
  timeout -s INT -k 20 "$left" python3 -m opgen tune ${SPECS:---all} --shapes "$shapes" --M "$MS" \
    --budget-ms "${BUDGET_MS:-10}" --db "$DB" >> "$LOG" 2>&1 || rc=$?
done
grep -E "^compiled|^stored .* pair|^total|NOT tuned|T_TUNE" "$LOG"
exit $rc
