"""Quick first look on a GPU (run from the repo root: python3 bench/smoke.py).

1. Correctness: every shipped matmul spec at N=1024, K=2048, M in 1, 5, 16,
   77, 256, two configs each, through the GPU test's run_check -> $OUT/smoke.txt.
2. A spread of configs for W4A16 at N=K=8192, each launch timed between its
   own pair of CUDA events -> $OUT/smoke_perf.json. Caveat: with no work queued
   ahead, such timings include the Python launch gap; `opgen tune` and
   `opgen bench` time behind a spin kernel instead (runtime/timing.py).

Produced bench/results/h200/smoke_correctness.txt and first_perf_w4a16.json.
"""
import json
import os
import sys

import numpy as np

sys.path.insert(0, "tests/runtime")   # reuse the GPU test's checker
from opgen.codegen import planner
from opgen.codegen.validate import load_spec, shipped_specs
from opgen.runtime.device import current_arch, device_name
import test_kernels_gpu as T
arch = current_arch(); print(device_name(), arch, flush=True)
rows = []
for name in T.MATMUL_SPECS:
    spec = load_spec(shipped_specs()[name])
    for M in (1, 5, 16, 77, 256):
        N, K = 1024, 2048
        try:
            cfgs = T.configs_for(spec, arch, M, N, K, limit=2)
        except Exception as e:
            print("PLAN", name, M, e); continue
        for cfg in cfgs:
            try:
                T.run_check(spec, cfg, M, N, K, seed=M)
                rows.append((name, M, cfg.name, "ok"))
            except AssertionError as e:
                rows.append((name, M, cfg.name, "FAIL " + str(e)[-60:]))
            except Exception as e:
                rows.append((name, M, cfg.name, "ERR " + repr(e)[:300]))
with open(os.path.join(os.environ.get("OUT", "/tmp"), "smoke.txt"), "w") as f:
    for r in rows:
        print(*r, file=f)
print("smoke:", sum(r[3] == "ok" for r in rows), "ok of", len(rows))
for r in rows:
    if r[3] != "ok":
        print(*r)
# first timings: gptq at 8192^2
import cupy as cp
from opgen.runtime.kernel import Kernel
from opgen.codegen.reference import random_weight_tensors, random_activation
perf = []
for name in ("gptq_v2_w4a16_g128", "w4a16_sym_g128"):
    spec = load_spec(shipped_specs()[name])
    N = K = 8192
    rng = np.random.default_rng(0)
    t = {k: cp.asarray(v) for k, v in random_weight_tensors(spec, N, K, rng).items()}
    for M in (1, 16, 64, 256, 4096):
        a = cp.asarray(random_activation(spec, M, K, rng)[0]); out = cp.empty((M, N), cp.float16)
        cands = planner.candidates(spec, arch, M, N, K)
        best = None
        for cfg in [planner.heuristic(spec, arch, M, N, K)] + cands[:: max(1, len(cands)//8)]:
            try:
                k = Kernel(spec, cfg)
                for _ in range(3): k(a, t, out)
                e0, e1 = cp.cuda.Event(), cp.cuda.Event()
                ts = []
                for _ in range(20):
                    e0.record(); k(a, t, out); e1.record(); e1.synchronize(); ts.append(cp.cuda.get_elapsed_time(e0, e1) * 1e3)
                us = float(np.median(ts))
                print(name, M, cfg.name, round(us, 1), flush=True)
                perf.append((name, M, cfg.name, us))
            except Exception as e:
                print(name, M, cfg.name, "ERR", repr(e)[:100], flush=True)

with open(os.path.join(os.environ.get("OUT", "/tmp"), "smoke_perf.json"), "w") as f:
    json.dump(perf, f)
