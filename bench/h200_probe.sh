#!/usr/bin/env bash
# One device call for the swapped GEMM's open questions (NOTES v9): the wgmma
# cost probe (bench/wgmma_probe.py), then bench/h200_verify.sh ($TESTS,
# $SWEEPS), then bench/ncu_profile.sh ($PROFILES, with the stall details).
# Files in $OUT: wgmma_probe.json / .txt, gpu_correctness.json,
# pytest_gpu.txt, sweep.jsonl, sweep.txt, ncu.txt.
set -u
OUT=${OUT:-/tmp/opgen_out}; mkdir -p "$OUT"
python3 -m pip install --no-deps --no-build-isolation -q -e . > /tmp/opgen_install.log 2>&1 || tail -5 /tmp/opgen_install.log
timeout "${T_PROBE:-120}" python3 bench/wgmma_probe.py --out "$OUT/wgmma_probe.json" > "$OUT/wgmma_probe.txt" 2>&1
cat "$OUT/wgmma_probe.txt" | tail -40
bash bench/h200_verify.sh
[ -z "${PROFILES:-}" ] || NCU_DETAILS=1 bash bench/ncu_profile.sh
