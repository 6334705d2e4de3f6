"""How many cycles one m64nNk16 f16 wgmma costs an SM, by operand source and
by how many warpgroups issue at once: the question behind the rs GEMM's
~300 cycles per k-tile that neither more k-groups nor more stages removed
(docs/performance.md#rs-gemm).

Each warpgroup of a 132-block grid loops over groups of four wgmma (one
64-deep k-tile) on fixed operands, and times the loop with clock64:
  rs_wait  A from registers, wait_group 0 after every group (the rs GEMM)
  rs_pipe  A from registers, groups committed back to back, one wait at the end
  ss_wait  A from shared memory, wait_group 0 after every group
Prints cycles per wgmma per SM (the loop's cycles over all the warpgroups'
wgmma) next to the tensor-core floor of N / 2 cycles (2048 f16 FMA per
cycle per SM), and writes the table as JSON.

    python bench/wgmma_probe.py --out $OUT/wgmma_probe.json      (bash bench/gpu_run.sh probe)
"""
from __future__ import annotations

import argparse
import json
import statistics

ITERS = 2048
MODES = ("rs_wait", "rs_pipe", "ss_wait")


def _most_wgs(n: int) -> int:
    """Warpgroups per block that still leave ptxas room for the accumulators
    (else it serializes the wgmma itself: C7511)."""
    return 4 if n <= 64 else 2


def _source(n: int, mode: str) -> str:
    nd = n // 2
    acc = ", ".join(f"%{i}" for i in range(nd))
    cons = ", ".join(f'"+f"(d[{i}])' for i in range(nd))
    if mode.startswith("rs"):
        a_ops, a_in = f"{{%{nd}, %{nd + 1}, %{nd + 2}, %{nd + 3}}}", '"r"(a0), "r"(a1), "r"(a2), "r"(a3)'
        b_idx, extra = nd + 4, ", 1, 1, 0"
    else:
        a_ops, a_in = f"%{nd}", '"l"(da)'
        b_idx, extra = nd + 1, ", 1, 1, 0, 0"
    wait = "asm volatile(\"wgmma.wait_group.sync.aligned 0;\\n\" ::: \"memory\");" if mode != "rs_pipe" else ""
    kind = "rs" if mode.startswith("rs") else "ss"
    return f"""
#include <cuda_fp16.h>
typedef unsigned long long u64;
__device__ u64 desc(const void* p) {{
  unsigned s = (unsigned)__cvta_generic_to_shared(p);
  return (u64)((s & 0x3FFFF) >> 4) | (1ull << 16) | ((u64)(1024 >> 4) << 32) | (1ull << 62);
}}
extern "C" __global__ void __launch_bounds__({128 * _most_wgs(n)}, 1) probe(long long* cycles, float* sink, int iters) {{
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((1024u - ((unsigned)__cvta_generic_to_shared(smem_raw) & 1023u)) & 1023u);
  // B: {n} x 64 halves (K-major, 128-byte rows); A (ss): 64 x 64 after it. Small finite values.
  for (int i = threadIdx.x; i < ({n} + 64) * 64; i += blockDim.x)
    reinterpret_cast<__half*>(smem)[i] = __float2half(0.001f * ((i * 7) % 13 - 6));
  asm volatile("fence.proxy.async.shared::cta;\\n" ::: "memory");
  __syncthreads();
  const u64 db = desc(smem), da = desc(smem + {n} * 128);
  const unsigned a0 = 0x3c003c00u ^ threadIdx.x, a1 = 0x3c00u, a2 = 0x1c00u, a3 = threadIdx.x;
  float d[{nd}];
  for (int i = 0; i < {nd}; ++i) d[i] = 0.f;
  asm volatile("wgmma.fence.sync.aligned;\\n" ::: "memory");
  const long long t0 = clock64();
  for (int it = 0; it < iters; ++it) {{
#pragma unroll
    for (int ks = 0; ks < 4; ++ks)
      asm volatile("{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{b_idx + 1}, 0;\\n"
                   "wgmma.mma_async.sync.aligned.m64n{n}k16.f32.f16.f16 {{{acc}}}, {a_ops}, %{b_idx}, p{extra};\\n}}\\n"
                   : {cons}
                   : {a_in}, "l"(db + 2 * ks), "r"(1));
    asm volatile("wgmma.commit_group.sync.aligned;\\n" ::: "memory");
    {wait}
  }}
  asm volatile("wgmma.wait_group.sync.aligned 0;\\n" ::: "memory");
  const long long t1 = clock64();
  float s = 0.f;
  for (int i = 0; i < {nd}; ++i) s += d[i];
  sink[blockIdx.x * blockDim.x + threadIdx.x] = s;
  if (threadIdx.x % 128 == 0) cycles[blockIdx.x * 4 + threadIdx.x / 128] = t1 - t0;
}}
""", f"probe_{kind}_n{n}"


def main() -> None:
    import cupy

    from opgen.codegen import compiler

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", help="write the table here as JSON")
    args = ap.parse_args()
    sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
    rows = []
    for n in (32, 64, 128, 256):
        for mode in MODES:
            src, name = _source(n, mode)
            cubin, log = compiler.nvrtc_compile(src, name, "sm_90a")
            mod = cupy.cuda.function.Module()
            mod.load(cubin)
            fn = mod.get_function("probe")
            smem = (n + 64) * 128 + 1024
            cupy.cuda.driver.funcSetAttribute(fn.ptr, 8, smem)    # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
            for wgs in (1, 2, 4)[:_most_wgs(n) // 2 + 1]:
                cyc = cupy.zeros(sms * 4, dtype=cupy.int64)
                sink = cupy.zeros(sms * 512, dtype=cupy.float32)
                for _ in range(2):                                # the first launch warms up
                    fn((sms, 1, 1), (128 * wgs, 1, 1), (cyc, sink, cupy.int32(ITERS)), shared_mem=smem)
                cupy.cuda.Device().synchronize()
                per_wg = [int(c) for c in cyc.get().reshape(sms, 4)[:, :wgs].ravel()]
                cycles = statistics.median(per_wg)
                per_sm = cycles / (ITERS * 4 * wgs)               # cycles per wgmma, SM-wide
                rows.append(dict(n=n, mode=mode, warpgroups=wgs, cycles_per_wgmma_sm=round(per_sm, 1),
                                 cycles_per_group_wg=round(cycles / ITERS, 1), floor=n / 2,
                                 regs=compiler.parse_ptxas(log).get("registers")))
                print(f"m64n{n}k16 {mode:8s} {wgs} warpgroups: {per_sm:7.1f} cycles / wgmma / SM "
                      f"(floor {n / 2:.0f}), one group of 4 {cycles / ITERS:7.1f} cycles per warpgroup", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(iters=ITERS, sms=sms, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
