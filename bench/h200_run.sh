#!/usr/bin/env bash
# One device call on the H200: install, GPU correctness suite, tune the
# headline spec, benchmark against the peers. Everything lands in $OUT.
set -u
OUT=${OUT:-/tmp/opgen_out}; mkdir -p "$OUT"
export OPGEN_CACHE_DIR=/tmp/opgen_cache PYTHONUNBUFFERED=1
python3 -m pip install --no-deps --no-build-isolation -q -e . > "$OUT/install.log" 2>&1
# 1. correctness (results file written as it goes)
OPGEN_RESULTS="$OUT/gpu_correctness.json" OPGEN_GPU_MS="${OPGEN_GPU_MS:-1,3,16,33,128,1000}" \
  timeout "${T_TEST:-120}" python3 -m pytest -q -p no:cacheprovider tests/runtime/test_kernels_gpu.py \
  tests/runtime/test_tuner_gpu.py > "$OUT/pytest_gpu.txt" 2>&1
tail -5 "$OUT/pytest_gpu.txt"
# 2. tune the headline W4A16 spec at N=K=8192 into a DB we ship
timeout "${T_TUNE:-60}" python3 -m opgen tune gptq_v2_w4a16_g128 --N 8192 --K 8192 \
  --db "$OUT/tuned_h200.json" > "$OUT/tune.txt" 2>&1
tail -15 "$OUT/tune.txt"
# 3. benchmark against the peers (uses that DB)
OPGEN_TUNING_DB="$OUT/tuned_h200.json" timeout "${T_BENCH:-60}" python3 -m opgen.bench --quick \
  --out "$OUT" > "$OUT/bench.txt" 2>&1
tail -40 "$OUT/bench.txt"
