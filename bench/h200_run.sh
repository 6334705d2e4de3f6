#!/usr/bin/env bash
# One device call on the H200: install, GPU correctness suite, tune the
# headline spec, benchmark against the peers. Eight files land in $OUT (the
# device tool brings back at most 8).
# Time limits per step (seconds): T_TEST, T_TUNE, T_BENCH, T_TORCH; together under the
# device tool's 10-minute call limit. OPGEN_GPU_MS / OPGEN_GPU_SHAPES /
# OPGEN_GPU_CONFIGS shorten the test step (tests/runtime/test_kernels_gpu.py).
set -u
OUT=${OUT:-/tmp/opgen_out}; mkdir -p "$OUT"
export OPGEN_CACHE_DIR=/tmp/opgen_cache PYTHONUNBUFFERED=1
python3 -m pip install --no-deps --no-build-isolation -q -e . > /tmp/opgen_install.log 2>&1 || tail -5 /tmp/opgen_install.log
# 1. correctness (the results file is rewritten after every check)
# (most important first: pytest runs the node ids in the order given)
K=tests/runtime/test_kernels_gpu.py
OPGEN_RESULTS="$OUT/gpu_correctness.json" timeout -s INT -k 15 "${T_TEST:-210}" python3 -m pytest -q -p no:cacheprovider \
  $K::test_spec_matches_reference $K::test_wgmma_matches_reference $K::test_every_candidate \
  tests/runtime/test_op_gpu.py tests/runtime/test_tuner_gpu.py $K::test_odd_shapes \
  $K::test_fp8_activation_fallback $K::test_generated_specs_match_reference \
  > "$OUT/pytest_gpu.txt" 2>&1
grep -E "passed|failed|FAILED|Error" "$OUT/pytest_gpu.txt" | tail -12
# 2. tune the headline W4A16 spec at N=K=8192 into the DB we ship
timeout "${T_TUNE:-90}" python3 -m opgen tune gptq_v2_w4a16_g128 --N 8192 --K 8192 ${TUNE_M:+--M $TUNE_M} \
  --db /tmp/opgen_tuned.json > "$OUT/tune.txt" 2>&1     # (its .lock stays out of $OUT)
cp /tmp/opgen_tuned.json "$OUT/tuned_h200.json" 2>/dev/null
tail -14 "$OUT/tune.txt"
# 3. benchmark against the peers, with that DB
timeout "${T_BENCH:-120}" python3 -m opgen.bench --quick --db /tmp/opgen_tuned.json --out "$OUT" \
  > /tmp/opgen_bench.txt 2>&1; tail -5 /tmp/opgen_bench.txt
grep -A40 -i "target" "$OUT/bench.md" | head -40
# 4. PyTorch integration on the GPU (QuantLinear, torch.compile, CUDA graphs), appended
timeout -s INT -k 15 "${T_TORCH:-60}" python3 -m pytest -q -p no:cacheprovider -m gpu tests/package/test_torch.py \
  >> "$OUT/pytest_gpu.txt" 2>&1
tail -3 "$OUT/pytest_gpu.txt"
