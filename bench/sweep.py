"""Every planner candidate of one spec at one shape: verify, then time.

    python3 bench/sweep.py SPEC --N 8192 --K 8192 --M 1,64 [--only gemm] [--budget-ms 5]

Prints one line per config *before* launching it (flushed), so when a kernel
faults and takes the CUDA context down, the last line names the culprit; then
its relative error against the reference and its median time (the tuner's
timer and rotating buffers). A JSON line per config goes to --out if given.
This is the tuner's loop without the early drop, for finding faults and for
reading the whole landscape of configs rather than only the winner.
"""
import argparse
import json
import sys

from opgen.codegen import planner
from opgen.codegen.compiler import compile_many
from opgen.codegen.tolerance import tolerance
from opgen.codegen.resolve import load_spec, resolve_spec
from opgen.runtime import workbench
from opgen.runtime.device import current_arch


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("spec")
    p.add_argument("--N", type=int, required=True)
    p.add_argument("--K", type=int, required=True)
    p.add_argument("--M", default="1")
    p.add_argument("--only", choices=["gemm", "gemv", "wgmma", "tma", "rs"], help="one kernel family")
    p.add_argument("--budget-ms", type=float, default=5.0)
    p.add_argument("--out", help="append JSON lines here")
    args = p.parse_args(argv)
    spec = load_spec(resolve_spec(args.spec))
    arch = current_arch()
    Ms = [int(m) for m in args.M.split(",")]
    def wanted(c):
        return (args.only in (None, c.family) or (args.only == "wgmma" and c.wgmma)
                or (args.only == "tma" and c.tma) or (args.only == "rs" and c.rs))
    per_M = {M: [c for c in planner.candidates(spec, arch, M, args.N, args.K) if wanted(c)]
             for M in Ms}
    jobs = {(spec, c, arch) for cs in per_M.values() for c in cs}
    bad = {job[1]: why for job, why in compile_many(jobs) if why}
    tol = tolerance(spec)
    out = open(args.out, "a") if args.out else None
    session = workbench.Session(arch)
    problem = session.problem(spec, args.N, args.K, seed=0)
    for M, cfgs in per_M.items():
        problem.select(M)
        heur = planner.heuristic(spec, arch, M, args.N, args.K)
        for cfg in cfgs:
            print(f"{spec.name} M={M} {cfg.name} ...", end=" ", flush=True)
            if cfg in bad:
                print("compile failed:", bad[cfg], flush=True)
                continue
            try:
                kernel = session.kernel(spec, cfg)
            except Exception as e:          # a config the driver refuses to load
                print(f"load failed: {type(e).__name__}: {e}", flush=True)
                continue
            ok, err, why = problem.verify(kernel, tol)
            t = problem.time(kernel, budget_ms=args.budget_ms) if ok else None
            us = t.median_us if t else None
            mark = " (heuristic)" if cfg == heur else ""
            print(f"err {err:.1e} " + (f"{us:.2f} us{mark}" if ok else f"FAILED: {why}"), flush=True)
            if out:
                out.write(json.dumps(dict(spec=spec.name, M=M, N=args.N, K=args.K, config=cfg.name,
                                          heuristic=cfg == heur, ok=ok, rel_err=err, us=us)) + "\n")
                out.flush()
    problem.close()
    session.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
