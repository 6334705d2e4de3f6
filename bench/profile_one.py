"""Launch one config of one spec a few times, for a profiler to attach to:

    ncu --clock-control none --launch-skip 2 --launch-count 1 \\
        python3 bench/profile_one.py w2a16_g128 gemv_m1_w8_c4_v16_s1 --M 1 --N 8192 --K 8192

The config is named as the planner names it (`opgen build` / the tuner print
these names); it must be one of the planner's candidates for the shape.
Without one, the op's own pick for M (tuning DB winner, else the heuristic's).
`bash bench/gpu_run.sh ncu SPEC M [CONFIG]` runs it under Nsight Compute.
"""
import argparse

import opgen
from opgen.codegen import planner
from opgen.codegen.resolve import load_spec, resolve_spec
from opgen.runtime import workbench
from opgen.runtime.device import current_arch
from opgen.runtime.timing import BUDGET_MS


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("spec")
    p.add_argument("config", nargs="?", help="default: the op's pick for M")
    p.add_argument("--M", type=int, default=1)
    p.add_argument("--N", type=int, default=8192)
    p.add_argument("--K", type=int, default=8192)
    p.add_argument("--launches", type=int, default=5)
    args = p.parse_args(argv)
    spec = load_spec(resolve_spec(args.spec))
    arch = current_arch()
    if args.config is None:
        cfg = opgen.load(spec, N=args.N, K=args.K).config_for(args.M)
    else:
        by_name = {c.name: c for c in planner.candidates(spec, arch, args.M, args.N, args.K)}
        if args.config not in by_name:
            p.error(f"{args.config} is not a candidate; e.g. {', '.join(list(by_name)[:5])}")
        cfg = by_name[args.config]
    session = workbench.Session(arch)
    problem = session.problem(spec, args.N, args.K, seed=0)
    problem.select(args.M)
    t = problem.time(session.kernel(spec, cfg), budget_ms=BUDGET_MS, repeats=args.launches)
    print(f"{spec.name} {cfg.name} M={args.M} N={args.N} K={args.K}: {t.median_us:.2f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
