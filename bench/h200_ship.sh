#!/usr/bin/env bash
# The device call that writes what we ship and publish, on a cold H200:
# 1. `opgen tune` of the headline W4A16 spec at 8192^2 over every default M
#    bucket, timed from a cold cubin cache (issue 4's < 60 s criterion);
# 2. a short GPU check of the paths the kernel suites have not re-run lately
#    (fp8 activation fallback, predecode at a part tile, odd shapes);
# 3. bench/tune_shipped.sh (every shipped spec, the bench's shapes and Ms,
#    8192^2 first) into one DB;
# 4. the full `opgen bench` with that DB, 8192^2 first.
# Every step writes as it goes, so a call cut short leaves what it finished.
# Time per step (s): T_TUNE1, T_TEST, T_TUNE, T_BENCH. Files in $OUT:
# tune_gptq_cold.txt, pytest_gpu.txt, gpu_correctness.json, tune_shipped.txt,
# tuned_h200.json, bench.json, bench.md, speedup.png, floor.png.
set -u
OUT=${OUT:-/tmp/opgen_out}; mkdir -p "$OUT"
export OPGEN_CACHE_DIR=/tmp/opgen_cache PYTHONUNBUFFERED=1
DB=/tmp/opgen_tuned.json
python3 -m pip install --no-deps --no-build-isolation -q -e . > /tmp/opgen_install.log 2>&1 || tail -5 /tmp/opgen_install.log
s=$(date +%s.%N)
timeout -s INT -k 10 "${T_TUNE1:-80}" python3 -m opgen tune gptq_v2_w4a16_g128 --N 8192 --K 8192 \
  --db "$DB" --quiet > "$OUT/tune_gptq_cold.txt" 2>&1
echo "wall $(python3 -c "import time; print(round(time.time() - $s, 1))") s (cold cubin cache, process start to exit)" \
  | tee -a "$OUT/tune_gptq_cold.txt"
grep -E "^total|^stored" "$OUT/tune_gptq_cold.txt"
K=tests/runtime/test_kernels_gpu.py
OPGEN_GPU_SPECS=8 OPGEN_RESULTS="$OUT/gpu_correctness.json" timeout -s INT -k 10 "${T_TEST:-30}" \
  python3 -m pytest -q -p no:cacheprovider "$K" -k "fp8_activation_fallback or \
  (predecode and awq and 288) or odd_shapes" > "$OUT/pytest_gpu.txt" 2>&1
tail -1 "$OUT/pytest_gpu.txt"
T_TUNE=${T_TUNE:-260} BUDGET_MS=${BUDGET_MS:-5} bash bench/tune_shipped.sh "$DB" "$OUT/tune_shipped.txt" | tail -6
cp "$DB" "$OUT/tuned_h200.json"
timeout -s INT -k 10 "${T_BENCH:-130}" python3 -m opgen.bench --db "$DB" --out "$OUT" \
  --shapes 8192x8192,4096x4096,28672x8192,8192x28672,14336x57344 > /tmp/opgen_bench.txt 2>&1
tail -3 /tmp/opgen_bench.txt
grep -A26 "^## Targets" "$OUT/bench.md" | head -28
