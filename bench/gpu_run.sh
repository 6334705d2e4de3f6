#!/usr/bin/env bash
# Device runs on a GPU machine, from the repository root. Everything goes
# to $OUT (default /tmp/opgen_out); nothing is written into the source tree.
#
#   bash bench/gpu_run.sh verify [PYTEST_ARGS...]  GPU tests -> pytest_gpu.txt, gpu_correctness.json
#                                                  (default: every gpu-marked test but the
#                                                  every-config sweeps and tests/perf; JOBS=n:
#                                                  the test files given as n concurrent runs; -n N
#                                                  (pytest-xdist) works too; with
#                                                  T_CASE=s each argument runs alone under that
#                                                  limit, so a hang names its test:
#                                                  c_<test>.json, tests.txt)
#   bash bench/gpu_run.sh tune [SPEC...]           opgen tune at the bench's shapes and Ms (8192^2
#                                                  first) into $OUT/nvidia_h200.json, started from a
#                                                  copy of the shipped DB (FRESH=1: empty); no SPEC:
#                                                  every shipped spec. MS=16,64 narrows the Ms. It
#                                                  skips the pairs whose records were tuned among
#                                                  today's candidates: after a call cut short, copy
#                                                  its DB over the shipped one and call again.
#                                                  The shipped DB is that file:
#                                                  cp $OUT/nvidia_h200.json opgen/data/tuning/nvidia_h200.json
#   bash bench/gpu_run.sh models [MODEL...]         opgen tune --model of each shipped model given (default:
#                                                  all six, Llama-3-8B first) for SPECS (default the
#                                                  W4A16, NF4, MXFP4 and W8A8 specs) into the same DB
#                                                  (the fused siblings' wider layers included;
#                                                  SEPARATE=1: the separate layers only)
#   bash bench/gpu_run.sh bench [BENCH_ARGS...]    opgen bench (all five shapes) into $OUT, with
#                                                  $OUT/nvidia_h200.json when there is one, else the
#                                                  shipped DB -> bench.json, bench.md, *.png
#   bash bench/gpu_run.sh ship                     verify + tune + bench: what a release ships
#   bash bench/gpu_run.sh sweep SPEC:M,M[:FAMILY]... bench/sweep.py at N = K = 8192 (FAMILY: gemm,
#                                                  gemv, wgmma, tma, rs) -> sweep.jsonl, sweep.txt,
#                                                  then each (spec, M)'s best against the heuristic
#   bash bench/gpu_run.sh ncu SPEC M [CONFIG]      Nsight Compute of one kernel (default: the op's
#                                                  pick for M) at N = K = 8192, appended to ncu.txt;
#                                                  NCU_DETAILS=1 stall reasons, NCU_SASS=1 the SASS
#                                                  lines stalled on most
#   bash bench/gpu_run.sh probe                    bench/wgmma_probe.py -> wgmma_probe.json, .txt
#   bash bench/gpu_run.sh e2e [E2E_ARGS...]        opgen bench --e2e (Llama-3-8B shape, random
#                                                  weights) into $OUT/e2e: e2e.json, e2e.md, e2e.png
#                                                  (the default variants outrun one T_E2E: give
#                                                  each call some, --variants A,B)
#   bash bench/gpu_run.sh memcheck [PYTEST_ARGS...] compute-sanitizer memcheck of one config of
#                                                  each kernel kind per spec at odd tails
#                                                  (test_kernel.py -k memcheck; compiled first,
#                                                  then MEMCHECK_N (8) xdist workers) -> memcheck.txt;
#                                                  rc 99: it found an error (Firecracker
#                                                  runtimes only: KINDS.md)
#
# gemlite (a peer of bench and e2e) is installed from .whl/gemlite-*.whl when
# the run carries it (bench/README.md says how to build the wheel).
#
# Time limits per step (s, SIGINT: the tuner keeps every pair it stored, the
# bench every spec it finished): T_TEST (240), T_TUNE (300), T_BENCH (150),
# T_SWEEP (240, all entries), T_NCU (90 per pass); `ship` takes T_TEST 120 and
# T_TUNE 280 to stay under a device call's 600 s; T_E2E (540); memcheck's
# T_WARM (150) and T_MEMCHECK (400). BUDGET_MS: device time per measurement
# of tune (5) and sweep (2).
set -u
cmd=${1:?usage: bash bench/gpu_run.sh verify|tune|models|bench|ship|sweep|ncu|probe|memcheck|e2e [ARGS...]}; shift
OUT=${OUT:-/tmp/opgen_out}; mkdir -p "$OUT"
export OPGEN_CACHE_DIR=${OPGEN_CACHE_DIR:-/tmp/opgen_cache} PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
DB="$OUT/nvidia_h200.json"
PYTEST="python3 -m pytest -q -p no:cacheprovider"

# The repository as the installed opgen (once per machine; the device copy is fresh).
python3 -c "import opgen.codegen, opgen.runtime" 2> /dev/null || python3 -m pip install --no-deps --no-build-isolation -q -e . \
  > /tmp/opgen_install.log 2>&1 || { tail -5 /tmp/opgen_install.log; exit 1; }

# gemlite (a pure-Python peer of bench and e2e) as a wheel carried in .whl
# (bench/README.md): installed aside, not into the image.
if ls .whl/gemlite-*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/opgen_site .whl/gemlite-*.whl \
    && export PYTHONPATH=/tmp/opgen_site${PYTHONPATH:+:$PYTHONPATH}
fi

verify() {
  if [ -n "${T_CASE:-}" ]; then
    local t rc s
    for t in "$@"; do
      s=$(date +%s)
      OPGEN_RESULTS="$OUT/c_${t//[^A-Za-z0-9_-]/_}.json" timeout -s INT -k 5 "$T_CASE" \
        $PYTEST -x "$t" > /tmp/opgen_case.txt 2>&1; rc=$?
      echo "$t rc=$rc $(( $(date +%s) - s ))s $(tail -1 /tmp/opgen_case.txt)" | tee -a "$OUT/tests.txt"
      grep -E "Error|assert|FAIL" /tmp/opgen_case.txt | head -3 | tee -a "$OUT/tests.txt"
    done
    return 0
  fi
  [ $# -gt 0 ] || set -- -m gpu tests --ignore=tests/perf -k "not every_"
  local dir=/tmp/opgen_verify
  rm -rf "$dir"; mkdir -p "$dir"
  if [ "${JOBS:-1}" -gt 1 ]; then
    verify_jobs "$dir" "$@"
  else
    OPGEN_RESULTS="$dir/all.json" timeout -s INT -k 15 "${T_TEST:-240}" $PYTEST "$@" > "$dir/all.txt" 2>&1
  fi
  cat "$dir"/*.txt > "$OUT/pytest_gpu.txt"
  # One record file of every process's (JOBS) and pytest-xdist worker's (-n) checks.
  python3 - "$OUT/gpu_correctness.json" "$dir" <<'PY'
import glob, json, sys
runs = []
for p in sorted(glob.glob(sys.argv[2] + "/*.json")):
    try:
        runs.append(json.load(open(p)))
    except ValueError:           # a process killed while writing: its last complete file is lost
        print(f"!! unreadable record file {p}")
if runs:
    json.dump({"env": runs[0]["env"], "exitstatus": max((r["exitstatus"] or 0) for r in runs),
               "checks": [c for r in runs for c in r["checks"]]}, open(sys.argv[1], "w"), indent=1)
PY
  grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/pytest_gpu.txt" | tail -16
}

# JOBS=n: the test files given run as n concurrent pytest processes (the tests
# are mostly NVRTC compiles, on the CPUs), each with the other arguments.
verify_jobs() {
  local a files=() opts=()
  dir=$1; shift
  for a in "$@"; do
    if [ "${a#-}" = "$a" ] && [ -e "${a%%::*}" ]; then files+=("$a"); else opts+=("$a"); fi
  done
  printf '%s\n' "${files[@]}" > "$dir/files"
  export PYTEST dir; export -f verify_one 2> /dev/null
  timeout -s INT -k 15 "${T_TEST:-240}" xargs -P "$JOBS" -I{} -d '\n' \
    bash -c 'verify_one "$@"' _ {} ${opts[@]+"${opts[@]}"} < "$dir/files"
}

verify_one() {
  local f=$1 name; shift
  name=${f//[^A-Za-z0-9_-]/_}
  OPGEN_RESULTS="$dir/$name.json" $PYTEST "$f" "$@" > "$dir/$name.txt" 2>&1
  echo "== $f rc=$?" >> "$dir/$name.txt"
}

memcheck() {
  [ $# -gt 0 ] || set -- tests/runtime/test_kernel.py -k memcheck
  # The kernels compiled into the cubin cache first, outside the sanitizer
  # (which slows everything in its process: 7 specs in 560 s with cold
  # compiles on the H200); then the checks in MEMCHECK_N pytest-xdist workers,
  # each under the sanitizer (it follows child processes).
  timeout -s INT -k 15 "${T_WARM:-150}" $PYTEST -n "${MEMCHECK_N:-8}" "$@" > "$OUT/memcheck_warm.txt" 2>&1
  echo "warm rc=$? $(tail -1 "$OUT/memcheck_warm.txt")"
  timeout -s INT -k 15 "${T_MEMCHECK:-400}" compute-sanitizer --tool memcheck --error-exitcode 99 \
    --print-limit 20 $PYTEST -n "${MEMCHECK_N:-8}" "$@" > "$OUT/memcheck.txt" 2>&1
  echo "memcheck rc=$?"
  grep -E "ERROR SUMMARY|Invalid|passed|failed" "$OUT/memcheck.txt" | tail -12
}

# Each argument: the arguments of one `opgen tune` run (word-split), run in
# order under one T_TUNE limit into $DB (started from a copy of the shipped DB
# unless FRESH); a run cut short keeps every pair it stored.
tune_each() {
  local run left rc=0 end=$(( $(date +%s) + ${T_TUNE:-300} ))
  [ -f "$DB" ] || [ -n "${FRESH:-}" ] || cp opgen/data/tuning/nvidia_h200.json "$DB"
  for run in "$@"; do
    left=$(( end - $(date +%s) ))
    [ "$left" -gt 5 ] || { echo "T_TUNE spent before: $run" | tee -a "$OUT/tune.txt"; rc=124; break; }
    timeout -s INT -k 20 "$left" python3 -m opgen tune $run --budget-ms "${BUDGET_MS:-5}" \
      --db "$DB" >> "$OUT/tune.txt" 2>&1 || rc=$?
  done
  rm -f "$DB.lock"
  grep -E "^compiled|^stored .* pair|^total|NOT tuned|T_TUNE|heuristic" "$OUT/tune.txt" | tail -12
  return $rc
}

tune() {
  local shapes ms rest specs=${*:---all}
  read -r shapes ms < <(python3 -c "from opgen.bench.plan import DEFAULT_SHAPES as S, DEFAULT_MS as M
print(','.join(f'{n}x{k}' for n, k in S), ','.join(map(str, M)))")
  ms=${MS:-$ms}
  # The targets' shape first: a run cut short keeps the pairs that matter most;
  # the second pass finds its kernels in the cubin cache (they do not depend on N, K).
  rest=$(echo "$shapes" | tr ',' '\n' | grep -vx 8192x8192 | paste -sd, -)
  tune_each "$specs --shapes 8192x8192 --M $ms" "$specs --shapes $rest --M $ms"
}

# The linear shapes of shipped models (opgen/data/models), one model after the
# other in the order given, for the formats users serve them in.
models() {
  local m runs=() specs=${SPECS:-w4a16_sym_g128,bnb_nf4,mxfp4,w8a8_int8}
  [ $# -gt 0 ] || set -- llama-3-8b qwen2.5-7b llama-3-70b qwen2.5-72b mistral-7b gpt-oss-20b
  for m in "$@"; do runs+=("${specs//,/ } --model $m ${MS:+--M $MS} ${SEPARATE:+--no-fused} --quiet"); done
  tune_each "${runs[@]}"
}

bench() {
  local db=() specs=()
  [ -f "$DB" ] && db=(--db "$DB")
  # Without --specs: every shipped matmul spec and the user specs of
  # docs/examples (formats outside the shipped ones, on the same paths).
  if ! printf '%s\n' "$@" | grep -q -- '--specs'; then
    specs=(--specs "$(python3 -c "from opgen.bench.plan import shipped_matmul_specs as s; print(','.join(s()))"),$(ls docs/examples/*.yaml | paste -sd,)")
  fi
  timeout -s INT -k 10 "${T_BENCH:-150}" python3 -m opgen.bench ${db[@]+"${db[@]}"} ${specs[@]+"${specs[@]}"} --out "$OUT" "$@" \
    > "$OUT/bench_log.txt" 2>&1
  echo "bench rc=$?"; tail -3 "$OUT/bench_log.txt"
  grep -A40 "^## Targets" "$OUT/bench.md" 2> /dev/null | head -42
}

e2e() {
  timeout -s INT -k 10 "${T_E2E:-540}" python3 -m opgen.bench --e2e --out "$OUT/e2e" "$@" \
    > "$OUT/e2e_log.txt" 2>&1
  echo "e2e rc=$?"; tail -4 "$OUT/e2e_log.txt"
  sed -n '/^## Results/,$p' "$OUT/e2e/e2e.md" 2> /dev/null | head -60
}

sweep() {
  local e spec ms fam left end=$(( $(date +%s) + ${T_SWEEP:-240} ))
  for e in "$@"; do
    IFS=: read -r spec ms fam <<< "$e"
    left=$(( end - $(date +%s) )); [ "$left" -gt 5 ] || { echo "T_SWEEP spent before $e"; break; }
    timeout "$left" python3 bench/sweep.py "$spec" --N 8192 --K 8192 --M "$ms" ${fam:+--only $fam} \
      --budget-ms "${BUDGET_MS:-2}" --out "$OUT/sweep.jsonl" >> "$OUT/sweep.txt" 2>&1 \
      || echo "!! $e exited $?" >> "$OUT/sweep.txt"
  done
  [ -f "$OUT/sweep.jsonl" ] || return 1
  python3 - "$OUT/sweep.jsonl" <<'PY'
import json, sys
best, heur = {}, {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    k = (r["spec"], r["M"])
    if r["ok"] and r["us"] and (k not in best or r["us"] < best[k]["us"]):
        best[k] = r
    if r["heuristic"]:
        heur[k] = r
for (s, M), r in sorted(best.items()):
    h = heur.get((s, M), {})
    print(f"{s:28s} M={M:<5d} best {r['us']:8.2f} {r['config']:40s} "
          f"heuristic {h.get('us') or float('nan'):8.2f} {h.get('config', '')}")
PY
}

ncu_one() {
  local spec=${1:?ncu SPEC M [CONFIG]} m=${2:?ncu SPEC M [CONFIG]} cfg=${3:-} rep=/tmp/opgen_ncu_$$
  local run=(python3 bench/profile_one.py "$spec" $cfg --M "$m" --launches 5)
  local ncu=(timeout "${T_NCU:-90}" ncu --clock-control none -k "regex:gem" --launch-skip 3 --launch-count 1)
  echo "=== $spec ${cfg:-(op pick)} M=$m" >> "$OUT/ncu.txt"
  "${ncu[@]}" --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats \
    --section SchedulerStats --section MemoryWorkloadAnalysis --section InstructionStats \
    "${run[@]}" >> "$OUT/ncu.txt" 2>&1 || echo "!! exited $?" >> "$OUT/ncu.txt"
  # A pass of its own for the stall reasons' details, so an ncu without these options costs only it.
  [ -z "${NCU_DETAILS:-}" ] || "${ncu[@]}" --section WarpStateStats --section SourceCounters \
    --print-details all "${run[@]}" >> "$OUT/ncu.txt" 2>&1 || echo "!! details exited $?" >> "$OUT/ncu.txt"
  if [ -n "${NCU_SASS:-}" ]; then
    "${ncu[@]}" --section SourceCounters --import-source no -f -o "$rep" "${run[@]}" > /dev/null 2>&1 \
      && ncu -i "$rep.ncu-rep" --page source --csv --print-source sass 2>&1 \
         | python3 bench/ncu_sass_top.py 45 >> "$OUT/ncu.txt" 2>&1 \
      || echo "!! sass lines exited $?" >> "$OUT/ncu.txt"
    rm -f "$rep.ncu-rep"
  fi
  grep -E "^===|Duration|DRAM Throughput|Achieved Occupancy|SM Frequency|Registers Per|Issued Ipc|No Eligible" \
    "$OUT/ncu.txt" | tail -12
}

case "$cmd" in
  verify) verify "$@" ;;
  tune) tune "$@" ;;
  models) models "$@" ;;
  bench) bench "$@" ;;
  ship) T_TEST=${T_TEST:-120} T_TUNE=${T_TUNE:-280}; verify; tune; bench ;;
  sweep) sweep "$@" ;;
  ncu) ncu_one "$@" ;;
  memcheck) memcheck "$@" ;;
  e2e) e2e "$@" ;;
  probe) timeout "${T_PROBE:-120}" python3 bench/wgmma_probe.py --out "$OUT/wgmma_probe.json" \
           > "$OUT/wgmma_probe.txt" 2>&1; tail -40 "$OUT/wgmma_probe.txt" ;;
  *) echo "unknown command $cmd: verify|tune|models|bench|ship|sweep|ncu|probe|memcheck|e2e" >&2; exit 2 ;;
esac
