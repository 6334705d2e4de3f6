"""Launch one config of one spec a few times, for a profiler to attach to:

    ncu --clock-control none --launch-skip 2 --launch-count 1 \\
        python3 bench/profile_one.py w2a16_g128 gemv_m1_w8_c4_v16_s1 --M 1 --N 8192 --K 8192

The config is named as the planner names it (`opgen build` / the tuner print
these names); it must be one of the planner's candidates for the shape.
"""
import argparse

from opgen.codegen import planner
from opgen.codegen.validate import load_spec, resolve_spec
from opgen.runtime import tuner
from opgen.runtime.device import current_arch


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("spec")
    p.add_argument("config")
    p.add_argument("--M", type=int, default=1)
    p.add_argument("--N", type=int, default=8192)
    p.add_argument("--K", type=int, default=8192)
    p.add_argument("--launches", type=int, default=5)
    args = p.parse_args(argv)
    spec = load_spec(resolve_spec(args.spec))
    arch = current_arch()
    by_name = {c.name: c for c in planner.candidates(spec, arch, args.M, args.N, args.K)}
    if args.config not in by_name:
        p.error(f"{args.config} is not a candidate; e.g. {', '.join(list(by_name)[:5])}")
    bench = tuner._make_session(arch).bench(spec, args.N, args.K, seed=0)
    bench.select(args.M)
    t = bench.time(by_name[args.config], budget_ms=tuner.BUDGET_MS, repeats=args.launches)
    print(f"{spec.name} {args.config} M={args.M} N={args.N} K={args.K}: {t.median_us:.2f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
