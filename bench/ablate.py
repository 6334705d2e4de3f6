"""What bounds a kernel: the same kernel with one part taken out at a time,
timed side by side (an ablation; the rs GEMM's parts and the row GEMV's).

A variant is a set of probes: named hooks in the kernel's template that take
one part out (codegen/render.py PROBES; each is described in its template's
header). A variant renders with its probes and compiles into a cubin cache of
its own; it runs only on the configs whose kernel has all of its probes (the
others are not timed), `as_is` on all of them.
  as_is        the shipped kernel
The rs GEMM (templates/gemm_rs.cu.j2): one probe each for
  w_l2, no_a, no_w, no_scales, no_decode, no_mma, lds_quarter, no_lds, spin
and
  no_loads     no_a + no_w: the ring's barriers only
  pipe_only    no loads, no decode, no wgmma: barriers and the loop
  pipe_spin    pipe_only with spin
The row GEMV (templates/gemv_row.cu.j2):
  gemv_no_mac    no_mac: its loads and scales alone
  gemv_no_stage  no_mac + no_stage: the same without staging the activations
The outputs are wrong in every variant but as_is; only their times count.

    python bench/ablate.py --out ablate.json \\
        w4a16_sym_g128:gemm_16x64x128_w64x16_p12_s1_wg_tma_rs4:16 ...
"""
from __future__ import annotations

import argparse
import functools
import json
import multiprocessing
import os
import sys
from concurrent.futures import ProcessPoolExecutor

from opgen.codegen import compiler, planner, render
from opgen.codegen.resolve import load_spec, resolve_spec
from opgen.runtime import workbench
from opgen.runtime.device import current_arch
from opgen.runtime.kernel import Kernel

_NO_LOADS = frozenset({"no_a", "no_w"})
_PIPE_ONLY = _NO_LOADS | {"no_decode", "no_mma"}
VARIANTS = {
    "as_is": frozenset(),
    "w_l2": frozenset({"w_l2"}),
    "no_a": frozenset({"no_a"}),
    "no_w": frozenset({"no_w"}),
    "no_loads": _NO_LOADS,
    "no_scales": frozenset({"no_scales"}),
    "no_decode": frozenset({"no_decode"}),
    "no_mma": frozenset({"no_mma"}),
    "pipe_only": _PIPE_ONLY,
    "lds_quarter": frozenset({"lds_quarter"}),
    "no_lds": frozenset({"no_lds"}),
    "spin": frozenset({"spin"}),
    "pipe_spin": _PIPE_ONLY | {"spin"},
    "gemv_no_mac": frozenset({"no_mac"}),
    "gemv_no_stage": frozenset({"no_mac", "no_stage"}),
}

# The compiler renders through render.render; a variant replaces it with the
# render of its probes (and compiles into a cache of its own, since the
# cache key does not see the probes).
_RENDER = render.render


def _use_variant(variant: str, root: str) -> None:
    os.environ["OPGEN_CACHE_DIR"] = os.path.join(root, variant)
    render.render = functools.partial(_RENDER, probes=VARIANTS[variant])


def _config(spec_name: str, cfg_name: str, M: int, N: int, K: int, arch: str):
    spec = load_spec(resolve_spec(spec_name))
    by_name = {c.name: c for c in planner.candidates(spec, arch, M, N, K)}
    return spec, by_name[cfg_name]


def _applies(variant: str, spec, cfg, arch: str) -> bool:
    """Whether the config's kernel has every probe of the variant."""
    return VARIANTS[variant] <= render.kernel_probes(spec, cfg, arch)


def _compile(job):
    spec_name, cfg_name, M, N, K, variant, root, arch = job
    _use_variant(variant, root)
    spec, cfg = _config(spec_name, cfg_name, M, N, K, arch)
    k = compiler.compile_kernel(spec, cfg, arch)
    return compiler.parse_ptxas(k.log).get("registers")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("entries", nargs="+", help="SPEC:CONFIG:M[:N:K] (N = K = 8192 if not given)")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--out")
    ap.add_argument("--cache", default="/tmp/opgen_ablate")
    ap.add_argument("--budget-ms", type=float, default=40.0)
    ap.add_argument("--arch", default="sm_90", help="what the kernels are compiled for")
    ap.add_argument("--compile-only", action="store_true")
    args = ap.parse_args(argv)
    variants = args.variants.split(",")
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        ap.error(f"unknown variants {', '.join(unknown)}; known: {', '.join(VARIANTS)}")
    entries = []
    for e in args.entries:
        s, c, m, *nk = e.split(":")
        N, K = (int(x) for x in nk) if nk else (8192, 8192)
        entries.append((s, c, int(m), N, K))
    todo = []
    for e in entries:
        spec, cfg = _config(*e, args.arch)
        todo += [(e, v) for v in variants if _applies(v, spec, cfg, args.arch)]
    jobs = [(*e, v, args.cache, args.arch) for e, v in todo]
    # Compile first, in forked workers (each patches render.render for its
    # variant), before this process touches CUDA.
    with ProcessPoolExecutor(max_workers=os.cpu_count() or 1,
                             mp_context=multiprocessing.get_context("fork")) as ex:
        regs = dict(zip([j[:6] for j in jobs], ex.map(_compile, jobs)))
    for (s, c, m, N, K, v), r in regs.items():
        print(f"compiled {s} {c} M={m} {N}x{K} {v}: {r} registers", flush=True)
    if args.compile_only:
        return 0
    assert current_arch() == args.arch, (current_arch(), args.arch)
    rows = []
    session = workbench.Session(args.arch)
    problem = entry = None
    for (s, c, m, N, K), v in todo:
        spec, cfg = _config(s, c, m, N, K, args.arch)
        if entry != (s, c, m, N, K):      # one problem's data for all its variants
            if problem is not None:
                problem.close()
            entry, problem = (s, c, m, N, K), session.problem(spec, N, K, seed=0)
            problem.select(m)
        _use_variant(v, args.cache)
        t = problem.time(Kernel(spec, cfg, args.arch), budget_ms=args.budget_ms)
        n_regs = regs[(s, c, m, N, K, v)]
        rows.append(dict(spec=s, config=c, M=m, N=N, K=K, variant=v, us=round(t.median_us, 2),
                         registers=n_regs))
        print(f"{s} {c} M={m} {N}x{K} {v:13s} {t.median_us:8.2f} us  ({n_regs} registers)",
              flush=True)
    if problem is not None:
        problem.close()
    session.close()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(rows=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
