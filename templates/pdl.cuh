// Programmatic dependent launch (sm_90+), pasted only into kernels rendered
// with pdl (codegen/render.py). A launch with the programmatic-serialization
// attribute (runtime/pdl.py) may start before the previous kernel on its
// stream has finished: the kernel issues what does not depend on that kernel
// (weights, scales, zero points) first and waits before it reads the
// activations or writes anything.

// griddepcontrol.wait: until every prerequisite grid has completed and its
// memory is visible to this grid (a no-op when the launch had no programmatic
// dependency). SASS: ACQBULK. The "memory" clobber keeps the memory accesses
// that follow it in the source after it (the activation loads: __ldg,
// cp.async, TMA); loads written before it the compiler may still move below
// it (the GEMVs' streamed weights, non-volatile asm; the scales' __ldg).
// Hence the L2 prefetches below: volatile asm, they stay before it.
DEV void pdl_wait() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }
// griddepcontrol.launch_dependents: the dependent grid may be scheduled once
// every block of this one has said so or exited (it then waits in
// pdl_wait for this grid to complete). SASS: PREEXIT.
DEV void pdl_launch_dependents() { asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory"); }

// Weight bytes one block prefetches into L2 before its wait, the first it
// reads (in k order). A bound, not a measured optimum: the blocks resident
// at once (a few per SM) then ask for some MiB, a few microseconds of DRAM
// time and well inside L2, so the lines are still there when read.
constexpr long PDL_PREFETCH = 32 << 10;
static_assert(PDL_PREFETCH < (1 << 20), "prefetch_l2's size field");

// cp.async.bulk.prefetch.L2.global [p], bytes: `bytes` (a multiple of 16,
// here at most PDL_PREFETCH: the SASS field counts 16-byte units in 16 bits)
// from p (16-byte aligned) into L2; nothing waits for it. SASS: UBLKPF.L2,
// whose operands are uniform registers: one instruction per warp and value.
DEV void prefetch_l2(const void* p, uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" :: "l"(p), "r"(bytes) : "memory");
}
// cp.async.bulk.prefetch.tensor.2d.L2.global.tile [map, {x, y}]: the box at
// (x, y) of a tensor map into L2 (the TMA GEMMs' weights). SASS: UTMAPF.L2.2D.
DEV void prefetch_l2_box(const void* map, int x, int y) {
  asm volatile("cp.async.bulk.prefetch.tensor.2d.L2.global.tile [%0, {%1, %2}];\n"
               :: "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y) : "memory");
}

// Every thread of the block calls it: the warps take turns over `runs` runs
// of `run` bytes, `stride` bytes apart from byte `first` of a tensor of
// `bytes` bytes at T (rows of a strided slice), the first `most` of them; or
// one range where that spans at most PDL_PREFETCH (a UBLKPF and its address
// arithmetic cost some 35 instructions). Each range widens to 16-byte bounds
// but never past the tensor's.
DEV void pdl_prefetch(const void* T, long bytes, long first, long stride, long run, int runs,
                      int most = 1 << 30) {
  if (runs > 1 && (runs - 1) * stride + run <= PDL_PREFETCH) run += (runs - 1) * stride, runs = 1;
  const uint64_t t = reinterpret_cast<uint64_t>(T), lo = (t + 15) & ~15ull, hi = (t + bytes) & ~15ull;
  const int warp = threadIdx.x / 32, warps = blockDim.x / 32, n = min(runs, most);
  const uint64_t len = min(run, PDL_PREFETCH) + 15, step = (uint64_t)stride * warps;
  uint64_t p = t + first + (uint64_t)stride * warp;
  for (int r = warp; r < n; r += warps, p += step) {
    const uint64_t b = max(p & ~15ull, lo), e = min((p + len) & ~15ull, hi);
    if (b < e) prefetch_l2(reinterpret_cast<const void*>(b), (uint32_t)(e - b));
  }
}

// The same for a table of one `item`-byte entry per group of G k and `per`
// columns n (scales; packed zero points: `per` codes a word), stored
// [K / G, N / per] (kn) or [N / per, K / G]: the entries of weights n in
// [n0, n1), k in [k0, k1), in at most two runs a warp (the first read: a
// GEMV block's few columns of many group rows would be a tiny run each).
DEV void pdl_prefetch_groups(const void* T, int item, int per, int G, bool kn,
                             int n0, int n1, int k0, int k1, int N, int K) {
  const long GG = K / G, NN = N / per, c0 = n0 / per, c1 = (n1 - 1) / per + 1, g0 = k0 / G, g1 = (k1 - 1) / G + 1;
  const int most = blockDim.x / 16;
  if (kn) pdl_prefetch(T, GG * NN * item, (g0 * NN + c0) * item, NN * item, (c1 - c0) * item, g1 - g0, most);
  else pdl_prefetch(T, GG * NN * item, (c0 * GG + g0) * item, GG * item, (g1 - g0) * item, c1 - c0, most);
}
