#!/usr/bin/env bash
# One device call on the H200: install, GPU correctness of the kernel paths
# (every column- and row-GEMV config at small odd shapes first), tune every
# shipped spec at the bench shapes into the DB we ship, then the quick bench
# against the peers with that DB. Eight files land in $OUT (the device tool
# brings back at most eight). Time limits per step (seconds): T_TEST, T_TUNE,
# T_BENCH; together under the tool's 10-minute call limit.
set -u
OUT=${OUT:-/tmp/opgen_out}; mkdir -p "$OUT"
export OPGEN_CACHE_DIR=/tmp/opgen_cache PYTHONUNBUFFERED=1
python3 -m pip install --no-deps --no-build-isolation -q -e . > /tmp/opgen_install.log 2>&1 || tail -5 /tmp/opgen_install.log
# 1. correctness (the results file is rewritten after every check; most important first)
K=tests/runtime/test_kernels_gpu.py
OPGEN_RESULTS="$OUT/gpu_correctness.json" timeout -s INT -k 15 "${T_TEST:-150}" python3 -m pytest -q -p no:cacheprovider \
  ${TESTS:-$K::test_every_row_gemv $K::test_every_candidate $K::test_predecode_matches_reference} \
  > "$OUT/pytest_gpu.txt" 2>&1
grep -E "passed|failed|FAILED|Error" "$OUT/pytest_gpu.txt" | tail -8
# 2. tune every shipped spec at the bench shapes (stored pair by pair), or
#    only what TUNE_ARGS names (e.g. "spec1 spec2 --shapes 8192x8192 --M 1,16")
if [ -n "${TUNE_ARGS:-}" ]; then
  timeout -s INT -k 20 "${T_TUNE:-270}" python3 -m opgen tune $TUNE_ARGS --db /tmp/opgen_tuned.json \
    > "$OUT/tune_shipped.txt" 2>&1; grep -E "^compiled|^stored|^total|NOT tuned" "$OUT/tune_shipped.txt"
else
  T_TUNE=${T_TUNE:-270} bash bench/tune_shipped.sh /tmp/opgen_tuned.json "$OUT/tune_shipped.txt"
fi
cp /tmp/opgen_tuned.json "$OUT/tuned_h200.json" 2>/dev/null
# 3. the quick bench with that DB
timeout -s INT -k 10 "${T_BENCH:-110}" python3 -m opgen.bench --quick --db /tmp/opgen_tuned.json --out "$OUT" \
  > /tmp/opgen_bench.txt 2>&1; tail -3 /tmp/opgen_bench.txt
grep -A30 "^## Targets" "$OUT/bench.md" | head -30
# 4. PyTorch integration on the GPU (QuantLinear, torch.compile, CUDA graphs), appended
[ "${T_TORCH:-0}" -gt 0 ] && timeout -s INT -k 10 "$T_TORCH" python3 -m pytest -q -p no:cacheprovider -m gpu \
  tests/package/test_torch.py tests/runtime/test_op_gpu.py >> "$OUT/pytest_gpu.txt" 2>&1; tail -2 "$OUT/pytest_gpu.txt"
