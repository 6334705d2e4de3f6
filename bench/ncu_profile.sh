#!/usr/bin/env bash
# Nsight Compute on chosen configs (the H200 kind runs on Firecracker, where
# ncu reads the hardware counters). $PROFILES: entries "SPEC:CONFIG:M" at
# N = K = 8192. Clocks are left alone (--clock-control none, METHOD.md).
# Writes $OUT/ncu.txt: per kernel speed of light, occupancy, warp stall
# reasons, scheduler and memory statistics (with $NCU_DETAILS also the stall
# reasons' breakdown, with $NCU_SASS the SASS lines stalled on most).
set -u
OUT=${OUT:-/tmp/opgen_out}; mkdir -p "$OUT"
export OPGEN_CACHE_DIR=${OPGEN_CACHE_DIR:-/tmp/opgen_cache} PYTHONUNBUFFERED=1
for entry in ${PROFILES:-}; do
  IFS=: read -r spec cfg m <<< "$entry"
  echo "=== $spec $cfg M=$m" >> "$OUT/ncu.txt"
  timeout "${T_NCU:-90}" ncu --clock-control none -k "regex:gem" --launch-skip 3 --launch-count 1 \
    --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats \
    --section SchedulerStats --section MemoryWorkloadAnalysis --section InstructionStats \
    python3 bench/profile_one.py "$spec" "$cfg" --M "$m" --launches 5 >> "$OUT/ncu.txt" 2>&1 \
    || echo "!! $entry exited $?" >> "$OUT/ncu.txt"
  # $NCU_DETAILS: a second pass for the stall reasons and their SASS lines
  # (the sections' bodies), kept apart so an ncu without these options costs
  # only this pass.
  [ -z "${NCU_DETAILS:-}" ] || timeout "${T_NCU:-90}" ncu --clock-control none -k "regex:gem" --launch-skip 3 \
    --launch-count 1 --section WarpStateStats --section SourceCounters --print-details all \
    python3 bench/profile_one.py "$spec" "$cfg" --M "$m" --launches 5 >> "$OUT/ncu.txt" 2>&1 \
    || echo "!! details of $entry exited $?" >> "$OUT/ncu.txt"
  # $NCU_SASS: one more pass saved as a report, whose source page gives the
  # SASS lines the warps stall on (bench/ncu_sass_top.py).
  if [ -n "${NCU_SASS:-}" ]; then
    rep=/tmp/ncu_sass_$$
    timeout "${T_NCU:-90}" ncu --clock-control none -k "regex:gem" --launch-skip 3 --launch-count 1 \
      --section SourceCounters --import-source no -f -o "$rep" \
      python3 bench/profile_one.py "$spec" "$cfg" --M "$m" --launches 5 > /dev/null 2>&1 \
      && ncu -i "$rep.ncu-rep" --page source --csv --print-source sass 2>&1 \
         | python3 bench/ncu_sass_top.py 45 >> "$OUT/ncu.txt" 2>&1 \
      || echo "!! sass lines of $entry exited $?" >> "$OUT/ncu.txt"
  fi
done
grep -E "^===|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|SM Frequency|Registers Per|Issued Ipc|No Eligible|Stall" "$OUT/ncu.txt" | head -120
