#!/usr/bin/env bash
# One device call for the decoded-weight TMA GEMM: its GPU checks spec by
# spec (each pytest under its own 70 s limit, so a hang names its spec), then
# bench/sweep.py of every tma config at N = K = 8192 (90 s per spec) and each
# spec's best. Files in $OUT: tests.txt, c_<case>.json, sweep.jsonl, sweep.txt.
set -u
OUT=${OUT:-/tmp/opgen_out}; mkdir -p "$OUT"
export OPGEN_CACHE_DIR=/tmp/opgen_cache PYTHONUNBUFFERED=1 OPGEN_GPU_SHAPES=square
python3 -m pip install --no-deps --no-build-isolation -q -e . > /dev/null 2>&1
K=tests/runtime/test_kernels_gpu.py::test_tma_matches_reference
t() { for n in "$@"; do
 s=$(date +%s); OPGEN_RESULTS=$OUT/c_$n.json timeout -s INT -k 5 70 python3 -m pytest -q -x -p no:cacheprovider "$K[$n]" > /tmp/t.txt 2>&1; rc=$?
 echo "$n rc=$rc $(( $(date +%s)-s ))s $(tail -1 /tmp/t.txt)"; grep -E "Error|assert|FAIL" /tmp/t.txt | head -3
done 2>&1 | tee -a $OUT/tests.txt; }
t w4a16_sym_g128-70-264-1152 w4a16_sym_g128-300-1032-2176
for e in "w4a16_sym_g128 64,256" "bnb_nf4 64,256" "w2a16_g128 64" "mxfp4 64"; do set -- $e
 s=$(date +%s); timeout 90 python3 bench/sweep.py $1 --N 8192 --K 8192 --M $2 --only tma --budget-ms 3 --out $OUT/sweep.jsonl > /tmp/s.txt 2>&1; echo "sweep $1 rc=$? $(( $(date +%s)-s ))s"; cat /tmp/s.txt >> $OUT/sweep.txt
done
python3 -c "
import json,sys
b={}
for l in open('$OUT/sweep.jsonl'):
  r=json.loads(l)
  if r['ok'] and r['us']: k=(r['spec'],r['M']); b[k]=min(b.get(k,(1e9,'')),(r['us'],r['config']))
for k,v in sorted(b.items()): print(k,v)
"
t bnb_nf4-70-264-1152 w2a16_g128-300-1032-2176 mxfp4-70-264-1152 bitnet_b158-70-264-1152 fp8_e4m3_w8a16-70-264-1152 bnb_nf4-300-1032-2176
