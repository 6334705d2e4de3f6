"""What bounds a kernel: the same kernel with one part taken out at a time,
timed side by side (an ablation; the swapped GEMM's parts and the row
GEMV's).

Each variant edits the rendered source of a config and compiles into its own
cubin cache; a variant runs only on the configs whose source every one of its
edits applies to (the others are not timed), `as_is` on all of them.
  as_is       the shipped kernel
The swapped GEMM (gemm_rs.cu.j2):
  w_l2        the weight box of every k-tile read from the first two k-tiles
              (the weights then come from L2, not DRAM)
  no_a        no activation loads (the ring carries only the weights)
  no_w        no weight loads
  no_loads    neither: the ring's barriers only
  no_scales   scales a constant, not loaded
  no_decode   the stored words go to the wgmma unchanged
  no_mma      no wgmma (the decode is kept alive by its fences)
  pipe_only   no loads, no decode, no wgmma: barriers and the loop
  lds_quarter a quarter of the weight words' shared-memory loads (one
              16-byte piece per row and lane; the rest made from it)
  no_lds      no shared-memory loads of the weight words
  spin        the ring's waits poll (mbarrier.test_wait), never suspend
  pipe_spin   pipe_only with those waits
The row GEMV (gemv.cu.j2, scheme "row", no tensor cores):
  gemv_no_mac    each loaded word only masked into a sum (no decode, no
                 activation reads, no products): its loads and scales alone
  gemv_no_stage  gemv_no_mac without staging the activations first
The outputs are wrong in every variant but as_is; only their times count.

    python bench/ablate.py --out bench/results/h200/runN/ablate.json \\
        w4a16_sym_g128:gemm_16x64x128_w64x16_p12_s1_wg_tma_rs4:16 ...
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from concurrent.futures import ProcessPoolExecutor

from opgen.codegen import planner, render
from opgen.codegen.validate import load_spec, resolve_spec

# The compiler renders through render.render; a variant replaces it with
# this plus its edits (and compiles into a cache of its own, since the
# cache key does not see the edits).
_RENDER = render.render

_W_LOAD = "tma_load_2d(st + A_TILE, &tmB, t * BK / 8, n0, &full[s]);"
_A_LOAD = "for (int h = 0; h < BK / 64; ++h) tma_load_2d(st + h * A_BOX, &tmA, t * BK + h * 64, m0, &full[s]);"
_EXPECT = "mbar_arrive_expect_tx(&full[s], A_TILE + W_BYTES);"
_DECODE = ("const cT2 v = __hmul2(__hsub2(magic_codes(w, shift), sub), s2);\n"
           "  return *reinterpret_cast<const uint32_t*>(&v);")
_SCALE = "return __ldg(reinterpret_cast<const cT*>(S) + scale_index(n, k, N, K));"
_MMA = "wgmma_rs(acc, frag[ks], "

_NO_A = [(_A_LOAD, ""), (_EXPECT, "mbar_arrive_expect_tx(&full[s], W_BYTES);")]
_NO_W = [(_W_LOAD, ""), (_EXPECT, "mbar_arrive_expect_tx(&full[s], A_TILE);")]
_NO_LOADS = [(_A_LOAD, ""), (_W_LOAD, ""), (_EXPECT, "mbar_arrive_expect_tx(&full[s], 0);")]
_NO_DECODE = [(_DECODE, "return w ^ (uint32_t)shift ^ *reinterpret_cast<const uint32_t*>(&s2);")]
_NO_MMA = [(_MMA, "if (M < 0) " + _MMA)]
_LDS = ("      *reinterpret_cast<uint4*>(wa + i) = *reinterpret_cast<const uint4*>(wrow + 4 * i);\n"
        "      *reinterpret_cast<uint4*>(wb + i) = *reinterpret_cast<const uint4*>(wrow + 8 * W_ROWB + 4 * i);")
# A quarter of the shared-memory loads: one 16-byte piece per row and lane
# (what a layout with each lane's fragments side by side would load), the
# other words made from it (one LOP3 each, so that no two words are equal).
_LDS_QUARTER = [(_LDS, """      if (i == 0) {
        const uint4 xa = *reinterpret_cast<const uint4*>(wrow + (16 * q) % W_ROWB);
        const uint4 xb = *reinterpret_cast<const uint4*>(wrow + 8 * W_ROWB + (16 * q) % W_ROWB);
        wa[0] = xa.x; wa[1] = xa.y; wa[2] = xa.z; wa[3] = xa.w;
        wb[0] = xb.x; wb[1] = xb.y; wb[2] = xb.z; wb[3] = xb.w;
      } else {
#pragma unroll
        for (int j = 0; j < 4; ++j) { wa[i + j] = wa[j] ^ (0x01010101u * i); wb[i + j] = wb[j] ^ (0x01010101u * i); }
      }""")]
# The ring's waits as pure polls (mbarrier.test_wait) instead of try_wait,
# which may suspend the thread until the phase completes.
_SPIN = [("mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;", "mbarrier.test_wait.parity.shared::cta.b64 p, [%0], %1;")]
_NO_LDS = [(_LDS, """#pragma unroll
      for (int j = 0; j < 4; ++j) { wa[i + j] = (uint32_t)t * 0x9E3779B9u ^ (0x01010101u * (i + j)); wb[i + j] = wa[i + j] ^ (uint32_t)r; }""")]
_MAC = """        cT2 ap[MMAX][NAP];
#pragma unroll
        for (int m = 0; m < MMAX; ++m) load_pairs(act_sm + m * rowb, v0 + 32 * j, ap[m]);
#pragma unroll
        for (int c = 0; c < COLS; ++c) {
          cT2 v[NP];
          decode_pairs(w[j][c], &s[j][c], &z[j][c], v);
#pragma unroll
          for (int m = 0; m < MMAX; ++m) mac_pairs(v, ap[m], part[m][c]);
        }"""
_GEMV_NO_MAC = [(_MAC, """#pragma unroll
        for (int c = 0; c < COLS; ++c)
#pragma unroll
          for (int i = 0; i < VB / 4; ++i) acc[0][c] += __uint_as_float(w[j][c][i] & 0x3f800000u) * s[j][c];""")]
_STAGE = "  stage_activations(a, M, K, kbeg, nvec, rowb, act_sm);\n"
VARIANTS = {
    "as_is": [],
    "w_l2": [(_W_LOAD, _W_LOAD.replace("t * BK / 8", "(t & 1) * BK / 8"))],
    "no_a": _NO_A,
    "no_w": _NO_W,
    "no_loads": _NO_LOADS,
    "no_scales": [(_SCALE, "return cT(1.0f + 1e-3f * (n & 7));")],
    "no_decode": _NO_DECODE,
    "no_mma": _NO_MMA,
    "pipe_only": _NO_LOADS + _NO_DECODE + _NO_MMA,
    "lds_quarter": _LDS_QUARTER,
    "no_lds": _NO_LDS,
    "spin": _SPIN,
    "pipe_spin": _NO_LOADS + _NO_DECODE + _NO_MMA + _SPIN,
    "gemv_no_mac": _GEMV_NO_MAC,
    "gemv_no_stage": _GEMV_NO_MAC + [(_STAGE, "")],
}


def _patched_render(edits):
    def patched(spec, cfg, arch):
        src, g = _RENDER(spec, cfg, arch)
        for old, new in edits:
            if old not in src:
                raise RuntimeError(f"edit does not apply: {old[:60]!r}")
            src = src.replace(old, new)
        return src, g
    return patched


def _use_variant(variant: str, root: str) -> None:
    os.environ["OPGEN_CACHE_DIR"] = os.path.join(root, variant)
    render.render = _patched_render(VARIANTS[variant])


def _config(spec_name: str, cfg_name: str, M: int, N: int, K: int, arch: str):
    spec = load_spec(resolve_spec(spec_name))
    by_name = {c.name: c for c in planner.candidates(spec, arch, M, N, K)}
    return spec, by_name[cfg_name]


def _applies(edits, src: str) -> bool:
    """Whether every edit applies to this source (the swapped GEMM's edits
    do not to other kernels, which are timed as they are)."""
    return all(old in src for old, _ in edits)


def _source(spec_name, cfg_name, M, N, K, arch) -> str:
    return _RENDER(*_config(spec_name, cfg_name, M, N, K, arch), arch)[0]


def _compile(job):
    spec_name, cfg_name, M, N, K, variant, root, arch = job
    from opgen.codegen import compiler
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
        src = _source(*e, args.arch)
        todo += [(e, v) for v in variants if _applies(VARIANTS[v], src)]
    jobs = [(*e, v, args.cache, args.arch) for e, v in todo]
    # Compile first, in forked workers (the patch is in this module), before
    # this process touches CUDA.
    import multiprocessing
    with ProcessPoolExecutor(max_workers=os.cpu_count() or 1,
                             mp_context=multiprocessing.get_context("fork")) as ex:
        regs = dict(zip([j[:6] for j in jobs], ex.map(_compile, jobs)))
    for (s, c, m, N, K, v), r in regs.items():
        print(f"compiled {s} {c} M={m} {N}x{K} {v}: {r} registers", flush=True)
    if args.compile_only:
        return 0
    from opgen.runtime import tuner
    from opgen.runtime.device import current_arch
    assert current_arch() == args.arch, (current_arch(), args.arch)
    rows = []
    session = tuner._make_session(current_arch())
    bench = entry = None
    for (s, c, m, N, K), v in todo:
        spec, cfg = _config(s, c, m, N, K, args.arch)
        if entry != (s, c, m, N, K):      # one problem's data for all its variants
            if bench is not None:
                bench.close()
            entry, bench = (s, c, m, N, K), session.bench(spec, N, K, seed=0)
            bench.select(m)
        _use_variant(v, args.cache)
        session.forget(spec)              # (the session keeps kernels by spec and config)
        t = bench.time(cfg, budget_ms=args.budget_ms)
        n_regs = regs[(s, c, m, N, K, v)]
        rows.append(dict(spec=s, config=c, M=m, N=N, K=K, variant=v, us=round(t.median_us, 2),
                         registers=n_regs))
        print(f"{s} {c} M={m} {N}x{K} {v:11s} {t.median_us:8.2f} us  ({n_regs} registers)",
              flush=True)
    if bench is not None:
        bench.close()
    session.close()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(rows=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
